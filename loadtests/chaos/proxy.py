"""A TCP proxy in front of redis-server, in a thread of its own: Redis slow or cut off.

``latency``: every answer from Redis is held this long (in order), as a busy Redis or
a congested network holds it. ``cut``: the listener closes and every open connection is
reset, so the replicas see refused connections (a partition; Redis keeps its data,
unlike :meth:`ChaosFleet.restart_redis`). Changes are thread-safe.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time

from tests.support.procs import free_port


class RedisProxy:
    def __init__(self, target_port: int) -> None:
        self.target_port = target_port
        self.port = free_port()
        self.latency = 0.0
        self._server: asyncio.Server | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._writers: set[asyncio.StreamWriter] = set()
        self._thread: threading.Thread | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> RedisProxy:
        started = threading.Event()

        def main() -> None:
            loop = asyncio.new_event_loop()
            self._loop = loop
            loop.run_until_complete(self._listen())
            started.set()
            loop.run_forever()

        self._thread = threading.Thread(target=main, name="redis-proxy", daemon=True)
        self._thread.start()
        if not started.wait(10):
            raise RuntimeError("redis proxy did not start")
        return self

    def _call(self, coro: object) -> None:
        assert self._loop is not None
        asyncio.run_coroutine_threadsafe(coro, self._loop).result(timeout=10)  # type: ignore[arg-type]

    def cut(self, cut: bool) -> None:
        self._call(self._cut(cut))

    async def _cut(self, cut: bool) -> None:
        if cut and self._server is not None:
            self._server.close()
            self._server = None
            for writer in list(self._writers):
                writer.transport.abort()
        elif not cut and self._server is None:
            await self._listen()

    async def _listen(self) -> None:
        self._server = await asyncio.start_server(
            self._connection, "127.0.0.1", self.port, reuse_address=True
        )

    async def _connection(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            up_reader, up_writer = await asyncio.open_connection("127.0.0.1", self.target_port)
        except OSError:
            writer.transport.abort()
            return
        self._writers.update((writer, up_writer))
        try:
            await asyncio.gather(
                self._pump(reader, up_writer, delayed=False),
                self._pump(up_reader, writer, delayed=True),
            )
        finally:
            for w in (writer, up_writer):
                self._writers.discard(w)
                w.transport.abort()

    async def _pump(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, delayed: bool
    ) -> None:
        queue: asyncio.Queue[tuple[float, bytes]] = asyncio.Queue()

        async def send() -> None:
            while True:
                due, data = await queue.get()
                if not data:
                    return
                wait = due - time.monotonic()
                if wait > 0:
                    await asyncio.sleep(wait)
                writer.write(data)
                await writer.drain()

        sender = asyncio.ensure_future(send())
        try:
            while True:
                data = await reader.read(65536)
                due = time.monotonic() + (self.latency if delayed else 0.0)
                queue.put_nowait((due, data))
                if not data:
                    break
            await sender
        except (ConnectionError, OSError):
            pass
        finally:
            sender.cancel()
            with contextlib.suppress(asyncio.CancelledError, ConnectionError, OSError):
                await sender
            writer.transport.abort()

    def stop(self) -> None:
        loop = self._loop
        if loop is None:
            return
        with contextlib.suppress(Exception):
            self._call(self._cut(True))
        loop.call_soon_threadsafe(loop.stop)
        if self._thread is not None:
            self._thread.join(timeout=5)
