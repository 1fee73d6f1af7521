"""A fault-injecting fake identity provider, for tests and load rehearsals.

It speaks the ``userinfo`` backend's protocol: ``GET /userinfo`` with
``Authorization: Bearer <token>``. Tokens ``good-<name>`` are valid for user
``<name>``, and so are ``good-<name>~<anything>`` (many tokens of one user); tokens
``nameless-<id>`` are valid but their answer names no user (only ``sub``, like many
IdPs' client-credentials tokens); tokens ``signed-<id>`` are valid but answered with a
signed JWT (``application/jwt``, what OIDC sends a client registered for signed
userinfo); every other token gets 401.

Faults are set at run time, in process (:meth:`FakeIdP.configure`) or over the
control port (``POST /_fake/faults`` with a JSON body of the same fields):

* ``latency``       - seconds added before every answer;
* ``fail_fraction`` - share of calls answered with ``fail_status`` (default 500);
* ``status``        - answer every call with this status (401 for everyone, 500, 429);
* ``retry_after``   - seconds, sent as ``Retry-After`` on 429s and 503s (a string is sent as
  it is, to play an IdP or proxy that sends nonsense there);
* ``hang``          - read the request, never answer;
* ``reset``         - read the request (it is counted), then reset the connection (RST);
* ``refuse``        - close the listening socket, so connections are refused.

Capacity mode (a brownout: the IdP answers, but only so fast) is set the same way:

* ``capacity``       - at most this many requests in service at once (None: unlimited);
* ``service_time``   - seconds each request spends in service (default 0.05);
* ``max_queue_wait`` - a request that has waited this long for service gets 503 (default 5).

The rest wait in arrival (FIFO) order, so the IdP serves ``capacity / service_time``
calls per second. Changing ``capacity`` mid-run takes effect at once. A request that
was served but whose caller had closed the connection before the answer was written
counts as *wasted*: work the IdP did for nobody.

``GET /_fake/stats`` (or :meth:`FakeIdP.stats`) counts the calls received, and in
capacity mode the queue (length, wait p50/p99), the served, expired and wasted calls.
It also counts them by *tag*: the text after the last ``@`` of the bearer token
(``good-alice~@prod`` is tagged ``prod``; a token without ``@`` is tagged ``""``), so
a load test can read the IdP's own figures per cluster (``by_tag``: calls, answers by
status, queue-wait p50/p99 and calls per wall-clock second). ``GET
/_fake/stats?since=T`` gives each tag's queue-wait quantiles of the waits that ended
after wall-clock time T only (a run's steady state, past its start-up round).

HTTP/1.1 is parsed by h11, with keep-alive, so the gateway's pooled client sees a
real server. Run standalone with ``python -m tests.support.fakes.idp --port N``.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import random
import socket
import struct
import threading
import time
from collections import deque
from collections.abc import Awaitable, Callable
from dataclasses import asdict, dataclass, field, replace
from typing import Any

import h11

Handler = Callable[[str, str, dict[str, str], bytes], Awaitable[tuple[int, dict[str, str], bytes]]]


@dataclass
class Faults:
    latency: float = 0.0
    fail_fraction: float = 0.0
    fail_status: int = 500
    status: int | None = None
    retry_after: float | str | None = None
    hang: bool = False
    reset: bool = False
    refuse: bool = False
    # Lifetime reported in the "exp" claim; None reports no expiry.
    expires_in: float | None = None
    # Capacity mode: at most `capacity` in service, `service_time` s each, FIFO queue.
    capacity: int | None = None
    service_time: float = 0.05
    max_queue_wait: float = 5.0


@dataclass
class Stats:
    calls: int = 0
    by_status: dict[int, int] = field(default_factory=dict)
    in_flight: int = 0
    max_in_flight: int = 0
    # Monotonic arrival times of the most recent calls, for rate checks.
    arrivals: list[float] = field(default_factory=list)
    # Capacity mode. Seconds each request waited for service (or until its 503), the
    # most recent 20,000; requests served, expired (503 after max_queue_wait), and
    # served for a caller that had already closed its connection.
    queue_waits: list[float] = field(default_factory=list)
    # Wall-clock time each of those waits ended (same order), for a per-second view.
    queue_wait_ends: list[float] = field(default_factory=list)
    queued: int = 0
    max_queued: int = 0
    in_service: int = 0
    max_in_service: int = 0
    served: int = 0
    expired: int = 0
    wasted: int = 0
    by_tag: dict[str, TagStats] = field(default_factory=dict)

    def tag(self, name: str) -> TagStats:
        found = self.by_tag.get(name)
        if found is None:
            found = self.by_tag[name] = TagStats()
        return found

    def queue_wait_ms(self, q: float, waits: list[float] | None = None) -> float | None:
        """The q-quantile of the recorded queue waits, in ms (None before any)."""
        waits = sorted(self.queue_waits) if waits is None else waits
        if not waits:
            return None
        return 1000 * waits[min(len(waits) - 1, int(q * len(waits)))]

    def as_dict(self) -> dict[str, Any]:
        """The JSON the control port serves (no raw lists)."""
        waits = sorted(self.queue_waits)
        return {
            "calls": self.calls,
            "by_status": self.by_status,
            "in_flight": self.in_flight,
            "max_in_flight": self.max_in_flight,
            "queued": self.queued,
            "max_queued": self.max_queued,
            "in_service": self.in_service,
            "max_in_service": self.max_in_service,
            "served": self.served,
            "expired": self.expired,
            "wasted": self.wasted,
            "queue_wait_p50_ms": self.queue_wait_ms(0.50, waits),
            "queue_wait_p99_ms": self.queue_wait_ms(0.99, waits),
            "queue_wait_max_ms_by_second": self.queue_wait_max_by_second(),
            "by_tag": {name: tag.as_dict() for name, tag in self.by_tag.items()},
        }

    def queue_wait_max_by_second(self) -> list[tuple[int, float]]:
        """(wall-clock second, longest wait in ms that ended in it), oldest first."""
        worst: dict[int, float] = {}
        for ended, wait in zip(self.queue_wait_ends, self.queue_waits, strict=True):
            second = int(ended)
            worst[second] = max(worst.get(second, 0.0), 1000 * wait)
        return sorted(worst.items())


@dataclass
class TagStats:
    """The calls of one token tag (the text after a token's last ``@``)."""

    calls: int = 0
    by_status: dict[int, int] = field(default_factory=dict)
    # Seconds each call waited for service (capacity mode), the most recent 20,000, and
    # the wall-clock time each wait ended (same order).
    queue_waits: list[float] = field(default_factory=list)
    wait_ends: list[float] = field(default_factory=list)
    # Calls received per wall-clock second.
    per_second: dict[int, int] = field(default_factory=dict)

    def as_dict(self, since: float | None = None) -> dict[str, Any]:
        pairs = zip(self.wait_ends, self.queue_waits, strict=True)
        waits = sorted(w for ended, w in pairs if since is None or ended > since)

        def quantile(q: float) -> float | None:
            return 1000 * waits[min(len(waits) - 1, int(q * len(waits)))] if waits else None

        return {
            "calls": self.calls,
            "by_status": self.by_status,
            "queue_wait_p50_ms": quantile(0.50),
            "queue_wait_p99_ms": quantile(0.99),
            "per_second": sorted(self.per_second.items()),
        }


def token_tag(headers: dict[str, str]) -> str:
    """The tag of the request's bearer token: the text after its last ``@``."""
    token = headers.get("authorization", "").removeprefix("Bearer ")
    return token.rpartition("@")[2] if "@" in token else ""


class ServiceQueue:
    """At most C requests in service, the others waiting in FIFO order (one event loop).

    :meth:`enter` returns the seconds waited, or None when the wait passed
    ``max_queue_wait`` (the caller answers 503). :meth:`leave` frees the slot.
    """

    def __init__(self, faults: Callable[[], Faults]) -> None:
        # A getter: the fake Keystone replaces its faults object on reset.
        self._faults = faults
        self.in_service = 0
        self._waiting: deque[asyncio.Future[bool]] = deque()

    @property
    def faults(self) -> Faults:
        return self._faults()

    @property
    def queued(self) -> int:
        return len(self._waiting)

    async def enter(self) -> float | None:
        started = time.monotonic()
        cap = self.faults.capacity
        if cap is not None and (self.in_service >= cap or self._waiting):
            loop = asyncio.get_running_loop()
            ticket: asyncio.Future[bool] = loop.create_future()
            self._waiting.append(ticket)
            expiry = loop.call_later(self.faults.max_queue_wait, self._expire, ticket)
            try:
                admitted = await ticket
            finally:
                expiry.cancel()
                if not ticket.done():
                    ticket.cancel()
                    self._forget(ticket)
            if not admitted:
                return None
        else:
            self.in_service += 1
        return time.monotonic() - started

    def leave(self) -> None:
        self.in_service -= 1
        self.dispatch()

    def dispatch(self) -> None:
        """Admit waiters while slots are free (also after ``capacity`` grows)."""
        cap = self.faults.capacity
        while self._waiting and (cap is None or self.in_service < cap):
            ticket = self._waiting.popleft()
            if ticket.done():
                continue
            self.in_service += 1
            ticket.set_result(True)

    def _expire(self, ticket: asyncio.Future[bool]) -> None:
        if not ticket.done():
            self._forget(ticket)
            ticket.set_result(False)

    def _forget(self, ticket: asyncio.Future[bool]) -> None:
        with contextlib.suppress(ValueError):
            self._waiting.remove(ticket)


class ResetConnection(Exception):
    """Raised by a handler: reset the connection instead of answering."""


def _reset(writer: asyncio.StreamWriter) -> None:
    sock = writer.get_extra_info("socket")
    if sock is not None:
        # Linger 0: close() sends RST, as a crashing or overloaded server does.
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    writer.transport.abort()


async def serve_h11(
    reader: asyncio.StreamReader, writer: asyncio.StreamWriter, handler: Handler
) -> None:
    """Serve HTTP/1.1 requests on one connection until the client closes it."""
    conn = h11.Connection(h11.SERVER)
    try:
        while True:
            event = conn.next_event()
            if event is h11.NEED_DATA:
                data = await reader.read(65536)
                conn.receive_data(data)
                if not data:
                    return
                continue
            if isinstance(event, h11.ConnectionClosed):
                return
            if not isinstance(event, h11.Request):
                continue
            body = b""
            while True:
                part = conn.next_event()
                if part is h11.NEED_DATA:
                    conn.receive_data(await reader.read(65536))
                    continue
                if isinstance(part, h11.Data):
                    body += part.data
                if isinstance(part, h11.EndOfMessage):
                    break
            headers = {k.decode().lower(): v.decode() for k, v in event.headers}
            try:
                status, out_headers, out = await handler(
                    event.method.decode(), event.target.decode(), headers, body
                )
            except ResetConnection:
                _reset(writer)
                return
            hdrs = [(k, v) for k, v in out_headers.items()]
            hdrs.append(("content-length", str(len(out))))
            writer.write(conn.send(h11.Response(status_code=status, headers=hdrs)))
            writer.write(conn.send(h11.Data(data=out)))
            writer.write(conn.send(h11.EndOfMessage()))
            await writer.drain()
            if conn.our_state is h11.MUST_CLOSE:
                return
            conn.start_next_cycle()
    except (ConnectionError, h11.RemoteProtocolError, asyncio.IncompleteReadError):
        return
    finally:
        writer.close()


def _json(
    status: int, doc: Any, headers: dict[str, str] | None = None
) -> tuple[int, dict[str, str], bytes]:
    return status, {"content-type": "application/json", **(headers or {})}, json.dumps(doc).encode()


async def injected_fault(
    faults: Faults, error_body: Callable[[int], Any]
) -> tuple[int, dict[str, str], bytes] | None:
    """Apply the hang, latency and status faults: the answer to send instead, or None."""
    if faults.hang:
        await asyncio.Event().wait()
    if faults.reset:
        raise ResetConnection
    if faults.latency:
        await asyncio.sleep(faults.latency)
    status = faults.status
    if status is None and faults.fail_fraction and random.random() < faults.fail_fraction:
        status = faults.fail_status
    if status is None or status == 200:
        return None
    extra = {}
    if status in (429, 503) and faults.retry_after is not None:
        value = faults.retry_after
        extra["retry-after"] = value if isinstance(value, str) else str(int(value))
    return _json(status, error_body(status), extra)


class FakeIdP:
    def __init__(
        self, host: str = "127.0.0.1", port: int = 0, control_port: int | None = None
    ) -> None:
        self.host = host
        self.port = port
        self.control_port = control_port
        self.faults = Faults()
        self._stats = Stats()
        self._lock = threading.Lock()
        self._server: asyncio.Server | None = None
        self._control: asyncio.Server | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._writers: set[asyncio.StreamWriter] = set()
        self._queue = ServiceQueue(lambda: self.faults)

    # ---- the IdP itself -------------------------------------------------------
    async def _answer(
        self, method: str, target: str, headers: dict[str, str], body: bytes
    ) -> tuple[int, dict[str, str], bytes]:
        status, hdrs, out, _served = await self._answer_served(method, target, headers, body)
        return status, hdrs, out

    async def _answer_served(
        self, method: str, target: str, headers: dict[str, str], body: bytes
    ) -> tuple[int, dict[str, str], bytes, bool]:
        """The answer, and whether it took a service slot (capacity mode)."""
        tag = token_tag(headers)
        with self._lock:
            st = self._stats
            tagged = st.tag(tag)
            tagged.calls += 1
            second = int(time.time())
            tagged.per_second[second] = tagged.per_second.get(second, 0) + 1
            st.calls += 1
            st.in_flight += 1
            st.max_in_flight = max(st.max_in_flight, st.in_flight)
            st.arrivals.append(time.monotonic())
            del st.arrivals[:-100_000]
        served = False
        try:
            if self.faults.capacity is None:
                status, hdrs, out = await self._decide(method, target, headers, body)
            else:
                status, hdrs, out, served = await self._in_capacity(
                    method, target, headers, body, tag
                )
        finally:
            with self._lock:
                self._stats.in_flight -= 1
        with self._lock:
            self._stats.by_status[status] = self._stats.by_status.get(status, 0) + 1
            tagged = self._stats.tag(tag)
            tagged.by_status[status] = tagged.by_status.get(status, 0) + 1
        return status, hdrs, out, served

    async def _in_capacity(
        self, method: str, target: str, headers: dict[str, str], body: bytes, tag: str = ""
    ) -> tuple[int, dict[str, str], bytes, bool]:
        q = self._queue
        with self._lock:
            st = self._stats
            st.queued = q.queued + 1
            st.max_queued = max(st.max_queued, st.queued)
        waited = await q.enter()
        with self._lock:
            st = self._stats
            st.queued = q.queued
            st.queue_waits.append(self.faults.max_queue_wait if waited is None else waited)
            st.queue_wait_ends.append(time.time())
            tagged = st.tag(tag)
            tagged.queue_waits.append(st.queue_waits[-1])
            tagged.wait_ends.append(st.queue_wait_ends[-1])
            del tagged.queue_waits[:-20_000]
            del tagged.wait_ends[:-20_000]
            del st.queue_waits[:-20_000]
            del st.queue_wait_ends[:-20_000]
            if waited is None:
                st.expired += 1
            else:
                st.in_service = q.in_service
                st.max_in_service = max(st.max_in_service, q.in_service)
        if waited is None:
            return (*_json(503, {"error": "fake IdP overloaded"}), False)
        try:
            await asyncio.sleep(self.faults.service_time)
            status, hdrs, out = await self._decide(method, target, headers, body)
        finally:
            q.leave()
            with self._lock:
                self._stats.served += 1
                self._stats.in_service = q.in_service
                self._stats.queued = q.queued
        return status, hdrs, out, True

    def _count_wasted(self) -> None:
        with self._lock:
            self._stats.wasted += 1

    async def _decide(
        self, method: str, target: str, headers: dict[str, str], body: bytes
    ) -> tuple[int, dict[str, str], bytes]:
        """The answer to one request; subclasses (the fake Keystone) override this."""
        f = self.faults
        fault = await injected_fault(f, lambda status: {"error": f"fake IdP answers {status}"})
        if fault is not None:
            return fault
        if not target.startswith("/userinfo"):
            return _json(404, {"error": "not found"})
        auth = headers.get("authorization", "")
        token = auth[7:] if auth.startswith("Bearer ") else ""
        if token.startswith("signed-") and len(token) > 7:
            # Header and claims base64url-encoded, a dummy signature: never parsed here.
            jwt = b"eyJhbGciOiJSUzI1NiJ9.eyJzdWIiOiJ4In0.c2lnbmF0dXJl"
            return 200, {"content-type": "application/jwt"}, jwt
        if token.startswith("nameless-") and len(token) > 9:
            return _json(200, {"sub": f"client-{token[9:]}"})
        if not token.startswith("good-") or len(token) <= 5:
            return _json(401, {"error": "invalid_token"})
        name = token[5:].split("~", 1)[0]
        claims: dict[str, Any] = {
            "sub": f"uid-{name}",
            "preferred_username": name,
            "groups": ["fake-users"],
        }
        if f.expires_in is not None:
            claims["exp"] = time.time() + f.expires_in
        return _json(200, claims)

    # ---- control --------------------------------------------------------------
    def configure(self, **changes: Any) -> None:
        """Change faults; thread-safe. ``refuse`` closes or reopens the listener."""
        refuse = changes.pop("refuse", None)
        self._set_faults(changes)
        if self._loop is not None:
            # A larger capacity admits waiters now, not when the next one leaves.
            self._loop.call_soon_threadsafe(self._queue.dispatch)
        if refuse is not None and self._loop is not None:
            fut = asyncio.run_coroutine_threadsafe(self._set_refuse(bool(refuse)), self._loop)
            fut.result(timeout=5)

    def _set_faults(self, changes: dict[str, Any]) -> None:
        for key in changes:
            if not hasattr(self.faults, key):
                raise ValueError(f"unknown fault {key!r}")
        capacity = changes.get("capacity", self.faults.capacity)
        if capacity is not None and (not isinstance(capacity, int) or capacity < 1):
            raise ValueError("capacity must be a positive integer or null")
        for key in ("service_time", "max_queue_wait"):
            if key in changes and not (isinstance(changes[key], int | float) and changes[key] >= 0):
                raise ValueError(f"{key} must be a non-negative number")
        for key, value in changes.items():
            setattr(self.faults, key, value)

    def reset(self) -> None:
        self.configure(**{**asdict(Faults())})
        self.reset_stats()

    def reset_stats(self) -> None:
        with self._lock:
            self._stats = Stats()

    def stats(self) -> Stats:
        with self._lock:
            s = self._stats
            return replace(
                s,
                by_status=dict(s.by_status),
                by_tag={
                    name: replace(
                        t,
                        by_status=dict(t.by_status),
                        queue_waits=list(t.queue_waits),
                        wait_ends=list(t.wait_ends),
                        per_second=dict(t.per_second),
                    )
                    for name, t in s.by_tag.items()
                },
                arrivals=list(s.arrivals),
                queue_waits=list(s.queue_waits),
                queue_wait_ends=list(s.queue_wait_ends),
            )

    @property
    def calls(self) -> int:
        return self.stats().calls

    async def _set_refuse(self, refuse: bool) -> None:
        self.faults.refuse = refuse
        if refuse and self._server is not None:
            self._server.close()
            self._server = None
            # A dead IdP drops the connections it had, too.
            for writer in list(self._writers):
                writer.close()
        elif not refuse and self._server is None:
            await self._listen()

    async def _control_answer(
        self, method: str, target: str, headers: dict[str, str], body: bytes
    ) -> tuple[int, dict[str, str], bytes]:
        if method == "GET" and target.partition("?")[0] == "/_fake/stats":
            query = target.partition("?")[2]
            since = float(query.removeprefix("since=")) if query.startswith("since=") else None
            # Sampled every 0.5 s during load: no copies of the raw lists.
            with self._lock:
                summary = self._stats.as_dict()
                if since is not None:
                    summary["by_tag"] = {
                        name: tag.as_dict(since) for name, tag in self._stats.by_tag.items()
                    }
            return _json(200, summary)
        if method == "POST" and target == "/_fake/faults":
            try:
                changes = json.loads(body or b"{}")
                refuse = changes.pop("refuse", None)
                self._set_faults(changes)
                self._queue.dispatch()
                if refuse is not None:
                    await self._set_refuse(bool(refuse))
            except ValueError as exc:
                return _json(400, {"error": str(exc)})
            return _json(200, asdict(self.faults))
        if method == "POST" and target == "/_fake/reset":
            self._set_faults(asdict(Faults()))
            self._queue.dispatch()
            await self._set_refuse(False)
            self.reset_stats()
            return _json(200, asdict(self.faults))
        return _json(404, {"error": "not found"})

    # ---- lifecycle ------------------------------------------------------------
    async def _listen(self) -> None:
        self._server = await asyncio.start_server(
            self._connection, self.host, self.port, reuse_address=True
        )
        self.port = self._server.sockets[0].getsockname()[1]

    async def _connection(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self._writers.add(writer)

        async def answer(
            method: str, target: str, headers: dict[str, str], body: bytes
        ) -> tuple[int, dict[str, str], bytes]:
            status, hdrs, out, served = await self._answer_served(method, target, headers, body)
            # serve_h11 writes the answer next, with no await in between: a caller who
            # closed the connection (a client timeout) will never read it.
            if served and (reader.at_eof() or writer.is_closing()):
                self._count_wasted()
            return status, hdrs, out

        try:
            await serve_h11(reader, writer, answer)
        except asyncio.CancelledError:
            # Only stop() cancels a handler. Ended quietly: Python 3.11's stream server
            # reports a handler task that ends cancelled as an error in a callback.
            return
        finally:
            self._writers.discard(writer)

    async def _control_connection(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> None:
        with contextlib.suppress(asyncio.CancelledError):  # as in _connection
            await serve_h11(reader, writer, self._control_answer)

    async def run(self) -> None:
        self._loop = asyncio.get_running_loop()
        await self._listen()
        if self.control_port is not None:
            self._control = await asyncio.start_server(
                self._control_connection, self.host, self.control_port
            )
            self.control_port = self._control.sockets[0].getsockname()[1]

    def start_in_thread(self) -> FakeIdP:
        started = threading.Event()

        def main() -> None:
            loop = asyncio.new_event_loop()
            asyncio.set_event_loop(loop)
            loop.run_until_complete(self.run())
            started.set()
            loop.run_forever()

        self._thread = threading.Thread(target=main, name="fake-idp", daemon=True)
        self._thread.start()
        if not started.wait(10):
            raise RuntimeError("fake IdP did not start")
        return self

    def stop(self) -> None:
        loop = self._loop
        if loop is None:
            return

        async def shutdown() -> None:
            for server in (self._server, self._control):
                if server is not None:
                    server.close()
            for writer in list(self._writers):
                writer.close()
            # Hanging and in-flight handlers end here, not when the loop is gone.
            tasks = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)

        asyncio.run_coroutine_threadsafe(shutdown(), loop).result(timeout=5)
        loop.call_soon_threadsafe(loop.stop)
        if self._thread is not None:
            self._thread.join(timeout=5)
        loop.close()

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}/userinfo"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--control-port", type=int, default=0)
    args = parser.parse_args()
    idp = FakeIdP(port=args.port, control_port=args.control_port)

    async def forever() -> None:
        await idp.run()
        print(f"fake IdP on {idp.url}, control on 127.0.0.1:{idp.control_port}", flush=True)
        await asyncio.Event().wait()

    asyncio.run(forever())


if __name__ == "__main__":
    main()
