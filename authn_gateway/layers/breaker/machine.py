"""Circuit breaker per backend, in one process: the state machine of :mod:`.transitions`,
kept in a pybreaker ``CircuitBreaker`` through its public API.

pybreaker's own ways of feeding outcomes do not fit: ``@breaker`` on an ``async def``
records success when the coroutine object is *created*, its half-open state lets every
concurrent coroutine through as a probe, and ``CircuitBreaker.call`` moves by rules of
its own (any success closes a half-open breaker; a late normal failure re-opens it) that
differ from the table the fleet's scripts follow (docs/decisions.md). So:

1. :meth:`Breaker.admit` decides, without I/O, whether a call may go out (closed: yes;
   open: no until the probe time; then, and half-open, only while one of the K probe
   permits is free);
2. the caller awaits the backend;
3. :meth:`Breaker.record` applies the outcome's event (ok, fail, probe_ok, probe_fail)
   by :data:`.transitions.TABLE`.

pybreaker keeps the state (``open()``, ``half_open()``, ``close()``, ``current_state``)
and tells its listeners of each transition; its storage, held here, keeps the failure
count and ``opened_at``. Probe permits are behind :class:`ProbePermits`
(:mod:`.memory`); :mod:`.redis` is the fleet's version, :mod:`.layer` the layer.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any, Protocol

import pybreaker

from authn_gateway.layers.breaker.gate import BUSY, Ticket
from authn_gateway.layers.breaker.memory import LocalProbePermits, MemoryOverrides
from authn_gateway.layers.breaker.override import Overridden, Override, Overrides
from authn_gateway.layers.breaker.rates import FailureRate, SlowCalls
from authn_gateway.layers.breaker.transitions import CLOSED, HALF_OPEN, OPEN, Event, finished, step
from backends.base import Outcome, Unavailable

log = logging.getLogger(__name__)


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
_PROBE = Ticket(permit="probe?")  # internal: a probe may go if a permit is free


class Breaker(Overridden):
    def __init__(
        self,
        name: str,
        fail_max: int,
        reset_timeout: float,
        probes: ProbePermits,
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
        #: The failure count and opened_at (pybreaker's storage interface, public).
        self.storage = pybreaker.CircuitMemoryStorage(CLOSED)
        self._cb = pybreaker.CircuitBreaker(
            fail_max=fail_max,
            reset_timeout=reset_timeout,
            state_storage=self.storage,
            listeners=[_TransitionListener(self._transition)],
            name=name,
        )
        self._moves: dict[str, Callable[[], Any]] = {
            OPEN: self._cb.open,
            HALF_OPEN: self._cb.half_open,
            CLOSED: self._cb.close,
        }

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

    def _apply(self, event: Event, trip_opened_at: float = 0.0) -> None:
        """Move by :data:`.transitions.TABLE`, through pybreaker's public API."""
        state, failures = self._cb.current_state, self.storage.counter
        opened = self.storage.opened_at
        before = opened.timestamp() if opened is not None else 0.0
        after = step(
            state,
            event,
            failures,
            before,
            now=time.time(),
            fail_max=self._cb.fail_max,
            trip_opened_at=trip_opened_at,
        )
        if after.failures == 0 and failures != 0:
            self.storage.reset_counter()
        elif after.failures == failures + 1:
            self.storage.increment_counter()
        if after.state != state:
            self._moves[after.state]()  # pybreaker's listeners hear of it
        if after.state == OPEN and (state != OPEN or after.opened_at != before):
            # open() stamped "now"; the table may have said a trip's time.
            self.storage.opened_at = datetime.fromtimestamp(after.opened_at, UTC)

    @property
    def machine_state(self) -> str:
        state: str = self._cb.current_state
        return state

    @property
    def failures(self) -> int:
        """Consecutive failures counted while closed."""
        count: int = self.storage.counter
        return count

    async def admit(self) -> Ticket | None:
        """A ticket if a call may go to the backend now, :data:`BUSY` if too many are
        in flight, else None (fail fast)."""
        wanted = self._wanted()
        if wanted is _PROBE:
            return self._probe(await self._probes.try_acquire())
        return self._with_slot(wanted)

    def admit_now(self) -> Ticket | None:
        """:meth:`admit` for in-process probe permits (no I/O)."""
        wanted = self._wanted()
        if wanted is _PROBE:
            assert isinstance(self._probes, LocalProbePermits)
            return self._probe(self._probes.acquire_now())
        return self._with_slot(wanted)

    def fails_fast(self) -> bool:
        override = self.override
        if override is not Override.NONE:
            return override is Override.FORCED_OPEN
        return self._cb.current_state == OPEN and self.seconds_until_probe() > 0

    def _wanted(self) -> Ticket | None:
        override = self.override
        if override is Override.FORCED_OPEN:
            return None
        if override is Override.FORCED_CLOSED:
            return _NORMAL
        state = self._cb.current_state
        if state == CLOSED:
            return _NORMAL
        if state == OPEN and self.seconds_until_probe() > 0:
            return None
        return _PROBE

    def _probe(self, permit: str | None) -> Ticket | None:
        """A probe's ticket, once it has a permit and a slot: only then is it ``due``
        (open moves to half-open), as in admit.lua."""
        if permit is None:
            return None
        ticket = self._with_slot(Ticket(permit))
        if ticket is not BUSY:
            self._apply(Event.DUE)
        return ticket

    def _with_slot(self, ticket: Ticket | None) -> Ticket | None:
        if ticket is None or self.slots is None or self.override is Override.FORCED_CLOSED:
            return ticket
        if not self.slots.take():
            if ticket.permit is not None:
                self._probes.release(ticket.permit)
            return BUSY
        return Ticket(ticket.permit, slot=True)

    def seconds_until_probe(self) -> float:
        """While open: seconds until a probe may go out (0 when it may now)."""
        opened_at = self.storage.opened_at
        if self._cb.current_state != OPEN or opened_at is None:
            return 0.0
        return max(0.0, opened_at.timestamp() + self._cb.reset_timeout - time.time())

    def release(self, ticket: Ticket) -> None:
        """Give back a ticket whose call was never made."""
        if ticket.slot and self.slots is not None:
            self.slots.give_back()
        if ticket.permit is not None:
            self._probes.release(ticket.permit)
        self._apply(Event.RELEASE)

    def record(self, ticket: Ticket, outcome: Outcome, seconds: float | None = None) -> None:
        """Feed one finished call's outcome (and how long it took) to the state machine."""
        if ticket.slot and self.slots is not None:
            self.slots.give_back()
        if ticket.permit is not None:
            self._probes.spent(ticket.permit)
        if self.override is not Override.NONE:
            return
        # A rejected token is a healthy answer from the IdP.
        failed = isinstance(outcome, Unavailable)
        self._apply(finished(probe=ticket.permit is not None, failed=failed))
        # A probe is judged by its answer, slow or not: a restarted IdP's first answer is
        # often slow (the real Keystone in tests/process/test_keystone.py), and with one probe a
        # slow-probe rule would keep it open. Slowness is judged over the closed window.
        rate, slow = self._failure_rate, self._slow_calls
        if rate is not None and rate.add(failed) and self._cb.current_state == CLOSED:
            log.warning("breaker %s: failure rate over its window reached the threshold", self.name)
            rate.clear()  # the next closed period starts a fresh window
            self._trip(self._cb.reset_timeout)
        if (
            slow is not None
            and seconds is not None
            and slow.add(seconds)
            and self._cb.current_state == CLOSED
        ):
            log.warning("breaker %s: slow calls over its window reached the threshold", self.name)
            slow.clear()
            self._trip(self._cb.reset_timeout)

    def _trip(self, seconds: float) -> None:
        """The table's ``trip``: open, the next probe in ``seconds``, unless already
        open with a later one."""
        self._apply(Event.TRIP, time.time() + seconds - self._cb.reset_timeout)

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
        self._trip(seconds)

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
