"""The breaker's rate rules over a sliding window: the share of calls that failed
(:class:`FailureRate`) and resilience4j's slow-call rule (:class:`SlowCalls`). Either one
trips the breaker while closed, beside the consecutive-failure count of its state machine."""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable


class FailureRate:
    """Share of unavailable answers among the calls of the last ``window`` seconds."""

    def __init__(
        self,
        threshold: float,
        window: float,
        min_calls: int,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._threshold = threshold
        self._window = window
        self._min_calls = min_calls
        self._clock = clock
        self._calls: deque[tuple[float, bool]] = deque()
        self._failures = 0

    def add(self, failed: bool) -> bool:
        """Record one call; True when the window's failure share has reached the threshold."""
        now = self._clock()
        self._calls.append((now, failed))
        self._failures += failed
        horizon = now - self._window
        while self._calls and self._calls[0][0] < horizon:
            self._failures -= self._calls.popleft()[1]
        calls = len(self._calls)
        return calls >= self._min_calls and self._failures >= self._threshold * calls

    def clear(self) -> None:
        self._calls.clear()
        self._failures = 0


class SlowCalls:
    """resilience4j's slow-call rule: the share of calls that took ``threshold`` s or more."""

    def __init__(self, threshold: float, rate: FailureRate) -> None:
        self.threshold = threshold
        self._rate = rate

    def is_slow(self, seconds: float) -> bool:
        return seconds >= self.threshold

    def add(self, seconds: float) -> bool:
        """Record one call; True when the window's slow share has reached the rate."""
        return self._rate.add(self.is_slow(seconds))

    def clear(self) -> None:
        self._rate.clear()
