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
next turn), so:

* an HTTP call's IdP time is its time on the wire (``backends.context.WireTime``: from
  writing the request to reading the answer's headers, which leaves out the loop's
  turns for the pool, the body and the close) less the loop's delay when the answer
  was read (:meth:`LoopLag.delay_within`: the answer sat unread that long);
* a call that timed out had the IdP from its connect or write on, less the same
  unread bound; a request never written never reached the IdP. Mostly ours, and the
  timeout is not the IdP's failure (``deadline.OwnDelay``);
* a call that is not over HTTP (LDAP): the ticks' delays added up over it
  (:attr:`LoopLag.behind` at its end less at its start). That sum can overstate our
  part when the loop stalled while the IdP was still working.

The unread bound goes to the IdP's benefit where that is the safe side: the breaker's
slow-call rule leaves it out, the concurrency limit counts it (a queue at the IdP must
not hide behind our delays).
"""

from __future__ import annotations

import asyncio
import time
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
        #: The last tick's delay, in ``time.perf_counter`` time: from when it was due
        #: to when it ran.
        self.late_from = self.late_to = time.perf_counter()
        self._due = loop.time() + interval
        self._handle = loop.call_at(self._due, self._tick)

    @property
    def latest(self) -> float:
        """Seconds the last tick ran late (0 on an idle loop)."""
        return self.late_to - self.late_from

    def _tick(self) -> None:
        now = self._loop.time()
        late = max(0.0, now - self._due)
        self.behind += late
        self.late_to = time.perf_counter()
        self.late_from = self.late_to - late
        self._due = now + self._interval
        self._handle = self._loop.call_at(self._due, self._tick)

    def delay_within(self, started: float, ended: float) -> float:
        """The part of the last tick's delay inside ``started..ended`` (perf_counter).

        Asked when an answer has just been read: if the loop was behind when that
        turn began, the answer may have waited unread all that time (timers run
        before I/O in a turn, so the delay is noted by then). A delay that ended
        before the call was sent is not the call's.
        """
        return max(0.0, min(self.late_to, ended) - max(self.late_from, started))

    def stop(self) -> None:
        self._handle.cancel()


def for_running_loop() -> LoopLag:
    """The running loop's monitor, started on first use."""
    loop = asyncio.get_running_loop()
    monitor = _monitors.get(loop)
    if monitor is None:
        monitor = _monitors[loop] = LoopLag(loop)
    return monitor
