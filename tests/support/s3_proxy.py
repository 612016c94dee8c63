"""An HTTP proxy on loopback in front of the S3 server that notes each request's method, path and
``If-None-Match`` header (one JSON line per request), to see what a client sends on the wire.

``python -m tests.support.s3_proxy UPSTREAM LOG [--lose-first-conditional-answer]`` prints its
endpoint on the first line of stdout and serves until killed. With the flag, the first conditional PUT
(``If-None-Match``) is forwarded and the store's answer dropped (the connection closed instead): what a
client sees when the network loses the answer to a PUT that landed, so it retries the PUT. A process
of its own: delta-rs holds the GIL while it waits for the store, so a proxy thread in the caller's
process would never get to answer.
"""

from __future__ import annotations

import http.client
import json
import sys
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


def serve(upstream: str, log_path: str, lose_first_conditional_answer: bool = False) -> None:
    host, port = upstream.split("://", 1)[1].rstrip("/").split(":")
    lose = {"next": lose_first_conditional_answer}
    log = open(log_path, "a", buffering=1)  # noqa: SIM115 - open while serving

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def forward(self) -> None:
            data = self.body()
            log.write(json.dumps({"method": self.command, "path": self.path,
                                  "if_none_match": self.headers.get("If-None-Match")}) + "\n")
            conn = http.client.HTTPConnection(host, int(port), timeout=120)
            conn.request(self.command, self.path, body=data, headers=dict(self.headers.items()))
            answer = conn.getresponse()
            body = answer.read()
            if self.command == "PUT" and self.headers.get("If-None-Match") and lose["next"]:
                lose["next"] = False  # the PUT landed; its answer is lost on the way back
                log.write(json.dumps({"lost_answer": answer.status, "path": self.path}) + "\n")
                conn.close()
                self.close_connection = True
                return
            self.send_response_only(answer.status)
            for k, v in answer.getheaders():
                if k.lower() not in ("transfer-encoding", "connection", "content-length"):
                    self.send_header(k, v)
            size = answer.getheader("Content-Length") if self.command == "HEAD" else str(len(body))
            self.send_header("Content-Length", size or "0")
            self.end_headers()
            if self.command != "HEAD":
                self.wfile.write(body)
            conn.close()

        def body(self) -> bytes | None:
            """The request's body as sent: a chunked one (the AWS SDK's uploads) kept chunked,
            trailers and all, so the store gets exactly the bytes the client signed."""
            if "chunked" not in (self.headers.get("Transfer-Encoding") or "").lower():
                length = int(self.headers.get("Content-Length") or 0)
                return self.rfile.read(length) if length else None
            raw = bytearray()
            while True:
                size_line = self.rfile.readline()
                raw += size_line
                size = int(size_line.split(b";")[0].strip() or b"0", 16)
                if size == 0:
                    break
                raw += self.rfile.read(size + 2)
            while True:  # trailers, then the blank line
                line = self.rfile.readline()
                raw += line
                if line in (b"\r\n", b"\n", b""):
                    return bytes(raw)

        do_GET = do_PUT = do_POST = do_HEAD = do_DELETE = forward

        def log_message(self, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    print(f"http://127.0.0.1:{server.server_address[1]}", flush=True)
    server.serve_forever()


if __name__ == "__main__":
    serve(sys.argv[1], sys.argv[2], "--lose-first-conditional-answer" in sys.argv[3:])
