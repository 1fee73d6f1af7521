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

import logging
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any, Protocol

import pybreaker

from backends.base import Outcome, Unavailable

from .gate import BUSY, Ticket
from .memory import LocalProbePermits, MemoryOverrides
from .override import Overridden, Override, Overrides
from .rates import FailureRate, SlowCalls

log = logging.getLogger(__name__)

CLOSED, OPEN, HALF_OPEN = pybreaker.STATE_CLOSED, pybreaker.STATE_OPEN, pybreaker.STATE_HALF_OPEN
STATES = (CLOSED, OPEN, HALF_OPEN, "forced_open", "forced_closed")


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


class _Unhealthy(Exception):
    """The outcome fed into pybreaker for an unavailable backend."""


class _TransitionListener(pybreaker.CircuitBreakerListener):  # type: ignore[misc]
    def __init__(self, notify: Callable[[str, str], None]) -> None:
        self._notify = notify

    def state_change(self, cb: Any, old_state: Any, new_state: Any) -> None:
        self._notify(old_state.name if old_state is not None else "none", new_state.name)


class LocalSlots:
    """The ceiling on calls in flight from this process."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.in_flight = 0

    def take(self) -> bool:
        if self.in_flight >= self.limit:
            return False
        self.in_flight += 1
        return True

    def give_back(self) -> None:
        self.in_flight = max(0, self.in_flight - 1)


_NORMAL = Ticket(permit=None)
_PROBE = Ticket(permit="probe?")  # internal: half-open, a probe permit is needed


class Breaker(Overridden):
    def __init__(
        self,
        name: str,
        fail_max: int,
        reset_timeout: float,
        probes: ProbePermits,
        storage: pybreaker.CircuitBreakerStorage | None = None,
        on_transition: Callable[[str, str, str], None] | None = None,
        failure_rate: FailureRate | None = None,
        max_hold: float = 300.0,
        slow_calls: SlowCalls | None = None,
        max_in_flight: int | None = None,
        overrides: Overrides | None = None,
    ) -> None:
        self.name = name
        self._max_hold = max_hold
        self._probes = probes
        self.slots = LocalSlots(max_in_flight) if max_in_flight is not None else None
        self._failure_rate = failure_rate
        self._slow_calls = slow_calls
        self._on_transition = on_transition
        # Kept apart from the state machine (override.py): a reload keeps the board.
        self.overrides = overrides if overrides is not None else MemoryOverrides()
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

    def reshare(self, fail_max: int, max_in_flight: int | None) -> None:
        """Run on a new part of the fleet's bounds (a fleet replica while Redis is down,
        when the fleet's size changed): failures to open, and slots if it has them."""
        self._cb.fail_max = fail_max
        if self.slots is not None and max_in_flight is not None:
            self.slots.limit = max_in_flight

    def _transition(self, old: str, new: str) -> None:
        log.warning("breaker %s: %s -> %s", self.name, old, new)
        if new == CLOSED:
            # A closed period starts fresh windows, as resilience4j resets its metrics on
            # each transition: the calls that opened it must not open it again at once.
            for window in (self._failure_rate, self._slow_calls):
                if window is not None:
                    window.clear()
        if self._on_transition is not None:
            self._on_transition(self.name, old, new)

    @property
    def machine_state(self) -> str:
        state: str = self._cb.current_state
        return state

    def refresh(self) -> str:
        """Pick up a state another replica wrote to shared storage (fires transitions)."""
        return str(self._cb.state.name)

    async def admit(self) -> Ticket | None:
        """A ticket if a call may go to the backend now, :data:`BUSY` if too many are
        in flight, else None (fail fast)."""
        decided = self._decide()
        if decided is _PROBE:
            permit = await self._probes.try_acquire()
            decided = Ticket(permit) if permit is not None else None
        return self._with_slot(decided)

    def fails_fast(self) -> bool:
        override = self.override
        if override is not Override.NONE:
            return override is Override.FORCED_OPEN
        return self._cb.current_state == OPEN and self.seconds_until_probe() > 0

    def admit_now(self) -> Ticket | None:
        """:meth:`admit` for in-process probe permits (no I/O)."""
        decided = self._decide()
        if decided is _PROBE:
            assert isinstance(self._probes, LocalProbePermits)
            permit = self._probes.acquire_now()
            decided = Ticket(permit) if permit is not None else None
        return self._with_slot(decided)

    def _with_slot(self, ticket: Ticket | None) -> Ticket | None:
        if ticket is None or self.slots is None or self.override is Override.FORCED_CLOSED:
            return ticket
        if not self.slots.take():
            if ticket.permit is not None:
                self._probes.release(ticket.permit)
            return BUSY
        return Ticket(ticket.permit, slot=True)

    def _decide(self) -> Ticket | None:
        override = self.override
        if override is Override.FORCED_OPEN:
            return None
        if override is Override.FORCED_CLOSED:
            return _NORMAL
        state = self.refresh()
        if state == CLOSED:
            return _NORMAL
        if state == OPEN:
            if self.seconds_until_probe() > 0:
                return None
            self._cb.half_open()
        return _PROBE

    def seconds_until_probe(self) -> float:
        """While open: seconds until a probe may go out (0 when it may now)."""
        opened_at = self._cb._state_storage.opened_at
        if self._cb.current_state != OPEN or opened_at is None:
            return 0.0
        until = opened_at + timedelta(seconds=self._cb.reset_timeout) - datetime.now(UTC)
        return max(0.0, until.total_seconds())

    def release(self, ticket: Ticket) -> None:
        """Give back a ticket whose call was never made."""
        if ticket.slot and self.slots is not None:
            self.slots.give_back()
        if ticket.permit is not None:
            self._probes.release(ticket.permit)

    def record(self, ticket: Ticket, outcome: Outcome, seconds: float | None = None) -> None:
        """Feed one finished call's outcome (and how long it took) to the state machine."""
        if ticket.slot and self.slots is not None:
            self.slots.give_back()
        if ticket.permit is not None:
            self._probes.spent(ticket.permit)
        if self.override is not Override.NONE:
            return
        failed = isinstance(outcome, Unavailable)
        # A probe is judged by its answer, slow or not: a restarted IdP's first answer is
        # often slow (the real Keystone in tests/test_keystone.py), and with one probe a
        # slow-probe rule would keep it open. Slowness is judged over the closed window.
        slow = self._slow_calls
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
        if (
            slow is not None
            and seconds is not None
            and slow.add(seconds)
            and self._cb.current_state == CLOSED
        ):
            log.warning("breaker %s: slow calls over its window reached the threshold", self.name)
            slow.clear()
            self._cb.open()

    @property
    def max_hold(self) -> float:
        """The longest a Retry-After may hold this breaker open."""
        return self._max_hold

    @property
    def slow_threshold(self) -> float | None:
        """Seconds from which a call counts as slow (None: the rule is off)."""
        return self._slow_calls.threshold if self._slow_calls is not None else None

    def hold_open(self, seconds: float) -> None:
        """Stay open for ``seconds`` (the IdP sent Retry-After), then probe as usual.

        At most ``max_hold`` seconds (breaker.max_retry_after_seconds): one answer, from
        the IdP or whatever sits in front of it, must not shut a backend for years.
        """
        if seconds > self._max_hold:
            log.warning(
                "breaker %s: IdP asked for %.0fs; holding open for max_retry_after_seconds (%gs)",
                self.name,
                seconds,
                self._max_hold,
            )
            seconds = self._max_hold
        if self._cb.current_state != OPEN:
            self._cb.open()
        # opened_at is set so that opened_at + reset_timeout is the time the IdP asked for.
        self._cb._state_storage.opened_at = datetime.now(UTC) + timedelta(
            seconds=seconds - self._cb.reset_timeout
        )

    def force(self, override: Override, seconds: float = 3600.0) -> None:
        """Set an override in this process (tests, and the board's memory version)."""
        assert isinstance(self.overrides, MemoryOverrides)
        previous = self.state
        self.overrides.set_now(self.name, override, seconds)
        # Released: back to the machine's own state, which an override never changes.
        log.warning(
            "breaker %s: operator override %s (was %s)", self.name, override.value, previous
        )
        if self._on_transition is not None:
            self._on_transition(self.name, previous, self.state)


def _healthy() -> None:
    return None


def _raise_unhealthy() -> None:
    raise _Unhealthy
