"""What one request's ASGI cycle sees of its connection: a transport whose ``close()``
is the protocol's lingering close, and an answer's head sent with its body."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from uvicorn.protocols.http.httptools_impl import RequestResponseCycle

if TYPE_CHECKING:
    from .protocol import GatewayHttpProtocol


class ClosingTransport:
    """What a request cycle sees as its transport: ``close()`` is a lingering close."""

    def __init__(self, protocol: GatewayHttpProtocol) -> None:
        self._protocol = protocol
        self._transport = protocol.transport
        self._holding = False
        self._head = b""

    def hold_next_write(self) -> None:
        """Keep the next write (an answer's head) to go out with the one after it (its
        body): one send() instead of two, and one TCP segment for a small answer."""
        self._holding = True

    def write(self, data: bytes) -> None:
        if self._holding:
            self._holding = False
            self._head = data
            return
        if self._head:
            data, self._head = self._head + data, b""
        self._transport.write(data)

    def _flush(self) -> None:
        self._holding = False
        if self._head:
            head, self._head = self._head, b""
            self._transport.write(head)

    def is_closing(self) -> bool:
        return bool(self._transport.is_closing()) or self._protocol.lingering

    def close(self) -> None:
        self._flush()
        self._protocol.close_lingering()

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return self._transport.get_extra_info(name, default)


class Cycle(RequestResponseCycle):  # type: ignore[misc]
    # Set when a drain made this request the connection's last.
    drain_close = False

    async def send(self, message: Any) -> None:
        starting = message["type"] == "http.response.start" and not self.response_started
        if starting and self.more_body:
            # An answer before the whole body arrived (413, 401, ...): this connection
            # cannot carry another request, so say so and close it lingering.
            self.keep_alive = False
        if starting:
            self.transport.hold_next_write()  # type: ignore[attr-defined]  # ClosingTransport
        await super().send(message)
