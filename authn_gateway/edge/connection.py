"""One connection's life at the edge, below its HTTP parsing: counted against
``max_connections``, its TLS handshake, its timers (head, body, drain, keep-alive, send),
the refusals the protocol writes itself, and how it ends (lingering close, half-close,
drain, send timeout). :class:`~.protocol.GatewayHttpProtocol` adds reading and parsing."""

from __future__ import annotations

import asyncio
from typing import Any, cast

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from authn_gateway.edge.answers import error_reply
from authn_gateway.edge.batching import BatchedTransport, batch_for
from authn_gateway.edge.cycle import Cycle
from authn_gateway.edge.handshake import QUIET_REASONS, handshake_reason, wrap_tls
from authn_gateway.edge.intake import WRITE_HIGH_WATER, BufferedReader, EdgeFlow
from authn_gateway.edge.limits import EdgeLimits
from authn_gateway.edge.tls import certificate_names

# A TLS connection's received-but-unread bytes are bounded too (asyncio's SSL protocol
# holds 256 KiB): above one TLS record (16 KiB and its overhead), or it could stall
# mid-record. Unsent answers have the plain connection's mark (it would hold 512 KiB).
TLS_READ_HIGH_WATER = 32 * 1024


class EdgeConnection(HttpToolsProtocol, asyncio.BufferedProtocol):  # type: ignore[misc]
    """uvicorn's httptools protocol with the edge's connection-level bounds."""

    cycle: Cycle

    def __init__(self, config: Any, *args: Any, **kwargs: Any) -> None:
        super().__init__(config, *args, **kwargs)
        self.edge: EdgeLimits = config.edge
        self._cert_names: tuple[str, ...] = ()
        self._counted = False
        self._tls_wrapped = False
        # The head, body, drain or linger timer (one at a time).
        self._timer: asyncio.TimerHandle | None = None
        # Armed while answers wait to be sent (see pause_writing and _close).
        self._send_timer: asyncio.TimerHandle | None = None
        # Between the first byte of a request (on_message_begin) and its headers' end.
        self._head_started = False
        self._too_large = False
        self._draining = False
        self.lingering = False
        self._linger_read = 0
        # A 400/431 waiting for the pipelined requests before it to be answered.
        self._refusal: tuple[int, str] | None = None
        # Since when the connection has been idle (None: a request is being read or run).
        self._idle_since: float | None = None
        # Read and not yet fed to the parser (at most one read: see intake.py), from
        # _stash_pos on; the transport does not read while the intake holds back.
        self._stash: bytes | None = None
        self._stash_pos = 0
        self._holding_back = False
        # The client half-closed: answer what it sent, then close.
        self._peer_done = False

    # --- connection life ---------------------------------------------------------------

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        if self._tls_wrapped:
            # Called again by the TLS layer, with the TLS transport, once the handshake
            # is complete.
            self._http_connection_made(transport)
            return
        edge = self.edge
        if edge.stats.open_connections >= edge.max_connections:
            # Established connections keep working; this one costs nothing more.
            edge.stats.refused_connections += 1
            transport.abort()
            return
        self._counted = True
        edge.stats.open_connections += 1
        if edge.tls_context is None:
            self._http_connection_made(transport)
            return
        self._tls_wrapped = True
        wrap_tls(
            self.loop,
            self,
            transport,
            edge.tls_context(),
            edge.header_timeout,
            lambda exc: self._handshake_failed(exc, transport),
        )

    def _handshake_failed(self, exc: BaseException, transport: asyncio.Transport) -> None:
        edge = self.edge
        label, detail = handshake_reason(exc)
        edge.stats.handshake_failures[label] += 1
        self._uncount()
        if label in QUIET_REASONS:
            return
        peer = transport.get_extra_info("peername")
        edge.handshake_log.warning(
            label,
            "TLS handshake failed (%s) from %s: %s",
            label,
            peer[0] if peer else "unknown",
            detail,
        )

    def _http_connection_made(self, transport: asyncio.Transport) -> None:
        # Every write of this connection waits for the end of the loop's turn (batching.py).
        batched = BatchedTransport(transport, batch_for(self.loop))
        super().connection_made(cast(asyncio.Transport, batched))
        # Reading is the intake's to decide (intake.py).
        self.flow = EdgeFlow(cast(asyncio.Transport, batched), self._resume_intake)
        ssl_object = transport.get_extra_info("ssl_object")
        # Answers unsent past this stop the reading (intake.py) and arm the send timeout.
        transport.set_write_buffer_limits(high=WRITE_HIGH_WATER)
        if ssl_object is None:
            # Reads of at most READ_SIZE, into the loop's buffer (intake.py).
            transport.set_protocol(BufferedReader(self))
        else:
            # The certificate was verified against the client CA during the handshake.
            self._cert_names = certificate_names(ssl_object.getpeercert())
            transport.set_read_buffer_limits(high=TLS_READ_HIGH_WATER)  # type: ignore[attr-defined]
        self._arm(self.edge.header_timeout, "head")
        if self.edge.draining:
            self.shutdown()

    def _uncount(self) -> None:
        if self._counted:
            self._counted = False
            self.edge.stats.open_connections -= 1

    def connection_lost(self, exc: Exception | None) -> None:
        self._cancel_timer()
        if self._send_timer is not None:
            self._send_timer.cancel()
            self._send_timer = None
        self._stash = None
        if self.timeout_keep_alive_task is not None:
            self.timeout_keep_alive_task.cancel()
            self.timeout_keep_alive_task = None
        self._uncount()
        if self.transport is None:
            return  # refused, or lost during the TLS handshake
        super().connection_lost(exc)

    def eof_received(self) -> bool | None:  # type: ignore[override]
        if self.lingering:
            # The client is done sending: nothing unread is left to cause a reset.
            self._close()
            return None
        if self._tls_wrapped or self._stash is not None:
            # asyncio's TLS layer closes on the client's EOF whatever we return (and
            # only a TLS read can end in EOF with data held back): it ends here.
            return None
        # A client may half-close after its last request: it still gets its answers.
        self._peer_done = True
        self._answer_then_close()
        return True

    def _answer_then_close(self) -> None:
        """The client sends nothing more: answer the requests it completed, then close."""
        self._cancel_timer()
        cycle = self.cycle
        if cycle is not None and not cycle.response_complete and cycle.more_body:
            # Its body can never be complete.
            cycle.disconnected = True
            cycle.message_event.set()
            queued = [entry for entry in self.pipeline if entry[0] is cycle]
            if not queued:
                self._close()  # it was running: nothing older waits for an answer
                return
            self.pipeline.remove(queued[0])
            return  # closed once the running request is answered (on_response_complete)
        if cycle is None or cycle.response_complete:
            self._close()
        elif not cycle.response_started:
            # The last request answered says so and closes the connection.
            cycle.keep_alive = False

    # --- timers ------------------------------------------------------------------------

    def _arm(self, seconds: float, phase: str) -> None:
        self._cancel_timer()
        self._timer = self.loop.call_later(seconds, self._expired, phase)

    def _cancel_timer(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def _expired(self, phase: str) -> None:
        self._timer = None
        if self.transport.is_closing() or self.lingering:
            return
        if phase == "drain":
            if self._idle():
                self._close()
            elif self._head_started:
                self._arm(self.edge.header_timeout, "head")
            return
        self.edge.stats.timeouts[phase] += 1
        cycle = self.cycle
        started = (phase == "head" and self._head_started) or phase == "body"
        if phase == "body" and cycle is not None:
            if cycle.response_started:
                return  # answered already; the rest of the body is discarded as it comes
            cycle.disconnected = True
            cycle.message_event.set()
        if started:
            self._write_error(408, f"request {phase} not received within the time limit")
        self.close_lingering()

    def _close(self) -> None:
        """Close after what was written; a client that does not read it within the send
        timeout is cut off (a close waits for its answers to be sent, however long)."""
        transport = self.transport
        transport.close()
        if transport.get_write_buffer_size() and self._send_timer is None:
            self._send_timer = self.loop.call_later(self.edge.send_timeout, self._send_expired)

    def pause_writing(self) -> None:
        # Answers wait to be sent: nothing more is read (the bound), and the client has
        # the send timeout to read them.
        self.flow.pause_writing()
        if self._send_timer is None:
            self._send_timer = self.loop.call_later(self.edge.send_timeout, self._send_expired)

    def resume_writing(self) -> None:
        self.flow.resume_writing()
        if self._send_timer is not None and not self.transport.is_closing():
            self._send_timer.cancel()
            self._send_timer = None
        self._resume_intake()

    def _send_expired(self) -> None:
        self._send_timer = None
        self.edge.stats.timeouts["send"] += 1
        self.transport.abort()

    def _idle(self) -> bool:
        return (self.cycle is None or self.cycle.response_complete) and not self._pipeline_busy()

    def _pipeline_busy(self) -> bool:
        return bool(self.pipeline) or self._head_started

    def _resume_intake(self) -> None:
        """Feed what the read bound held back, if there is room now (the protocol's)."""
        raise NotImplementedError

    def _hold_back(self, hold: bool) -> None:
        if self._peer_done or self.transport.is_closing():
            return  # nothing more to read
        if hold != self._holding_back:
            self._holding_back = hold
            if hold:
                self.transport.pause_reading()
            else:
                self.transport.resume_reading()

    # --- answers the protocol writes itself -----------------------------------------

    def _write_error(self, status: int, message: str) -> None:
        self.transport.write(error_reply(status, message))

    def send_400_response(self, msg: str) -> None:
        if self.transport.is_closing() or self.lingering or self._refusal is not None:
            return
        if self._too_large:
            edge = self.edge
            self._refusal = (
                431,
                f"request head larger than {edge.max_header_bytes} bytes "
                f"or {edge.max_headers} headers",
            )
        else:
            self._refusal = (400, msg or "invalid HTTP request")
        if self.cycle is not None and not self.cycle.response_complete and self.cycle.more_body:
            # The request being read is the one refused: it will not be answered.
            self.cycle.disconnected = True
            self.cycle.message_event.set()
            for entry in list(self.pipeline):
                if entry[0] is self.cycle:
                    self.pipeline.remove(entry)
        self._stash = None
        self._hold_back(True)
        self._send_refusal_when_due()

    def _send_refusal_when_due(self) -> None:
        # Pipelined requests before the refused one are answered first, in order.
        if self._refusal is None or self.pipeline:
            return
        cycle = self.cycle
        if cycle is not None and not cycle.response_complete and not cycle.disconnected:
            return
        self._write_error(*self._refusal)
        self.close_lingering()

    # --- closing -----------------------------------------------------------------------

    def close_lingering(self) -> None:
        """Close after what was written, without a reset: half-close (plain TCP), then
        read and discard until the client closes, for at most linger_seconds/bytes."""
        if self.lingering or self.transport.is_closing():
            return
        self.lingering = True
        self._cancel_timer()
        self.pipeline.clear()
        self._stash = None
        if self._peer_done:
            self._close()  # the client sends nothing more: nothing to linger for
            return
        self.edge.stats.lingering_closes += 1
        transport = self.transport
        if transport.can_write_eof():
            transport.write_eof()
        self._holding_back = False
        transport.resume_reading()
        self._timer = self.loop.call_later(self.edge.linger_seconds, self._close)

    def shutdown(self) -> None:
        """Drain: the current or next request on this connection is its last."""
        self._draining = self.edge.draining = True
        if self.lingering or self.transport.is_closing():
            return
        if self.cycle is not None and not self.cycle.response_complete:
            if not self.cycle.response_started:
                self.cycle.keep_alive = False
                self.cycle.drain_close = True
            return
        if self._pipeline_busy():
            return  # its head is arriving; on_headers_complete marks it the last
        self._arm(self.edge.drain_idle_seconds, "drain")

    def _unset_keepalive_if_required(self) -> None:
        # Data arrived: the connection is not idle (the timer, if armed, finds that out).
        self._idle_since = None

    def _keep_alive_due(self) -> None:
        self.timeout_keep_alive_task = None
        since = self._idle_since
        if since is None:
            return  # busy since: the next answer arms it again
        remaining = since + self.timeout_keep_alive - self.loop.time()
        if remaining > 0:
            self.timeout_keep_alive_task = self.loop.call_later(remaining, self._keep_alive_due)
            return
        self.timeout_keep_alive_handler()

    def timeout_keep_alive_handler(self) -> None:
        if not self.transport.is_closing() and not self.lingering:
            self._close()
