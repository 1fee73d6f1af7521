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
from the settle/admit answers and the periodic sync), and from then fails fast from
its mirror without a Redis call. A cache hit never gets here.

While Redis is down (:class:`RedisLink` in local mode) the replica uses its own
in-memory :class:`Breaker`, built with ``ceil(max_in_flight / expected_replicas)``
slots.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import secrets
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from backends.base import Outcome, Unavailable

from ..redis_link import RedisDown, RedisLink, lua_script
from .machine import (
    BUSY,
    CLOSED,
    HALF_OPEN,
    OPEN,
    Admission,
    Breaker,
    FailureRate,
    Override,
    SlowCalls,
)

log = logging.getLogger(__name__)

ADMIT = lua_script(__package__, "admit.lua")
SETTLE = lua_script(__package__, "settle.lua")
HOLD = lua_script(__package__, "hold.lua")


class FleetTicket(Admission):
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

    @classmethod
    def of(cls, link: RedisLink, backend: str) -> FleetKeys:
        tag = "{" + link.key("breaker", backend) + "}"
        return cls(tag, f"{tag}:in-flight", f"{tag}:probes", f"{tag}:failures")


class FleetBreaker:
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
        self._slot_ttl_ms = int(slot_ttl * 1000)
        self._link = link
        self._local = local
        self._spawn = spawn
        self._on_transition = on_transition
        self._failure_rate = failure_rate
        self._slow_calls = slow_calls
        self.override = Override.NONE
        # The fleet's state as last seen (Unix time for opened_at, as in Redis).
        self._mirror = CLOSED
        self._opened_at = 0.0

    # ---- state -------------------------------------------------------------------
    @property
    def state(self) -> str:
        if self.override is not Override.NONE:
            return str(self.override.value)
        return self._mirror if self._link.shared else self._local.state

    def refresh(self) -> str:
        return self.state

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
        self.adopt(_text(reply[-2]), float(_text(reply[-1])))

    # ---- calls -------------------------------------------------------------------
    async def admit(self) -> Admission | None:
        if self.override is Override.FORCED_OPEN:
            return None
        if self.override is Override.FORCED_CLOSED:
            return Admission(permit=None)
        if not self._link.shared:
            return self._admit_locally()
        if self._mirror == OPEN and time.time() < self._opened_at + self._reset_timeout:
            return None  # known open: fail fast, no Redis call
        member = secrets.token_hex(8)
        try:
            reply = await self._link.script(
                "breaker_admit",
                ADMIT,
                [self.keys.state, self.keys.in_flight, self.keys.probes],
                [self._max_in_flight, self._slot_ttl_ms, member, self._reset_timeout, self._probes],
            )
        except RedisDown:
            return self._admit_locally()
        self._adopt_reply(reply)
        verdict = _text(reply[0])
        if verdict in ("ok", "probe"):
            return FleetTicket(member, probe=verdict == "probe")
        return BUSY if verdict == "busy" else None

    def _admit_locally(self) -> Admission | None:
        return self._local.admit_now()

    def release(self, ticket: Admission) -> None:
        """The call was never made (the bucket refused it)."""
        self._settle(ticket, None)

    @property
    def slow_threshold(self) -> float | None:
        return self._slow_calls.threshold if self._slow_calls is not None else None

    def record(self, ticket: Admission, outcome: Outcome, seconds: float | None = None) -> None:
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
        self, ticket: Admission, outcome: Outcome | None, seconds: float | None = None
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
            self.adopt(OPEN, time.time() + seconds - self._reset_timeout)
            self._spawn(self._hold_remote(seconds))

    async def _hold_remote(self, seconds: float) -> None:
        with contextlib.suppress(RedisDown):
            reply = await self._link.script(
                "breaker_hold",
                HOLD,
                [self.keys.state, self.keys.failures],
                [seconds, self._reset_timeout, self.channel, self.name],
            )
            self._adopt_reply(reply)

    def force(self, override: Override) -> None:
        previous = self.state
        self.override = override
        self._local.force(override)
        log.warning(
            "breaker %s: operator override %s (was %s)", self.name, override.value, previous
        )
        if self._on_transition is not None:
            self._on_transition(self.name, previous, self.state)

    def resumed(self) -> None:
        """Redis answers again: a breaker that opened locally meanwhile opens the fleet's."""
        if self._local.state == OPEN:
            remaining = self._local.seconds_until_probe()
            self._spawn(self._hold_remote(max(remaining, 0.0) + self._reset_timeout))


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


async def listen(
    link: RedisLink,
    channel: str,
    breakers: dict[str, FleetBreaker],
    observe_delay: Callable[[float], None],
    retry_seconds: float,
) -> None:
    """Adopt published transitions as they come (one subscriber connection per replica)."""
    while True:
        try:
            pubsub = link.client.pubsub()
            await pubsub.subscribe(channel)
            async for message in pubsub.listen():
                if message.get("type") != "message":
                    continue
                fields = _text(message["data"]).split(" ")
                if len(fields) != 4 or fields[0] not in breakers:
                    continue
                backend, state, opened_at, published = fields
                observe_delay(max(0.0, time.time() - float(published)))
                breakers[backend].adopt(state, float(opened_at))
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # any failure: reconnect after a pause
            log.debug("breaker events: subscriber lost (%s); retrying", type(exc).__name__)
            await asyncio.sleep(retry_seconds)


class BreakerSync:
    """The fleet breakers of one replica: the subscriber that adopts published
    transitions, and a slow poll as the safety net for a message lost while the
    subscriber reconnected."""

    def __init__(
        self,
        link: RedisLink,
        period: float,
        retry_seconds: float,
        observe_delay: Callable[[float], None],
    ) -> None:
        self._link = link
        self._period = period
        self._retry = retry_seconds
        self._observe = observe_delay
        self.breakers: dict[str, FleetBreaker] = {}
        self._tasks: list[asyncio.Task[None]] = []
        link.on_resume(self._resumed)

    def add(self, breaker: FleetBreaker) -> None:
        """Adopt ``breaker``; after a reload, the backend's new breaker replaces the old."""
        self.breakers[breaker.name] = breaker

    def forget(self, backend: str) -> None:
        self.breakers.pop(backend, None)

    def start(self) -> None:
        if not self.breakers:
            return
        loop = asyncio.get_running_loop()
        channel = next(iter(self.breakers.values())).channel
        self._tasks.append(
            loop.create_task(listen(self._link, channel, self.breakers, self._observe, self._retry))
        )
        self._tasks.append(loop.create_task(self._poll()))

    def stop(self) -> None:
        for task in self._tasks:
            task.cancel()

    def _resumed(self) -> None:
        for breaker in self.breakers.values():
            breaker.resumed()

    async def _poll(self) -> None:
        while True:
            await asyncio.sleep(self._period)
            # Read each round: a reload may add or forget backends.
            breakers = dict(self.breakers)
            names = list(breakers)
            if not self._link.shared or not names:
                continue

            async def read(
                r: Any, names: list[str] = names, breakers: dict[str, FleetBreaker] = breakers
            ) -> list[list[bytes | None]]:
                pipe = r.pipeline(transaction=False)
                for name in names:
                    pipe.hmget(breakers[name].keys.state, "state", "opened_at")
                return list(await pipe.execute())

            try:
                states = await self._link.run("breaker_sync", read)
            except RedisDown:
                continue
            for name, (state, opened) in zip(names, states, strict=True):
                breakers[name].adopt(state.decode() if state else CLOSED, float(opened or 0))
