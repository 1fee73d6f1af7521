"""What one request's ASGI cycle sees of its connection: a transport whose ``close()``
is the protocol's lingering close, an answer's head sent with its body, and an
exception of the application answered without a 500 or a traceback."""

from __future__ import annotations

import asyncio
from typing import Any, Protocol

from uvicorn.protocols.http.httptools_impl import RequestResponseCycle

from authn_gateway.edge.limits import EdgeLimits
from authn_gateway.kube_status import render_error


class LingeringConnection(Protocol):
    """What a request's transport needs of its connection (the edge's protocol, see
    connection.py): declared here, so that this module, which the protocol imports,
    does not import it back."""

    @property
    def transport(self) -> asyncio.Transport: ...

    @property
    def lingering(self) -> bool: ...

    @property
    def edge(self) -> EdgeLimits: ...

    def close_lingering(self) -> None: ...


class ClosingTransport:
    """What a request cycle sees as its transport: ``close()`` is a lingering close."""

    def __init__(self, protocol: LingeringConnection) -> None:
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

    def report_error(self, exc: BaseException) -> None:
        self._protocol.edge.report_error(exc)


# What an exception of ours escaping the application is answered with, when it had not
# begun an answer: the review path answers its own errors (README, "How a review is
# answered"), so this is the ops routes' (health, metrics, admin), and never a 500.
_INTERNAL_ERROR = render_error(503, "internal error (logged by the gateway)")
_INTERNAL_ERROR_HEADERS = [
    (b"content-type", b"application/json"),
    (b"content-length", b"%d" % len(_INTERNAL_ERROR)),
    (b"connection", b"close"),
]


class Cycle(RequestResponseCycle):  # type: ignore[misc]
    # Set when a drain made this request the connection's last.
    drain_close = False

    async def run_asgi(self, app: Any) -> None:
        # uvicorn's, with its 500 and traceback replaced: an exception (or no answer) is a
        # bug of ours, logged once per kind and counted, and the connection is answered
        # (503) or closed, so it is never left without an answer or a timer.
        try:
            result = await app(self.scope, self.receive, self.send)
        except asyncio.CancelledError:
            # Shutdown past graceful_shutdown_seconds: nothing to report.
            self.transport.close()
            raise
        except Exception as exc:
            self._report(exc)
            await self._answer_internal_error()
        else:
            if result is not None or (not self.response_complete and not self.disconnected):
                self._report(RuntimeError("the ASGI application returned without a whole answer"))
                await self._answer_internal_error()
        finally:
            self.on_response = lambda: None

    def _report(self, exc: BaseException) -> None:
        self.transport.report_error(exc)  # type: ignore[attr-defined]  # ClosingTransport

    async def _answer_internal_error(self) -> None:
        if self.response_started or self.disconnected:
            if not self.response_complete:
                self.transport.close()
            return
        await self.send(
            {"type": "http.response.start", "status": 503, "headers": _INTERNAL_ERROR_HEADERS}
        )
        await self.send({"type": "http.response.body", "body": _INTERNAL_ERROR})

    async def send(self, message: Any) -> None:
        starting = message["type"] == "http.response.start" and not self.response_started
        if starting and self.more_body:
            # An answer before the whole body arrived (413, 401, ...): this connection
            # cannot carry another request, so say so and close it lingering.
            self.keep_alive = False
        if starting:
            self.transport.hold_next_write()  # type: ignore[attr-defined]  # ClosingTransport
        await super().send(message)
