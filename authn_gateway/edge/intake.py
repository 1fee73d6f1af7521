"""How much of what a connection sent is read and parsed, and when: the per-connection
bound on requests waiting to be answered.

uvicorn parses every byte it reads into a request queued behind the running one, and
every answer (and every ``receive()`` of the running request) resumes reading: a client
that pipelines requests and never reads the answers grows the queue, and the answers,
without bound (issue 29: +1 GiB in 15 s from one connection). Here:

- a connection reads at most :data:`READ_SIZE` bytes at a time (it is an
  ``asyncio.BufferedProtocol``, reading into one buffer per loop), so what is read and
  not yet parsed is at most one read;
- the parser is fed pieces that can each complete at most as many request heads as
  there is room for (:func:`piece_end`), so at most :data:`MAX_PIPELINED` requests are
  parsed and unanswered (the running one and the next);
- nothing more is fed, and the transport stops reading, while that many are waiting,
  while the answers written are not sent (over :data:`WRITE_HIGH_WATER`), or while the
  running request's body holds :data:`BODY_HIGH_WATER` bytes its application has not
  taken; answers that stay unsent for the send timeout end the connection;
- feeding resumes when an answer completes, the answers drain, or the application takes
  the body (:class:`EdgeFlow` turns uvicorn's ``resume_reading`` calls into that).
"""

from __future__ import annotations

import asyncio
import weakref
from collections.abc import Callable

from uvicorn.protocols.http.flow_control import FlowControl

#: Bytes read from the socket at a time; also the most read and not yet parsed.
READ_SIZE = 4096
#: Data is fed to the parser in pieces of at most this size, so an unfinished head is
#: measured to within one piece wherever it starts in a read, and httptools never
#: buffers more than max_header_bytes + READ_SLICE of it.
READ_SLICE = 4096
#: Requests parsed and not yet answered, per connection: the running one and the next
#: (pipelined requests run one after another, so parsing further ahead gains nothing).
MAX_PIPELINED = 2
#: Body bytes of a request held for its application, which takes them as it reads
#: (a review's body is whole in one read or two; uvicorn holds 64 KiB).
BODY_HIGH_WATER = 16 * 1024
#: Answers written and not yet sent past which nothing more is read (uvloop's mark is
#: 64 KiB): a connection's unsent answers stay near this, since each piece fed adds the
#: answers of at most MAX_PIPELINED requests.
WRITE_HIGH_WATER = 16 * 1024

# Every request head ends with an empty line; llhttp accepts no bare LF (tested in
# tests/unit/test_edge_intake.py), so each completed head is an occurrence of this.
HEAD_END = b"\r\n\r\n"
# What a read may begin with when its first bytes finish a head end begun in the read
# before it (a suffix of HEAD_END that contains its last LF).
_HEAD_END_TAILS = (b"\n", b"\r\n")


def piece_end(data: bytes, pos: int, budget: int, fresh: bool) -> int:
    """Where the next piece of ``data`` to feed the parser ends, starting at ``pos``: at
    most :data:`READ_SLICE` bytes, in which at most ``budget`` (>= 1) request heads can
    be completed. ``fresh``: ``data`` is a new read, whose first bytes may end a head
    begun in the read before it (counted as one, to be safe).

    An occurrence of CRLF CRLF is counted wherever it is (a body may hold one too): more
    pieces than needed, never fewer. The usual read, one request, is one count."""
    end = min(len(data), pos + READ_SLICE)
    # Occurrences whose last byte is in data[pos:end] start at pos - 3 or later.
    start = pos - 3 if pos >= 3 else 0
    straddle = 1 if fresh and pos == 0 and data.startswith(_HEAD_END_TAILS) else 0
    if data.count(HEAD_END, start, end) + straddle <= budget:
        return end
    # Stop just before the last byte of the (budget + 1)th possible head end. Overlapping
    # occurrences are all found, so none is missed.
    seen = straddle
    found = data.find(HEAD_END, start, end)
    while found != -1:
        seen += 1
        if seen > budget:
            return found + 3
        found = data.find(HEAD_END, found + 1, end)
    return end


class EdgeFlow(FlowControl):  # type: ignore[misc]
    """uvicorn's flow control, with reading decided by the connection's intake: the
    cycle's ``resume_reading`` (each ``receive()``) asks the protocol to feed what it
    holds, within the bound; ``pause_reading`` is implied by the bound itself."""

    def __init__(self, transport: asyncio.Transport, resume: Callable[[], None]) -> None:
        super().__init__(transport)
        self._resume = resume

    def pause_reading(self) -> None:
        pass

    def resume_reading(self) -> None:
        self._resume()


class BufferedReader(asyncio.BufferedProtocol):
    """What a plain TCP transport reads for: the connection's own callbacks, as a
    ``BufferedProtocol`` uvloop honours. (uvloop reads for a subclass of
    ``asyncio.Protocol``, which uvicorn's protocol is, with ``data_received`` of up to
    256 KiB, whatever else it defines; asyncio's TLS layer honours the protocol itself.)
    Its attributes are the connection's bound methods: no call goes through it."""

    def __init__(self, protocol: asyncio.BufferedProtocol) -> None:
        self.get_buffer = protocol.get_buffer  # type: ignore[method-assign]
        self.buffer_updated = protocol.buffer_updated  # type: ignore[method-assign]
        self.eof_received = protocol.eof_received  # type: ignore[method-assign]
        self.connection_lost = protocol.connection_lost  # type: ignore[method-assign]
        self.pause_writing = protocol.pause_writing  # type: ignore[method-assign]
        self.resume_writing = protocol.resume_writing  # type: ignore[method-assign]


_buffers: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, memoryview] = (
    weakref.WeakKeyDictionary()
)


def read_buffer_for(loop: asyncio.AbstractEventLoop) -> memoryview:
    """The loop's one read buffer: a transport fills it and hands it to its protocol's
    ``buffer_updated`` before it reads for anyone else, so every connection shares it."""
    buffer = _buffers.get(loop)
    if buffer is None:
        buffer = _buffers[loop] = memoryview(bytearray(READ_SIZE))
    return buffer
