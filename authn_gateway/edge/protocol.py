"""The edge's protocol: uvicorn's httptools protocol with the bounds, lingering close,
answers at once and TLS handshakes described in :mod:`authn_gateway.edge`."""

from __future__ import annotations

import asyncio
import ssl
from asyncio import sslproto
from typing import Any, cast

import httptools
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from ..callerauth import CALLER_KEY, CERT_NAMES_KEY
from ..tls import certificate_names
from .answers import OkFramer, error_reply
from .batching import BatchedTransport, batch_for
from .cycle import ClosingTransport, Cycle
from .handshake import QUIET_REASONS, handshake_reason
from .limits import EdgeLimits

# Data is fed to the parser in slices of this size, so an unfinished head is measured
# to within one slice wherever it starts in a read (pipelining), and httptools never
# buffers more than max_header_bytes + READ_SLICE of it.
READ_SLICE = 4096


class GatewayHttpProtocol(HttpToolsProtocol):  # type: ignore[misc]
    """uvicorn's httptools protocol with the edge's bounds (see :mod:`authn_gateway.edge`),
    plus what the ASGI scope lacks: the verified client certificate's names."""

    cycle: Cycle

    def __init__(self, config: Any, *args: Any, **kwargs: Any) -> None:
        super().__init__(config, *args, **kwargs)
        self.edge: EdgeLimits = config.edge
        self._cert_names: tuple[str, ...] = ()
        self._counted = False
        self._timer: asyncio.TimerHandle | None = None
        self._head_bytes = 0
        self._head_count = 0
        self._raw_head_bytes = 0
        self._in_head = True
        # Between the first byte of a request (on_message_begin) and its headers' end.
        self._head_started = False
        self._headers_done = False
        self._too_large = False
        self._upgrade_body = False
        self._draining = False
        self.lingering = False
        self._linger_read = 0
        self._tls_wrapped = False
        # A 400/431 waiting for the pipelined requests before it to be answered.
        self._refusal: tuple[int, str] | None = None
        # A request whose task is held back until its read ends: answered at once if
        # it completes in this read and ``answer_at_once`` has its answer.
        self._held: Cycle | None = None
        self._answer_at_once = self.edge.answer_at_once
        # Since when the connection has been idle (None: a request is being read or run).
        self._idle_since: float | None = None
        self._max_head_bytes = self.edge.max_header_bytes
        self._max_headers = self.edge.max_headers
        self._ok = OkFramer()

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
        self._wrap_tls(transport, edge.tls_context())

    def _wrap_tls(self, transport: asyncio.Transport, context: ssl.SSLContext) -> None:
        # What loop.start_tls does, but before any byte is read (uvloop's start_tls
        # loses a handshake now and then when the ClientHello is already there), and
        # with the handshake's outcome in our hands. asyncio's SSLProtocol runs on uvloop.
        self._tls_wrapped = True
        handshake = self.loop.create_future()
        handshake.add_done_callback(lambda done: self._handshake_done(done, transport))
        tls = sslproto.SSLProtocol(
            self.loop,
            self,
            context,
            handshake,
            server_side=True,
            ssl_handshake_timeout=self.edge.header_timeout,  # type: ignore[arg-type]
        )
        transport.set_protocol(tls)
        tls.connection_made(transport)

    def _handshake_done(self, done: asyncio.Future[None], transport: asyncio.Transport) -> None:
        exc = None if done.cancelled() else done.exception()
        if exc is None:
            return
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
        ssl_object = transport.get_extra_info("ssl_object")
        if ssl_object is not None:
            # The certificate was verified against the client CA during the handshake.
            self._cert_names = certificate_names(ssl_object.getpeercert())
        self._arm(self.edge.header_timeout, "head")
        if self.edge.draining:
            self.shutdown()

    def _uncount(self) -> None:
        if self._counted:
            self._counted = False
            self.edge.stats.open_connections -= 1

    def connection_lost(self, exc: Exception | None) -> None:
        self._cancel_timer()
        if self.timeout_keep_alive_task is not None:
            self.timeout_keep_alive_task.cancel()
            self.timeout_keep_alive_task = None
        self._uncount()
        if self.transport is None:
            return  # refused, or lost during the TLS handshake
        super().connection_lost(exc)

    def eof_received(self) -> None:
        if self.lingering:
            # The client is done sending: nothing unread is left to cause a reset.
            self.transport.close()

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
                self.transport.close()
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

    def _idle(self) -> bool:
        return (self.cycle is None or self.cycle.response_complete) and not self._pipeline_busy()

    def _pipeline_busy(self) -> bool:
        return bool(self.pipeline) or self._head_started

    # --- reading -----------------------------------------------------------------------

    def data_received(self, data: bytes) -> None:
        self._read(data)
        held = self._held
        if held is not None:
            # Its body is still arriving (or the read ended in an error): the ASGI way.
            self._held = None
            self._start_asgi_task(held, self.app)
        cycle = self.cycle
        if cycle is not None and not cycle.response_complete:
            # An answer at once marked the connection idle; a request after it is running.
            self._idle_since = None

    def _read(self, data: bytes) -> None:
        if self.lingering:
            self._linger_read += len(data)
            if self._linger_read > self.edge.linger_bytes:
                self.transport.close()
            return
        if self._refusal is not None:
            return
        self._unset_keepalive_if_required()
        view = memoryview(data)
        for start in range(0, len(data), READ_SLICE):
            piece = data if len(data) <= READ_SLICE else bytes(view[start : start + READ_SLICE])
            if not self._feed(piece):
                return
            if self._head_started and not self._too_large:
                self._raw_head_bytes += len(piece)
                if self._raw_head_bytes > self.edge.max_header_bytes + READ_SLICE:
                    # One endless header line never reaches on_header: httptools buffers
                    # it until it is complete. Stop here, whatever the line says.
                    self._too_large = True
                    self.send_400_response("")
                    return
        # Timers only for what a read left unfinished: a request that arrives whole
        # (the usual case) costs no timer at all.
        if self._timer is None and not self.lingering and self._refusal is None:
            if not self._in_head:
                self._arm(self.edge.body_timeout, "body")
            elif self._head_started:
                # The next request on a kept-alive connection has begun.
                self._arm(self.edge.header_timeout, "head")

    def _feed(self, data: bytes) -> bool:
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserError:
            if not self._too_large:
                self.logger.debug("invalid HTTP request from %s", self.client)
            self.send_400_response("invalid HTTP request")
            return False
        except httptools.HttpParserUpgrade as exc:
            # llhttp stops at an upgrade request's body. Upgrades are never honoured:
            # read the body with a fresh parser primed with this request's framing.
            rest = data[exc.args[0] :]
            return self._resume_after_upgrade(rest)
        return True

    def _resume_after_upgrade(self, rest: bytes) -> bool:
        framing = [
            (n, v) for n, v in self.headers if n in (b"content-length", b"transfer-encoding")
        ]
        self.parser = httptools.HttpRequestParser(self)
        self.parser.set_dangerous_leniencies(lenient_data_after_close=True)
        if framing and self.cycle is not None:
            self.cycle.more_body = True
            self._upgrade_body = True
            head = b"POST / HTTP/1.1\r\n" + b"".join(n + b": " + v + b"\r\n" for n, v in framing)
            self._in_head = True
            self.parser.feed_data(head + b"\r\n")
        return self._feed(rest) if rest else True

    # --- parser callbacks --------------------------------------------------------------

    def on_message_begin(self) -> None:
        if self._upgrade_body:
            return
        super().on_message_begin()
        self._head_bytes = self._head_count = self._raw_head_bytes = 0
        self._in_head = self._head_started = True
        self._headers_done = False
        if self._cert_names:
            self.scope[CERT_NAMES_KEY] = self._cert_names  # type: ignore[literal-required]
            self.scope[CALLER_KEY] = self._cert_names[0]  # type: ignore[literal-required]

    def on_url(self, url: bytes) -> None:
        if self._upgrade_body:
            return
        self._head_bytes += len(url)
        if self._head_bytes > self._max_head_bytes:
            self._head_too_large()
        self.url += url

    def on_header(self, name: bytes, value: bytes) -> None:
        # Called for every header: counted and kept in one call (uvicorn's on_header
        # inlined), the bounds checked as they are crossed.
        if self._upgrade_body or self._headers_done:
            # Trailers: never merged into the headers the application already read.
            return
        self._head_bytes += len(name) + len(value) + 4
        self._head_count += 1
        if self._head_bytes > self._max_head_bytes or self._head_count > self._max_headers:
            self._head_too_large()
        name = name.lower()
        if name == b"expect" and value.lower() == b"100-continue":
            self.expect_100_continue = True
        self.headers.append((name, value))

    def _head_too_large(self) -> None:
        self._too_large = True
        # httptools turns this into a parser error; _feed then answers 431.
        raise HeadTooLarge

    def _should_upgrade(self) -> bool:
        return False

    def on_headers_complete(self) -> None:
        if self._upgrade_body:
            self._in_head = False
            return
        self._in_head = self._head_started = False
        self._headers_done = True
        self._cancel_timer()
        existing = self.cycle
        self._start_cycle()
        cycle = self.cycle
        if self._draining:
            cycle.keep_alive = False
            cycle.drain_close = True
            # Only the newest request closes the connection; older pipelined ones
            # were queued before it and are answered first.
            if existing is not None and existing.drain_close and not existing.response_started:
                existing.keep_alive = True
                existing.drain_close = False

    def _start_cycle(self) -> None:
        # uvicorn's on_headers_complete, with our cycle (lingering close, early answers).
        if self.lingering:
            # Pipelined after a request answered at once with "connection: close".
            return
        http_version = self.parser.get_http_version()
        self.scope["method"] = self.parser.get_method().decode("ascii")
        if http_version != "1.1":
            self.scope["http_version"] = http_version
        parsed_url = httptools.parse_url(self.url)
        raw_path = parsed_url.path
        path = raw_path.decode("ascii")
        if "%" in path:
            import urllib.parse

            path = urllib.parse.unquote(path)
        self.scope["path"] = self.root_path + path
        self.scope["raw_path"] = self.root_path.encode("ascii") + raw_path
        self.scope["query_string"] = parsed_url.query or b""
        existing_cycle = self.cycle
        self.cycle = Cycle(
            scope=self.scope,
            transport=ClosingTransport(self),  # type: ignore[arg-type]
            flow=self.flow,
            logger=self.logger,
            access_logger=self.access_logger,
            access_log=self.access_log,
            default_headers=self.server_state.default_headers,
            message_event=asyncio.Event(),
            expect_100_continue=self.expect_100_continue,
            keep_alive=http_version != "1.0" and self.parser.should_keep_alive(),
            on_response=self.on_response_complete,
        )
        if existing_cycle is None or existing_cycle.response_complete:
            if (
                self._answer_at_once is not None
                and not self._draining
                and not self.expect_100_continue
                and not self.flow.write_paused
                and not self.parser.should_upgrade()
            ):
                # Held until the read ends: on_message_complete may answer it at once.
                self._held = self.cycle
            else:
                self._start_asgi_task(self.cycle, self.app)
        else:
            # Pipelined requests wait their turn.
            self.flow.pause_reading()
            self.pipeline.appendleft((self.cycle, self.app))

    def on_body(self, body: bytes) -> None:
        if self.cycle is None or self.cycle.response_complete:
            return
        super().on_body(body)

    def on_message_complete(self) -> None:
        self._cancel_timer()
        self._in_head = True
        self._raw_head_bytes = 0
        if self._upgrade_body:
            self._upgrade_body = False
        cycle = self.cycle
        if cycle is None or cycle.response_complete:
            return
        cycle.more_body = False
        if cycle is self._held:
            self._held = None
            answer = self._answer_at_once(self.scope, bytes(cycle.body))  # type: ignore[misc]
            if answer is not None:
                self._answer(cycle, answer)
                return
            self._start_asgi_task(cycle, self.app)
        cycle.message_event.set()

    def _answer(self, cycle: Cycle, body: bytes) -> None:
        """Write a 200 JSON answer in one write, as uvicorn's send would frame it."""
        cycle.response_started = cycle.response_complete = True
        self.transport.write(
            self._ok.frame(self.server_state.default_headers, body, cycle.keep_alive)
        )
        if not cycle.keep_alive:
            self.close_lingering()
        self.on_response_complete()

    def on_response_complete(self) -> None:
        # uvicorn's, but with a keep-alive timer that is armed once and moved lazily
        # (arming and cancelling one per request cost more than a cached review's log).
        self.server_state.total_requests += 1
        if not self.transport.is_closing():
            self._idle_since = None
            self.flow.resume_reading()
            if self.pipeline:
                cycle, app = self.pipeline.pop()
                self._start_asgi_task(cycle, app)
            else:
                self._idle_since = self.loop.time()
                if self.timeout_keep_alive_task is None:
                    self.timeout_keep_alive_task = self.loop.call_later(
                        self.timeout_keep_alive, self._keep_alive_due
                    )
        if self._refusal is not None:
            self._send_refusal_when_due()
        elif self._draining and self._idle():
            self.close_lingering()

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
        self.transport.pause_reading()
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
        self.edge.stats.lingering_closes += 1
        self._cancel_timer()
        self.pipeline.clear()
        transport = self.transport
        if transport.can_write_eof():
            transport.write_eof()
        transport.resume_reading()
        self._timer = self.loop.call_later(self.edge.linger_seconds, transport.close)

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
            self.transport.close()


class HeadTooLarge(Exception):
    pass
