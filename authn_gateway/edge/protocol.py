"""The edge's protocol: uvicorn's httptools protocol with the bounds, lingering close,
answers at once and TLS handshakes described in :mod:`authn_gateway.edge`."""

from __future__ import annotations

import asyncio
from typing import Any

import httptools

from authn_gateway.edge.answers import OkFramer
from authn_gateway.edge.callerauth import CALLER_KEY, CERT_NAMES_KEY
from authn_gateway.edge.connection import EdgeConnection
from authn_gateway.edge.cycle import ClosingTransport, Cycle
from authn_gateway.edge.intake import (
    BODY_HIGH_WATER,
    HEAD_END,
    MAX_PIPELINED,
    READ_SLICE,
    WRITE_HIGH_WATER,
    piece_end,
    read_buffer_for,
)


class GatewayHttpProtocol(EdgeConnection):
    """uvicorn's httptools protocol with the edge's bounds (see :mod:`authn_gateway.edge`),
    plus what the ASGI scope lacks: the verified client certificate's names."""

    cycle: Cycle

    def __init__(self, config: Any, *args: Any, **kwargs: Any) -> None:
        super().__init__(config, *args, **kwargs)
        self._head_bytes = 0
        self._head_count = 0
        self._raw_head_bytes = 0
        self._in_head = True
        self._headers_done = False
        self._upgrade_body = False
        # A request whose task is held back until its read ends: answered at once if
        # it completes in this read and ``answer_at_once`` has its answer.
        self._held: Cycle | None = None
        self._answer_at_once = self.edge.answer_at_once
        self._max_head_bytes = self.edge.max_header_bytes
        self._max_headers = self.edge.max_headers
        self._ok = OkFramer()
        self._feeding = False
        self._read_buffer = read_buffer_for(self.loop)

    # --- reading -----------------------------------------------------------------------

    def get_buffer(self, sizehint: int) -> memoryview:
        return self._read_buffer

    def buffer_updated(self, nbytes: int) -> None:
        self.data_received(self._read_buffer[:nbytes].tobytes())

    def data_received(self, data: bytes) -> None:
        # Data arrived: the connection is not idle (the keep-alive timer finds that out).
        self._idle_since = None
        if self.lingering:
            self._linger_read += len(data)
            if self._linger_read > self.edge.linger_bytes:
                self._close()
            return
        if self._refusal is not None:
            return
        if self._stash is not None:
            # Read before the transport's pause took effect (TLS): kept after the rest.
            data, self._stash = self._stash[self._stash_pos :] + data, None
        try:
            self._take(data, 0, fresh=True)
        except Exception as exc:
            # A bug of ours: logged and counted once per kind; this connection is over.
            self.edge.report_error(exc)
            self.transport.abort()

    def _take(self, data: bytes, pos: int, fresh: bool) -> None:
        """Feed ``data[pos:]`` to the parser within the bound (intake.py); keep what the
        bound holds back and stop reading until answers make room for it."""
        self._feeding = True
        try:
            pos = self._feed_within_bound(data, pos, fresh)
        finally:
            self._feeding = False
        held = self._held
        if held is not None:
            # Its body is still arriving (or the read ended in an error): the ASGI way.
            self._held = None
            self._start_asgi_task(held, self.app)
        cycle = self.cycle
        if cycle is not None and not cycle.response_complete:
            # An answer at once marked the connection idle; a request after it is running.
            self._idle_since = None
        if self.lingering or self._refusal is not None or self.transport.is_closing():
            return
        if pos < len(data):
            self._stash, self._stash_pos = data, pos
        if pos < len(data) or self._budget() <= 0:
            # What waits is ours to answer: no head or body timer meanwhile.
            self._cancel_timer()
            self._hold_back(True)
            return
        self._hold_back(False)
        self._arm_for_unfinished()

    def _feed_within_bound(self, data: bytes, pos: int, fresh: bool) -> int:
        """Feed pieces of ``data`` from ``pos`` while the bound allows; where it stopped."""
        size = len(data)
        first = True
        while pos < size:
            budget = self._budget()
            if budget <= 0:
                return pos
            if not first and self.transport.get_write_buffer_size() >= WRITE_HIGH_WATER:
                # This read's answers so far wait in the batch (batching.py): go on once
                # it is flushed (its callback is queued first), unless they then wait in
                # the transport (pause_writing). The first piece of a read finds the
                # last turn's answers flushed, and flow.write_paused set if they wait.
                self.loop.call_soon(self._resume_intake)
                return pos
            first = False
            if pos == 0 and size <= READ_SLICE and data.count(HEAD_END) < budget:
                # The usual read, one request: whole (what piece_end would say, with a
                # head end begun in the read before counted, whether or not it was).
                end = size
            else:
                end = piece_end(data, pos, budget, fresh)
            piece = data if pos == 0 and end == size else data[pos:end]
            pos = end
            if not self._feed(piece):
                return size
            if self._head_started and not self._too_large:
                self._raw_head_bytes += len(piece)
                if self._raw_head_bytes > self.edge.max_header_bytes + READ_SLICE:
                    # One endless header line never reaches on_header: httptools buffers
                    # it until it is complete. Stop here, whatever the line says.
                    self._too_large = True
                    self.send_400_response("")
                    return size
            if self.lingering or self._refusal is not None:
                return size
        return pos

    def _budget(self) -> int:
        """How many more request heads the parser may complete now (see intake.py)."""
        if self.flow.write_paused:
            return 0  # answers wait to be sent: nothing more is read until they are
        cycle = self.cycle
        if cycle is None or cycle.response_complete:
            return MAX_PIPELINED
        if len(cycle.body) >= BODY_HIGH_WATER:
            return 0  # until its application takes what it has
        # The running request, and those queued behind it (the newest among them).
        return MAX_PIPELINED - 1 - len(self.pipeline)

    def _resume_intake(self) -> None:
        """Something the bound waited for happened (an answer, a drain, a body taken)."""
        if not self._holding_back or self._feeding or self._refusal is not None:
            return
        if self.lingering or self.transport.is_closing() or self._budget() <= 0:
            return
        stash, self._stash = self._stash, None
        try:
            self._take(stash or b"", self._stash_pos if stash else 0, fresh=False)
        except Exception as exc:
            self.edge.report_error(exc)
            self.transport.abort()

    def _arm_for_unfinished(self) -> None:
        # Timers only for what a read left unfinished: a request that arrives whole
        # (the usual case) costs no timer at all.
        if self._timer is None:
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
            # Pipelined requests wait their turn (and the intake reads no further).
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
            try:
                answer = self._answer_at_once(self.scope, bytes(cycle.body))  # type: ignore[arg-type,misc]
            except Exception as exc:
                # A bug of ours: logged and counted; the ASGI path answers (and catches).
                self.edge.report_error(exc)
                answer = None
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
            if self.pipeline:
                cycle, app = self.pipeline.pop()
                self._start_asgi_task(cycle, app)
            elif self._peer_done:
                self._close()  # it half-closed: every request it sent is answered
                return
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
        else:
            # Room for the next request: feed what the bound held back.
            self._resume_intake()


class HeadTooLarge(Exception):
    pass
