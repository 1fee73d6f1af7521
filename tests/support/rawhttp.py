"""Raw HTTP/1.1 over a socket: requests as bytes, and a reader of the responses, for
tests that need what an HTTP client hides (pipelining, half-close, framing)."""

from __future__ import annotations

import json
import socket

from tests.support.procs import review_body

REVIEW = json.dumps(review_body("demo-admin-token")).encode()


def request(body: bytes = REVIEW, extra: str = "", path: str = "/authenticate") -> bytes:
    head = (
        f"POST {path} HTTP/1.1\r\nhost: gw\r\ncontent-type: application/json\r\n"
        f"content-length: {len(body)}\r\n{extra}\r\n"
    )
    return head.encode() + body


class Reader:
    """Reads HTTP/1.1 responses (content-length framed) off a socket."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.buf = b""

    def _fill(self) -> bool:
        chunk = self.sock.recv(65536)
        self.buf += chunk
        return bool(chunk)

    def response(self) -> tuple[int, dict[str, str], bytes] | None:
        """The next response, or None at a clean end of stream."""
        while b"\r\n\r\n" not in self.buf:
            if not self._fill():
                assert not self.buf, f"stream ended inside a response head: {self.buf!r}"
                return None
        head, self.buf = self.buf.split(b"\r\n\r\n", 1)
        lines = head.decode().split("\r\n")
        status = int(lines[0].split()[1])
        headers = {k.lower(): v.strip() for k, v in (line.split(":", 1) for line in lines[1:])}
        length = int(headers.get("content-length", "0"))
        while len(self.buf) < length:
            assert self._fill(), "stream ended inside a response body"
        body, self.buf = self.buf[:length], self.buf[length:]
        return status, headers, body

    def at_eof(self, timeout: float = 10.0) -> bool:
        """True when the peer closed cleanly (FIN, nothing more); a reset raises."""
        self.sock.settimeout(timeout)
        return not self._fill() and not self.buf
