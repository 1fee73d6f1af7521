"""An adaptive concurrency limit toward one IdP, from the latency it shows (pure logic).

TCP Vegas applied to calls, as in Netflix concurrency-limits' ``VegasLimit``: an IdP
with C workers answers in its no-load time (``base``) while fewer than C calls are in
flight; past C, the extra calls wait in its queue and every answer takes longer. With
L calls in flight and a measured latency ``rtt``, the calls queued at the IdP are about

    queue = L * (1 - base / rtt)

The limit grows fast (by ``beta``) while nothing queues at all, by one while the queue
is short (below ``alpha``), shrinks when it is long (above ``beta``; see below for by
how much), and holds in between, so the IdP keeps a few calls waiting (it is
never idle) and never a long line (its queue wait stays a fraction of one service
time). A call that failed or timed out is a drop: the limit is cut by ``backoff``,
as in AIMD.

Samples are taken per window (at least ``min_samples`` calls and ``min_window`` s, at
most ``max_window`` s), and each window updates the limit once, from its mean latency
and its largest in-flight count: one slow call must not move the limit.

``base`` is the no-load latency. A limit that is always above the IdP's capacity
never sees it, and would take a queued latency for it (and grow); an IdP that got
slower at any load (a brownout often starts in its database) never shows the old one
again, and a base from before would hold the limit far below capacity. So every
``probe_interval`` seconds one window runs at a quarter of the limit, as BBR's ProbeRTT does:
its calls (those sent with at most that many in flight) set ``base`` afresh, and
later windows can only lower it (the lowest mean since the probe, within
``base_horizon``). It costs about one short window in ``probe_interval`` at a quarter of the rate.

A window learns only from calls sent after it opened, once the limit changed at its
start: calls sent under the old limit say nothing of the new one, and a limit updated
from them grew by ``beta`` a window (every 0.1 s) before the first call it let out had
come back (measured at start-up: 5 to 34 in under a second, a 25-call IdP queue). So
the limit changes at most once per round trip, as TCP Vegas' does.

A long queue (past ``beta`` at the window's median latency, so not one slow call) is
shed in one step, down to ``beta`` queued and by at most half the limit: the start at
``initial`` (20) against an IdP serving 4 at once otherwise held a 15-call queue for 3 s.

Nothing here is tuned per IdP: alpha and beta are in calls, not in ms.

The clock is injected; :class:`VegasLimit` does no I/O and holds no locks (the event
loop is single-threaded).
"""

from __future__ import annotations

import math
import statistics
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field


@dataclass(frozen=True)
class VegasSettings:
    initial: float = 20.0
    min_limit: float = 1.0
    max_limit: float = 200.0
    # Calls queued at the IdP the limit aims to keep (per replica: divide by the
    # replica count so the fleet's total queue stays the same).
    alpha: float = 3.0
    beta: float = 6.0
    # On a drop (failure or timeout) the limit is multiplied by this.
    backoff: float = 0.9
    min_samples: int = 10
    min_window: float = 0.1
    max_window: float = 1.0
    base_horizon: float = 30.0
    probe_interval: float = 5.0
    # Extra latency (window mean over the no-load latency) too small to matter to any
    # review: the limit does not shrink for it (the gateway sets 2 % of the call
    # timeout). Without it, an IdP answering in 1 ms looks "queued 10x" from a few ms
    # of the gateway's own jitter, and the limit fell to 4 after a brownout ended.
    negligible_delay: float = 0.0


_MEDIAN_OF = 32


@dataclass
class _Window:
    started: float
    samples: int = 0
    rtt_sum: float = 0.0
    # The first few latencies, for a median one slow call cannot move.
    rtts: list[float] = field(default_factory=list)
    max_in_flight: int = 0
    # Of those, the most the IdP itself held (the rest: answers the caller had not read).
    max_at_idp: float = 0.0
    dropped: bool = False
    # Probe windows count only the calls sent within the probe's (halved) limit.
    probe_limit: int | None = None
    # Calls sent before this (the limit changed when the window opened) do not count.
    counts_from: float = -math.inf


class VegasLimit:
    def __init__(
        self, settings: VegasSettings = VegasSettings(), clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.settings = settings
        self._clock = clock
        self._limit = settings.initial
        now = clock()
        self._window = _Window(now)
        # (time, window mean) of recent windows; the lowest is the no-load latency.
        self._means: deque[tuple[float, float]] = deque()
        self._recent_rtt: float | None = None
        self._last_dropped = False
        self._probe_due = now  # the first window after start-up measures base

    @property
    def limit(self) -> int:
        """Calls that may be in flight now (at least 1)."""
        full = max(1, math.floor(self._limit))
        probe = self._window.probe_limit
        return full if probe is None else min(full, probe)

    @property
    def probing(self) -> bool:
        return self._window.probe_limit is not None

    @property
    def estimate(self) -> float:
        return self._limit

    @property
    def base_rtt(self) -> float | None:
        """The no-load latency the limit measures queueing against (None before data)."""
        return min(m for _, m in self._means) if self._means else None

    @property
    def recent_rtt(self) -> float | None:
        """The last window's mean latency: how long a call takes now."""
        return self._recent_rtt

    def sample(
        self,
        rtt: float,
        in_flight: int,
        dropped: bool = False,
        at_idp: float | None = None,
        held: float | None = None,
    ) -> None:
        """One finished call: its latency (s), the calls in flight when it started
        (itself included), and whether it failed or timed out. ``at_idp``: how many of
        those calls the IdP itself held (default all; fewer when the caller's own loop
        held their answers unread). ``held``: how long ago it was sent (default its
        latency)."""
        w = self._window
        now = self._clock()
        probing = w.probe_limit is not None
        sent = now - (rtt if held is None else held)
        # A failure counts whenever it was sent: backing off must not wait a round trip.
        current = dropped or sent >= w.counts_from
        if current and (not probing or (in_flight <= (w.probe_limit or 0) and not dropped)):
            w.samples += 1
            w.max_in_flight = max(w.max_in_flight, in_flight)
            w.max_at_idp = max(w.max_at_idp, in_flight if at_idp is None else at_idp)
            w.dropped = w.dropped or dropped
            if not dropped:
                w.rtt_sum += rtt
                if len(w.rtts) < _MEDIAN_OF:
                    w.rtts.append(rtt)
        age = now - w.started
        s = self.settings
        # A round trip's worth of calls at a small limit (else a limit of 4 on a 200 ms
        # IdP would wait three round trips per window).
        full = w.samples >= min(s.min_samples, self.limit) and age >= s.min_window
        if not (full or age >= s.max_window):
            return
        if probing:
            if w.samples:
                # The probe sets the baseline afresh: an IdP in a brownout often got
                # slower at any load, and its latency from before must not count as
                # "no load" for long (that would hold the limit far below capacity).
                self._means.clear()
                self._record_mean(w.rtt_sum / w.samples, now)
            self._probe_due = now + s.probe_interval
            # Back to the full limit: what the probe's calls saw says nothing of it.
            self._window = _Window(now, counts_from=now)
            return
        before = self.limit
        self._update(w, now)
        # A window that learnt nothing keeps waiting for calls sent under the new limit.
        unchanged_from = w.counts_from if not w.samples else -math.inf
        self._window = _Window(now, counts_from=now if self.limit != before else unchanged_from)
        if now >= self._probe_due:
            self._window.probe_limit = max(1, math.floor(self._limit / 4))
            self._window.counts_from = now

    def _record_mean(self, mean: float, now: float) -> None:
        self._recent_rtt = mean
        self._means.append((now, mean))
        while self._means and self._means[0][0] < now - self.settings.base_horizon:
            self._means.popleft()

    @property
    def healthy(self) -> bool:
        """Latency measured, and the last window had no failure or timeout: waiting for
        a slot is worth it (an IdP that fails or is not measured yet gets no queue)."""
        return self._recent_rtt is not None and not self._last_dropped

    def _update(self, w: _Window, now: float) -> None:
        s = self.settings
        self._last_dropped = w.dropped
        if w.dropped:
            self._limit = max(s.min_limit, self._limit * s.backoff)
            return
        if not w.samples:
            return
        mean = w.rtt_sum / w.samples
        measured_before = bool(self._means)
        self._record_mean(mean, now)
        if not measured_before:
            # The first window: its own mean is all the "no load" latency known, so it
            # cannot show a queue (growing on it took a start at 20 to 26 against an
            # IdP serving 4). The probe that follows measures the baseline.
            return
        base = self.base_rtt
        assert base is not None
        # Far fewer calls than the limit: the latency says nothing about the limit
        # (and growing it would let a later burst through unchecked).
        if w.max_in_flight * 2 < self._limit:
            return
        queue = w.max_in_flight * (1 - base / mean) if mean > 0 else 0.0
        if mean - base < s.negligible_delay:
            # Whatever waits costs the reviews nothing yet: never shrink for it. Grow
            # only as the estimate says (taking it for "nothing queues" grew the limit
            # by beta per window into a 20-call queue: queue-wait p99 335 ms).
            queue = min(queue, s.beta)
        if queue < s.alpha and w.max_at_idp * 2 < self._limit:
            # The slots are full but the IdP held few of them: the rest were answers
            # our own starved loop had not read. More slots would not reach the IdP
            # sooner, only burst into its queue once the loop catches up (measured: a
            # limit of 30 with the IdP idle, then a 20-call queue).
            return
        if queue < 1:
            # Nothing queues at the IdP: far from its capacity, grow as Vegas does.
            self._limit = min(s.max_limit, self._limit + s.beta)
        elif queue < s.alpha:
            self._limit = min(s.max_limit, self._limit + 1)
        elif queue > s.beta:
            # A long line even at the median call (not one slow call): shed the excess
            # in one step, at most half the limit. By one a round trip, a start at 20
            # against an IdP serving 4 held a 15-call queue for 3 s.
            median = statistics.median(w.rtts) if w.rtts else mean
            excess = w.max_in_flight * (1 - base / median) - s.beta if median > 0 else 0.0
            step = min(self._limit / 2, max(1.0, excess))
            self._limit = max(s.min_limit, self._limit - step)
