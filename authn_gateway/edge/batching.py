"""Writes held to the end of the event loop's turn: flush consolidation, as Netty's
``FlushConsolidationHandler`` does it.

Every answer written at once costs a ``send()``, and on loopback (an API server beside
its webhook, and the benchmark rig) a ``send()`` also runs the receiver's side of TCP
and wakes the receiving process, on our core. A client faster than us sleeps between
our answers, so each answer paid for a wake-up: 21 % of the serving process's perf
samples under a cache-hit load were there (docs/decisions.md, issue 19). Held until
the loop has run every read that was ready, the answers of one turn go out back to
back: the client is woken by the first and finds the others when it looks, and
pipelined answers on one connection go out in one ``send()``.

Nothing waits for a timer: the flush is a callback queued for the loop's next pass.
Order on a connection is kept, since every write to it goes through here, and anything
that ends or reshapes its stream (close, half-close, abort) sends what is held first.
"""

from __future__ import annotations

import asyncio
import weakref
from typing import Any

# Held bytes that are sent at once, without waiting for the turn to end: asyncio's
# default high-water mark, where a transport starts pushing back on its writer.
FLUSH_AT = 64 * 1024


class WriteBatch:
    """The connections of one event loop that hold writes, flushed together."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self._due: list[BatchedTransport] = []

    def add(self, transport: BatchedTransport) -> None:
        if not self._due:
            self._loop.call_soon(self.flush)
        self._due.append(transport)

    def flush(self) -> None:
        due, self._due = self._due, []
        for transport in due:
            try:
                transport.flush()
            except (RuntimeError, OSError):
                # A transport closed under us (uvloop raises RuntimeError for a closed
                # handle): that connection is over, and the others still get theirs.
                transport.abort()


_batches: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, WriteBatch] = (
    weakref.WeakKeyDictionary()
)


def batch_for(loop: asyncio.AbstractEventLoop) -> WriteBatch:
    """The loop's one batch (every connection it serves shares it)."""
    batch = _batches.get(loop)
    if batch is None:
        batch = _batches[loop] = WriteBatch(loop)
    return batch


class BatchedTransport:
    """A connection's transport whose writes wait for :meth:`WriteBatch.flush`; every
    other call goes to the real transport, after what is held when it ends the stream."""

    def __init__(self, transport: asyncio.Transport, batch: WriteBatch) -> None:
        self._transport = transport
        self._batch = batch
        self._held: list[bytes] = []
        self._held_bytes = 0
        # Called on every request: bound here, not looked up through __getattr__.
        self.is_closing = transport.is_closing
        self.get_extra_info = transport.get_extra_info
        self.pause_reading = transport.pause_reading
        self.resume_reading = transport.resume_reading

    def write(self, data: bytes | bytearray | memoryview) -> None:
        if not data:
            return
        if not self._held:
            self._batch.add(self)
        # A copy of anything mutable: the writer may reuse its buffer before the flush.
        self._held.append(data if isinstance(data, bytes) else bytes(data))
        self._held_bytes += len(data)
        if self._held_bytes >= FLUSH_AT:
            # Many answers in one read (a client pipelining cached reviews): sent now, so
            # the transport's own back-pressure (pause_writing) sees them as before.
            self.flush()

    def writelines(self, lines: Any) -> None:
        for line in lines:
            self.write(line)

    def flush(self) -> None:
        held = self._held
        if not held:
            return
        self._held, self._held_bytes = [], 0
        if self._transport.is_closing():
            return  # the peer is gone: nothing to deliver
        self._transport.write(held[0] if len(held) == 1 else b"".join(held))

    def get_write_buffer_size(self) -> int:
        return self._held_bytes + self._transport.get_write_buffer_size()

    def write_eof(self) -> None:
        self.flush()
        self._transport.write_eof()

    def close(self) -> None:
        self.flush()
        self._transport.close()

    def abort(self) -> None:
        self._held, self._held_bytes = [], 0
        self._transport.abort()

    def __getattr__(self, name: str) -> Any:
        # can_write_eof, set_protocol, get_protocol, ...: as they are.
        return getattr(self._transport, name)
