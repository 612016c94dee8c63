"""TCP forwarders on loopback in front of brokers: a round-robin load balancer, for tests where
connections to one URL must land on different broker nodes (a cluster behind a load balancer), and
a proxy that cuts one connection mid-read, for tests of a read that loses its connection."""

from __future__ import annotations

import socket
import threading


class Forwarder:
    """Each accepted connection is piped both ways to the port :meth:`upstream` names, until either
    side closes or :meth:`keeps` says to cut it."""

    def __init__(self) -> None:
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self.sockets: list[socket.socket] = []
        threading.Thread(target=self._accept, daemon=True, name="test-forwarder").start()

    def upstream(self) -> int:
        """The broker port the next accepted connection goes to."""
        raise NotImplementedError

    def keeps(self, moved: int, from_broker: bool) -> bool:
        """Whether a connection goes on after ``moved`` bytes in one direction."""
        return True

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            server = socket.create_connection(("127.0.0.1", self.upstream()))
            self.sockets += [client, server]
            for src, dst, from_broker in ((client, server, False), (server, client, True)):
                threading.Thread(target=self._pump, args=(src, dst, from_broker), daemon=True).start()

    def _pump(self, src: socket.socket, dst: socket.socket, from_broker: bool) -> None:
        moved = 0
        try:
            while data := src.recv(65536):
                dst.sendall(data)
                moved += len(data)
                if not self.keeps(moved, from_broker):
                    break
        except OSError:
            pass
        for s in (src, dst):
            try:
                s.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            s.close()

    def close(self) -> None:
        self.listener.close()
        for s in self.sockets:
            s.close()


class RoundRobin(Forwarder):
    """A load balancer: each accepted connection goes to the next node in turn."""

    def __init__(self, ports: list[int]) -> None:
        self.ports, self.turn = ports, 0
        super().__init__()

    def upstream(self) -> int:
        port = self.ports[self.turn % len(self.ports)]
        self.turn += 1
        return port


class DroppingProxy(Forwarder):
    """In front of one broker: cuts the first connection which carries more than ``limit`` bytes
    from the broker (a range reader's), once."""

    def __init__(self, port: int, limit: int) -> None:
        self.target, self.limit, self.dropped = port, limit, 0
        super().__init__()

    def upstream(self) -> int:
        return self.target

    def keeps(self, moved: int, from_broker: bool) -> bool:
        if from_broker and moved > self.limit and not self.dropped:
            self.dropped += 1
            return False
        return True
