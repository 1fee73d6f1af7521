"""Circuit breaker per backend: pybreaker's state machine, driven correctly from asyncio.

Why not ``@breaker`` on an ``async def``: pybreaker would record success when the
coroutine object is *created*, not when it finishes, and its half-open state lets
every concurrent coroutine through as a probe. So the I/O happens outside pybreaker:

1. :meth:`Breaker.admit` decides, without I/O, whether a call may go out
   (closed: yes; open: no until ``reset_timeout``; half-open: only while one of the
   K probe permits is free);
2. the caller awaits the backend;
3. :meth:`Breaker.record` feeds the outcome back through ``CircuitBreaker.call``
   with a synchronous thunk, so pybreaker's own counting and transitions apply.

State lives in a pybreaker ``CircuitBreakerStorage``; probe permits behind
:class:`ProbePermits`. Both have in-memory versions in :mod:`.memory` and shared
versions in :mod:`.redis`; :mod:`.layer` wraps an authenticator with a breaker.
"""

from __future__ import annotations

import enum
import logging
import time
from collections import deque
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any, Protocol

import pybreaker

from backends.base import Outcome, Unavailable

log = logging.getLogger(__name__)

CLOSED, OPEN, HALF_OPEN = pybreaker.STATE_CLOSED, pybreaker.STATE_OPEN, pybreaker.STATE_HALF_OPEN
STATES = (CLOSED, OPEN, HALF_OPEN, "forced_open", "forced_closed")


class Override(enum.Enum):
    """Operator overrides, like resilience4j's FORCED_OPEN and DISABLED."""

    NONE = "none"
    FORCED_OPEN = "forced_open"
    FORCED_CLOSED = "forced_closed"


class ProbePermits(Protocol):
    """At most K calls may be in flight while half-open (per process, or fleet-wide)."""

    async def try_acquire(self) -> str | None:
        """A permit id, or None when all K are taken."""
        ...

    def release(self, permit: str) -> None:
        """The probe was not made after all (for example the bucket refused it)."""
        ...

    def spent(self, permit: str) -> None:
        """The probe was made and its outcome recorded."""
        ...


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


class _Unhealthy(Exception):
    """The outcome fed into pybreaker for an unavailable backend."""


class _TransitionListener(pybreaker.CircuitBreakerListener):  # type: ignore[misc]
    def __init__(self, notify: Callable[[str, str], None]) -> None:
        self._notify = notify

    def state_change(self, cb: Any, old_state: Any, new_state: Any) -> None:
        self._notify(old_state.name if old_state is not None else "none", new_state.name)


class Admission:
    """A ticket for one call; probe calls hold a half-open permit."""

    __slots__ = ("permit",)

    def __init__(self, permit: str | None) -> None:
        self.permit = permit


_NORMAL = Admission(permit=None)


class Breaker:
    def __init__(
        self,
        name: str,
        fail_max: int,
        reset_timeout: float,
        probes: ProbePermits,
        storage: pybreaker.CircuitBreakerStorage | None = None,
        on_transition: Callable[[str, str, str], None] | None = None,
        failure_rate: FailureRate | None = None,
    ) -> None:
        self.name = name
        self._probes = probes
        self._failure_rate = failure_rate
        self._on_transition = on_transition
        self.override = Override.NONE
        self._cb = pybreaker.CircuitBreaker(
            fail_max=fail_max,
            reset_timeout=reset_timeout,
            # One healthy probe closes the breaker.
            success_threshold=1,
            state_storage=storage or pybreaker.CircuitMemoryStorage(CLOSED),
            listeners=[_TransitionListener(self._transition)],
            name=name,
            throw_new_error_on_trip=False,
        )

    def _transition(self, old: str, new: str) -> None:
        log.warning("breaker %s: %s -> %s", self.name, old, new)
        if self._on_transition is not None:
            self._on_transition(self.name, old, new)

    @property
    def state(self) -> str:
        """closed, open, half-open, forced_open or forced_closed."""
        if self.override is not Override.NONE:
            return str(self.override.value)
        state: str = self._cb.current_state
        return state

    def refresh(self) -> str:
        """Pick up a state another replica wrote to shared storage (fires transitions)."""
        return str(self._cb.state.name)

    async def admit(self) -> Admission | None:
        """A ticket if a call may go to the backend now, else None (fail fast)."""
        if self.override is Override.FORCED_OPEN:
            return None
        if self.override is Override.FORCED_CLOSED:
            return _NORMAL
        state = self.refresh()
        if state == CLOSED:
            return _NORMAL
        if state == OPEN:
            opened_at = self._cb._state_storage.opened_at
            timeout = timedelta(seconds=self._cb.reset_timeout)
            if opened_at is not None and datetime.now(UTC) < opened_at + timeout:
                return None
            self._cb.half_open()
        permit = await self._probes.try_acquire()
        return Admission(permit) if permit is not None else None

    def release(self, ticket: Admission) -> None:
        """Give back a ticket whose call was never made."""
        if ticket.permit is not None:
            self._probes.release(ticket.permit)

    def record(self, ticket: Admission, outcome: Outcome) -> None:
        """Feed one finished call's outcome to the state machine."""
        if ticket.permit is not None:
            self._probes.spent(ticket.permit)
        if self.override is not Override.NONE:
            return
        failed = isinstance(outcome, Unavailable)
        try:
            if failed:
                self._cb.call(_raise_unhealthy)
            else:
                # A rejected token is a healthy answer from the IdP.
                self._cb.call(_healthy)
        except (_Unhealthy, pybreaker.CircuitBreakerError):
            # Either the failure we fed in, or the breaker opened meanwhile (a call that
            # started before the trip finished after it): nothing more to record.
            pass
        rate = self._failure_rate
        if rate is not None and rate.add(failed) and self._cb.current_state == CLOSED:
            log.warning("breaker %s: failure rate over its window reached the threshold", self.name)
            rate.clear()  # the next closed period starts a fresh window
            self._cb.open()

    def hold_open(self, seconds: float) -> None:
        """Stay open for ``seconds`` (the IdP sent Retry-After), then probe as usual."""
        if self._cb.current_state != OPEN:
            self._cb.open()
        # opened_at is set so that opened_at + reset_timeout is the time the IdP asked for.
        self._cb._state_storage.opened_at = datetime.now(UTC) + timedelta(
            seconds=seconds - self._cb.reset_timeout
        )

    def force(self, override: Override) -> None:
        previous = self.state
        self.override = override
        if override is Override.NONE:
            # Released: start again from closed, with a clean failure count.
            self._cb.close()
        log.warning(
            "breaker %s: operator override %s (was %s)", self.name, override.value, previous
        )
        if self._on_transition is not None:
            self._on_transition(self.name, previous, self.state)


def _healthy() -> None:
    return None


def _raise_unhealthy() -> None:
    raise _Unhealthy
