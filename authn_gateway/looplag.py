"""How late this process's event loop runs what is ready: the gateway's own delay.

A call to the IdP is timed from the moment it is sent to the moment its review's
coroutine runs again. When the gateway is short of CPU (a busy node, a CPU limit, its
own backlog of reviews), the answer can sit in the socket for a long time before the
loop gets to it, and that time is the gateway's, not the IdP's. Counted as IdP latency,
it would make the concurrency limit hold slots for calls the IdP has already answered
and the slow-call rule open the breaker on an IdP that is fast (measured: the
`brownout` scenario on a loaded 2-core machine, docs/decisions.md).

:class:`LoopLag` is a timer that fires every ``interval`` seconds and notes how late
it ran. A timer and an answer waiting in a socket wait for the same thing (the loop's
next turn), and the ticks' delays added up over a call (:attr:`LoopLag.behind` at its end less at
its start) are about the time the call waited for the loop rather than for the IdP:
its answer sitting unread, and each of the several turns an HTTP call takes (pool,
write, read, close) queued behind other reviews. The deadline layer takes that off
each call's measured time before the limit and the breaker read it.

It can overstate our part when the loop stalled while the IdP was still working
(then the IdP looks faster than it is), never understate it by much: the error
falls on the side of not blaming the IdP for the gateway's own delays.
"""

from __future__ import annotations

import asyncio
import weakref

#: Time between ticks: fine enough to see a delay of a few ms, cheap (50 timers/s).
INTERVAL = 0.02

_monitors: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, LoopLag] = (
    weakref.WeakKeyDictionary()
)


class LoopLag:
    def __init__(self, loop: asyncio.AbstractEventLoop, interval: float = INTERVAL) -> None:
        self._loop = loop
        self._interval = interval
        #: Seconds the ticks have run late in all, since the start.
        self.behind = 0.0
        #: Seconds the last tick ran late (0 on an idle loop).
        self.latest = 0.0
        self._due = loop.time() + interval
        self._handle = loop.call_at(self._due, self._tick)

    def _tick(self) -> None:
        now = self._loop.time()
        self.latest = max(0.0, now - self._due)
        self.behind += self.latest
        self._due = now + self._interval
        self._handle = self._loop.call_at(self._due, self._tick)

    def stop(self) -> None:
        self._handle.cancel()


def for_running_loop() -> LoopLag:
    """The running loop's monitor, started on first use."""
    loop = asyncio.get_running_loop()
    monitor = _monitors.get(loop)
    if monitor is None:
        monitor = _monitors[loop] = LoopLag(loop)
    return monitor
