"""A round-robin TCP load balancer on loopback, for tests where connections to one URL must land on
different broker nodes (a cluster behind a load balancer)."""

from __future__ import annotations

import socket
import threading


class RoundRobin:
    """A TCP load balancer on loopback: each accepted connection goes to the next node in turn."""

    def __init__(self, ports: list[int]) -> None:
        self.ports, self.turn = ports, 0
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self.socks: list[socket.socket] = []
        threading.Thread(target=self._accept, daemon=True, name="test-lb").start()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            port = self.ports[self.turn % len(self.ports)]
            self.turn += 1
            server = socket.create_connection(("127.0.0.1", port))
            self.socks += [client, server]
            for a, b in ((client, server), (server, client)):
                threading.Thread(target=self._pump, args=(a, b), daemon=True).start()

    @staticmethod
    def _pump(src: socket.socket, dst: socket.socket) -> None:
        try:
            while data := src.recv(65536):
                dst.sendall(data)
        except OSError:
            pass
        for s in (src, dst):
            try:
                s.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass

    def close(self) -> None:
        self.listener.close()
        for s in self.socks:
            s.close()
