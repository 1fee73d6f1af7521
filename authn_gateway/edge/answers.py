"""The answers the protocol writes itself, framed as uvicorn's send would frame them:
a cache hit's 200 (answered at once, without ASGI) and the edge's own refusals."""

from __future__ import annotations

from authn_gateway.kube_status import render_error

_PHRASES = {
    400: b"Bad Request",
    408: b"Request Timeout",
    431: b"Request Header Fields Too Large",
}


class OkFramer:
    """A 200 JSON answer in one piece, the server's default headers (date) rendered
    once per change rather than once per answer."""

    def __init__(self) -> None:
        self._defaults: tuple[list[tuple[bytes, bytes]], bytes] = ([], b"")

    def frame(self, defaults: list[tuple[bytes, bytes]], body: bytes, keep_alive: bool) -> bytes:
        if self._defaults[0] is not defaults:
            self._defaults = (defaults, b"".join(n + b": " + v + b"\r\n" for n, v in defaults))
        return (
            b"HTTP/1.1 200 OK\r\n%scontent-type: application/json\r\ncontent-length: %d\r\n%s\r\n"
            % (self._defaults[1], len(body), b"" if keep_alive else b"connection: close\r\n")
            + body
        )


def error_reply(status: int, message: str) -> bytes:
    """A 400, 408 or 431 in the review API's error shape, closing the connection."""
    body = render_error(status, message)
    return (
        b"HTTP/1.1 %d %s\r\ncontent-type: application/json\r\ncontent-length: %d\r\n"
        b"connection: close\r\n\r\n" % (status, _PHRASES[status], len(body)) + body
    )
