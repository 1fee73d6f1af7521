"""The breaker's fleet state: one state machine in Redis, a local mirror for failing fast.

Every call to the IdP is admitted by one Lua script (``admit.lua``) that
checks the fleet's breaker state and takes one of ``max_in_flight`` fleet-wide slots
(or, half-open, one of K probe permits), and settled by another
(``settle.lua``) that frees the slot and counts the outcome: consecutive
failures fleet-wide, opening at ``fail_max``, and publishing every transition. So,
whatever the replica count:

* calls that reach the IdP during an outage before the breaker opens: at most
  ``fail_max`` (the counted failures) + ``max_in_flight`` (in flight when it opened);
* after that, K probes per ``reset_timeout``.

A replica learns of a transition from the published message (and, if one is lost,
from the settle/admit answers and the periodic sync, :mod:`.redis_sync`), and from then
fails fast from its mirror without a Redis call. A cache hit never gets here.

While Redis is down (:class:`RedisLink` in local mode) the replica uses its own
in-memory :class:`Breaker`, built with ``ceil(max_in_flight / expected_replicas)``
slots. Operator overrides are read from the board (:mod:`.redis_overrides`).
"""

from __future__ import annotations

import contextlib
import logging
import secrets
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from authn_gateway.fleet.redis_link import RedisDown, RedisLink, lua_script
from authn_gateway.layers.breaker.gate import BUSY, Ticket
from authn_gateway.layers.breaker.machine import Breaker
from authn_gateway.layers.breaker.override import Overridden, Override, Overrides
from authn_gateway.layers.breaker.rates import FailureRate, SlowCalls
from authn_gateway.layers.breaker.transitions import CLOSED, HALF_OPEN, OPEN, Event, lua_rows, step
from backends.base import Outcome, Unavailable
from backends.durations import whole_ms

log = logging.getLogger(__name__)

# The state machine's table and step (transitions.py, transitions.lua), in front of
# each script that moves the state.
TRANSITIONS = lua_rows() + lua_script(__package__, "transitions.lua")
ADMIT = TRANSITIONS + lua_script(__package__, "admit.lua")
SETTLE = TRANSITIONS + lua_script(__package__, "settle.lua")
HOLD = TRANSITIONS + lua_script(__package__, "hold.lua")


class FleetTicket(Ticket):
    __slots__ = ("member", "probe")

    def __init__(self, member: str, probe: bool) -> None:
        super().__init__(permit=None)
        self.member = member
        self.probe = probe


@dataclass(frozen=True)
class FleetKeys:
    """One backend's keys, in one hash slot (``{...}``) so scripts run on Redis Cluster."""

    state: str
    in_flight: str
    probes: str
    failures: str
    override: str

    @classmethod
    def of(cls, link: RedisLink, backend: str) -> FleetKeys:
        tag = "{" + link.key("breaker", backend) + "}"
        return cls(tag, f"{tag}:in-flight", f"{tag}:probes", f"{tag}:failures", f"{tag}:override")


class FleetBreaker(Overridden):
    """The :class:`Breaker` interface over the fleet's state in Redis."""

    def __init__(
        self,
        name: str,
        fail_max: int,
        reset_timeout: float,
        probes: int,
        max_in_flight: int,
        slot_ttl: float,
        link: RedisLink,
        local: Breaker,
        spawn: Callable[[Awaitable[Any]], None],
        overrides: Overrides,
        on_transition: Callable[[str, str, str], None] | None = None,
        failure_rate: FailureRate | None = None,
        slow_calls: SlowCalls | None = None,
    ) -> None:
        self.name = name
        self.keys = FleetKeys.of(link, name)
        self.channel = link.key("breaker-events")
        self._fail_max = fail_max
        self._reset_timeout = reset_timeout
        self._probes = probes
        self._max_in_flight = max_in_flight
        self._slot_ttl_ms = whole_ms(slot_ttl)
        self._link = link
        self._local = local
        self._spawn = spawn
        self._on_transition = on_transition
        self._failure_rate = failure_rate
        self._slow_calls = slow_calls
        self.overrides = overrides
        # The fleet's state as last seen (Unix time for opened_at, as in Redis).
        self._mirror = CLOSED
        self._opened_at = 0.0

    # ---- state -------------------------------------------------------------------
    @property
    def machine_state(self) -> str:
        return self._mirror if self._link.shared else self._local.machine_state

    def adopt(self, state: str, opened_at: float) -> None:
        """Take the fleet's state (from a script's answer, a message or the sync)."""
        if state not in (CLOSED, OPEN, HALF_OPEN):
            return
        self._opened_at = opened_at
        old, self._mirror = self._mirror, state
        if old != state:
            log.warning("breaker %s: %s -> %s (fleet)", self.name, old, state)
            if self._on_transition is not None:
                self._on_transition(self.name, old, state)

    def _adopt_reply(self, reply: list[Any]) -> None:
        self.adopt(decoded(reply[-2]), float(decoded(reply[-1])))

    # ---- calls -------------------------------------------------------------------
    async def admit(self) -> Ticket | None:
        override = self.override
        if override is Override.FORCED_OPEN:
            return None
        if override is Override.FORCED_CLOSED:
            return Ticket(permit=None)
        if not self._link.shared:
            return self._admit_locally()
        if self._mirror == OPEN and time.time() < self._opened_at + self._reset_timeout:
            return None  # known open: fail fast, no Redis call
        member = secrets.token_hex(8)
        try:
            reply = await self._link.script(
                "breaker_admit",
                ADMIT,
                [self.keys.state, self.keys.in_flight, self.keys.probes, self.keys.failures],
                [
                    self._max_in_flight,
                    self._slot_ttl_ms,
                    member,
                    self._reset_timeout,
                    self._probes,
                    self._fail_max,
                ],
            )
        except RedisDown:
            return self._admit_locally()
        self._adopt_reply(reply)
        verdict = decoded(reply[0])
        if verdict in ("ok", "probe"):
            return FleetTicket(member, probe=verdict == "probe")
        return BUSY if verdict == "busy" else None

    def fails_fast(self) -> bool:
        override = self.override
        if override is not Override.NONE:
            return override is Override.FORCED_OPEN
        if not self._link.shared:
            return self._local.fails_fast()
        return self._mirror == OPEN and time.time() < self._opened_at + self._reset_timeout

    def _admit_locally(self) -> Ticket | None:
        return self._local.admit_now()

    def release(self, ticket: Ticket) -> None:
        """The call was never made (the bucket refused it)."""
        self._settle(ticket, None)

    @property
    def slow_threshold(self) -> float | None:
        return self._slow_calls.threshold if self._slow_calls is not None else None

    def record(self, ticket: Ticket, outcome: Outcome, seconds: float | None = None) -> None:
        self._settle(ticket, outcome, seconds)
        if isinstance(ticket, FleetTicket) and ticket.probe:
            return  # a probe is judged by its answer, slow or not (as in Breaker.record)
        rate, slow = self._failure_rate, self._slow_calls
        tripped = rate is not None and rate.add(isinstance(outcome, Unavailable))
        if slow is not None and seconds is not None and slow.add(seconds):
            tripped = True
        if tripped and self.state == CLOSED:
            log.warning("breaker %s: a rate over its window reached the threshold", self.name)
            for window in (rate, slow):
                if window is not None:
                    window.clear()
            self.hold_open(self._reset_timeout)

    def _settle(
        self, ticket: Ticket, outcome: Outcome | None, seconds: float | None = None
    ) -> None:
        if not isinstance(ticket, FleetTicket):
            # Admitted by the local breaker while Redis was down (or forced closed).
            if outcome is None:
                self._local.release(ticket)
            else:
                self._local.record(ticket, outcome, seconds)
            return
        verdict = (
            "none" if outcome is None else "fail" if isinstance(outcome, Unavailable) else "ok"
        )
        self._spawn(self._settle_remote(ticket, verdict))

    async def _settle_remote(self, ticket: FleetTicket, verdict: str) -> None:
        # If Redis is down the slot and permit expire on their own; the outcome is lost
        # to the fleet count but recorded locally.
        with contextlib.suppress(RedisDown):
            reply = await self._link.script(
                "breaker_settle",
                SETTLE,
                [self.keys.state, self.keys.in_flight, self.keys.probes, self.keys.failures],
                [
                    ticket.member,
                    verdict,
                    self._fail_max,
                    int(ticket.probe),
                    self.channel,
                    self.name,
                ],
            )
            self._adopt_reply(reply)

    @property
    def max_hold(self) -> float:
        return self._local.max_hold

    def hold_open(self, seconds: float) -> None:
        """Open fleet-wide for ``seconds`` (Retry-After), then probe as usual."""
        seconds = min(seconds, self.max_hold)  # breaker.max_retry_after_seconds
        self._local.hold_open(seconds)
        if self._link.shared:
            # The mirror takes the same step at once, so this replica fails fast before
            # the script answers (and the answer then sets it).
            now = time.time()
            held = step(
                self._mirror,
                Event.TRIP,
                0,
                self._opened_at,
                now=now,
                fail_max=self._fail_max,
                trip_opened_at=now + seconds - self._reset_timeout,
            )
            self.adopt(held.state, held.opened_at)
            self._spawn(self._hold_remote(seconds))

    async def _hold_remote(self, seconds: float) -> None:
        with contextlib.suppress(RedisDown):
            reply = await self._link.script(
                "breaker_hold",
                HOLD,
                [self.keys.state, self.keys.failures],
                [seconds, self._reset_timeout, self.channel, self.name, self._fail_max],
            )
            self._adopt_reply(reply)

    def resumed(self) -> None:
        """Redis answers again: a breaker that opened locally meanwhile opens the fleet's."""
        if self._local.state == OPEN:
            remaining = self._local.seconds_until_probe()
            self._spawn(self._hold_remote(max(remaining, 0.0) + self._reset_timeout))


def decoded(value: Any) -> str:
    """A Redis reply's bytes (or a number) as text."""
    return value.decode() if isinstance(value, bytes) else str(value)
