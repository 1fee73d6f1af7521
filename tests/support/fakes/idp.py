"""A fault-injecting fake identity provider, for tests and load rehearsals.

It speaks the ``userinfo`` backend's protocol: ``GET /userinfo`` with
``Authorization: Bearer <token>``. Tokens ``good-<name>`` are valid for user
``<name>``; every other token gets 401.

Faults are set at run time, in process (:meth:`FakeIdP.configure`) or over the
control port (``POST /_fake/faults`` with a JSON body of the same fields):

* ``latency``       - seconds added before every answer;
* ``fail_fraction`` - share of calls answered with ``fail_status`` (default 500);
* ``status``        - answer every call with this status (401 for everyone, 500, 429);
* ``retry_after``   - seconds, sent as ``Retry-After`` on 429s;
* ``hang``          - read the request, never answer;
* ``refuse``        - close the listening socket, so connections are refused.

``GET /_fake/stats`` (or :meth:`FakeIdP.stats`) counts the calls received.

HTTP/1.1 is parsed by h11, with keep-alive, so the gateway's pooled client sees a
real server. Run standalone with ``python -m tests.support.fakes.idp --port N``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import threading
import time
from collections.abc import Awaitable, Callable
from dataclasses import asdict, dataclass, field
from typing import Any

import h11

Handler = Callable[[str, str, dict[str, str], bytes], Awaitable[tuple[int, dict[str, str], bytes]]]


@dataclass
class Faults:
    latency: float = 0.0
    fail_fraction: float = 0.0
    fail_status: int = 500
    status: int | None = None
    retry_after: float | None = None
    hang: bool = False
    refuse: bool = False
    # Lifetime reported in the "exp" claim; None reports no expiry.
    expires_in: float | None = None


@dataclass
class Stats:
    calls: int = 0
    by_status: dict[int, int] = field(default_factory=dict)
    in_flight: int = 0
    max_in_flight: int = 0
    # Monotonic arrival times of the most recent calls, for rate checks.
    arrivals: list[float] = field(default_factory=list)


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
            status, out_headers, out = await handler(
                event.method.decode(), event.target.decode(), headers, body
            )
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
    if faults.latency:
        await asyncio.sleep(faults.latency)
    status = faults.status
    if status is None and faults.fail_fraction and random.random() < faults.fail_fraction:
        status = faults.fail_status
    if status is None or status == 200:
        return None
    extra = {}
    if status == 429 and faults.retry_after is not None:
        extra["retry-after"] = str(int(faults.retry_after))
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

    # ---- the IdP itself -------------------------------------------------------
    async def _answer(
        self, method: str, target: str, headers: dict[str, str], body: bytes
    ) -> tuple[int, dict[str, str], bytes]:
        with self._lock:
            st = self._stats
            st.calls += 1
            st.in_flight += 1
            st.max_in_flight = max(st.max_in_flight, st.in_flight)
            st.arrivals.append(time.monotonic())
            del st.arrivals[:-100_000]
        try:
            status, hdrs, out = await self._decide(method, target, headers, body)
        finally:
            with self._lock:
                self._stats.in_flight -= 1
        with self._lock:
            self._stats.by_status[status] = self._stats.by_status.get(status, 0) + 1
        return status, hdrs, out

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
        if not token.startswith("good-") or len(token) <= 5:
            return _json(401, {"error": "invalid_token"})
        name = token[5:]
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
        for key, value in changes.items():
            if not hasattr(self.faults, key):
                raise ValueError(f"unknown fault {key!r}")
            setattr(self.faults, key, value)
        if refuse is not None and self._loop is not None:
            fut = asyncio.run_coroutine_threadsafe(self._set_refuse(bool(refuse)), self._loop)
            fut.result(timeout=5)

    def reset(self) -> None:
        self.configure(**{**asdict(Faults())})
        self.reset_stats()

    def reset_stats(self) -> None:
        with self._lock:
            self._stats = Stats()

    def stats(self) -> Stats:
        with self._lock:
            s = self._stats
            return Stats(s.calls, dict(s.by_status), s.in_flight, s.max_in_flight, list(s.arrivals))

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
        if method == "GET" and target == "/_fake/stats":
            s = self.stats()
            return _json(
                200,
                {
                    "calls": s.calls,
                    "by_status": s.by_status,
                    "in_flight": s.in_flight,
                    "max_in_flight": s.max_in_flight,
                },
            )
        if method == "POST" and target == "/_fake/faults":
            try:
                changes = json.loads(body or b"{}")
                refuse = changes.pop("refuse", None)
                for key, value in changes.items():
                    if not hasattr(self.faults, key):
                        raise ValueError(f"unknown fault {key!r}")
                    setattr(self.faults, key, value)
                if refuse is not None:
                    await self._set_refuse(bool(refuse))
            except ValueError as exc:
                return _json(400, {"error": str(exc)})
            return _json(200, asdict(self.faults))
        if method == "POST" and target == "/_fake/reset":
            self.faults = Faults()
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
        try:
            await serve_h11(reader, writer, self._answer)
        finally:
            self._writers.discard(writer)

    async def run(self) -> None:
        self._loop = asyncio.get_running_loop()
        await self._listen()
        if self.control_port is not None:
            self._control = await asyncio.start_server(
                lambda r, w: serve_h11(r, w, self._control_answer), self.host, self.control_port
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
