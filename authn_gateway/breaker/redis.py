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

Operator overrides (:mod:`.override`) live in Redis too (:class:`RedisOverrides`), one
expiring key per backend, published on the same channel and read by the same poll, so
a ``force-open`` on one replica holds on all of them within the same bound as an
opened breaker. Each replica also publishes its view (:class:`BreakerSync`) for
``GET /admin/breakers``.
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

import orjson

from backends.base import Outcome, Unavailable

from ..redis_link import REPLICA_ID, RedisDown, RedisLink, lua_script
from ..tasks import STOP_PATIENCE, cancel_and_wait
from .machine import (
    BUSY,
    CLOSED,
    HALF_OPEN,
    OPEN,
    Admission,
    Breaker,
    FailureRate,
    SlowCalls,
)
from .override import Forced, Overridden, Override, renewed, replica_view

log = logging.getLogger(__name__)

ADMIT = lua_script(__package__, "admit.lua")
SETTLE = lua_script(__package__, "settle.lua")
HOLD = lua_script(__package__, "hold.lua")
OVERRIDE = lua_script(__package__, "override.lua")
VIEWS = lua_script(__package__, "views.lua")


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
    override: str

    @classmethod
    def of(cls, link: RedisLink, backend: str) -> FleetKeys:
        tag = "{" + link.key("breaker", backend) + "}"
        return cls(tag, f"{tag}:in-flight", f"{tag}:probes", f"{tag}:failures", f"{tag}:override")


class RedisOverrides:
    """The fleet's operator overrides: one expiring Redis key per backend, and this
    replica's mirror of them (kept up by the published messages and the poll), which
    the review path reads without I/O.

    With Redis unreachable an override is set in the mirror only, and written to Redis
    when it answers again: an operator can still shed a failing IdP during a Redis
    outage, and the fleet gets the override once it can.
    """

    def __init__(
        self,
        link: RedisLink,
        spawn: Callable[[Awaitable[Any]], None],
        clock: Callable[[], float] = time.time,
    ) -> None:
        self._link = link
        self._spawn = spawn
        self._clock = clock
        self.channel = link.key("breaker-events")
        self._mirror: dict[str, Forced] = {}
        # Set while Redis was unreachable, not yet written: the mirror's word wins.
        self._unshared: set[str] = set()
        link.on_resume(self._resumed)

    def current(self, backend: str) -> Forced | None:
        forced = self._mirror.get(backend)
        return forced if forced is not None and forced.active(self._clock()) else None

    def adopt(self, backend: str, forced: Forced | None) -> None:
        """Take the fleet's override (from a message, the poll or a script's answer)."""
        if backend in self._unshared:
            return
        old = self.current(backend)
        if forced is None:
            self._mirror.pop(backend, None)
        else:
            if old is not None and old.override is forced.override and not forced.by:
                forced = Forced(forced.override, forced.since, forced.expires_at, old.by)
            self._mirror[backend] = forced
        new = self.current(backend)
        if (old.override if old else None) != (new.override if new else None):
            log.warning(
                "breaker %s: operator override %s (fleet)",
                backend,
                new.override.value if new is not None else "released",
            )

    async def put(self, backend: str, override: Override, seconds: float, by: str) -> bool:
        key = FleetKeys.of(self._link, backend).override
        try:
            reply = await self._link.script(
                "breaker_override",
                OVERRIDE,
                [key],
                [override.value, seconds, by, self.channel, backend],
            )
        except RedisDown:
            self._set_locally(backend, override, seconds, by)
            return False
        self._unshared.discard(backend)
        self.adopt(backend, _forced(_text(reply[0]), reply[1], reply[2], by))
        return True

    def _set_locally(self, backend: str, override: Override, seconds: float, by: str) -> None:
        self._unshared.add(backend)
        if override is Override.NONE:
            self._mirror.pop(backend, None)
        else:
            now = self._clock()
            self._mirror[backend] = renewed(self.current(backend), override, now, seconds, by)
        log.warning(
            "breaker %s: operator override %s on this replica only (Redis unreachable); "
            "it is written for the fleet when Redis answers",
            backend,
            override.value,
        )

    async def read(self, backend: str) -> Forced | None:
        key = FleetKeys.of(self._link, backend).override
        try:
            fields = await self._link.run(
                "breaker_override_read",
                lambda r: r.hmget(key, "override", "since", "expires_at", "by"),
            )
        except RedisDown:
            return self.current(backend)
        forced = _forced_fields(fields)
        return forced if forced is not None and forced.active(self._clock()) else None

    def _resumed(self) -> None:
        for backend in list(self._unshared):
            forced = self._mirror.get(backend)
            if forced is None or not forced.active(self._clock()):
                self._spawn(self.put(backend, Override.NONE, 0, ""))
            else:
                remaining = forced.expires_at - self._clock()
                self._spawn(self.put(backend, forced.override, remaining, forced.by))


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
        on_transition: Callable[[str, str, str], None] | None = None,
        failure_rate: FailureRate | None = None,
        slow_calls: SlowCalls | None = None,
        overrides: RedisOverrides | None = None,
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
        self.overrides = overrides if overrides is not None else RedisOverrides(link, spawn)
        # The fleet's state as last seen (Unix time for opened_at, as in Redis).
        self._mirror = CLOSED
        self._opened_at = 0.0

    # ---- state -------------------------------------------------------------------
    @property
    def state(self) -> str:
        override = self.override
        if override is not Override.NONE:
            return str(override.value)
        return self.machine_state

    @property
    def machine_state(self) -> str:
        return self._mirror if self._link.shared else self._local.machine_state

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
        override = self.override
        if override is Override.FORCED_OPEN:
            return None
        if override is Override.FORCED_CLOSED:
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

    def fails_fast(self) -> bool:
        override = self.override
        if override is not Override.NONE:
            return override is Override.FORCED_OPEN
        if not self._link.shared:
            return self._local.fails_fast()
        return self._mirror == OPEN and time.time() < self._opened_at + self._reset_timeout

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

    def resumed(self) -> None:
        """Redis answers again: a breaker that opened locally meanwhile opens the fleet's."""
        if self._local.state == OPEN:
            remaining = self._local.seconds_until_probe()
            self._spawn(self._hold_remote(max(remaining, 0.0) + self._reset_timeout))


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _forced(override: str, since: Any, expires_at: Any, by: str = "") -> Forced | None:
    try:
        kind = Override(override)
        forced = Forced(kind, float(_text(since)), float(_text(expires_at)), by)
    except ValueError:
        return None  # not ours, or written by a newer version: no override
    return forced if kind is not Override.NONE else None


def _forced_fields(fields: list[Any]) -> Forced | None:
    """An override hash's (override, since, expires_at, by), None when absent."""
    override, since, expires_at, by = fields
    if override is None or since is None or expires_at is None:
        return None
    return _forced(_text(override), since, expires_at, _text(by) if by is not None else "")


async def listen(
    link: RedisLink,
    channel: str,
    breakers: dict[str, FleetBreaker],
    observe_delay: Callable[[float], None],
    retry_seconds: float,
    overrides: RedisOverrides | None = None,
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
                if len(fields) == 6 and fields[0] == "override":
                    # "override backend override since expires_at published_at"
                    _, backend, kind, since, expires_at, published = fields
                    observe_delay(max(0.0, time.time() - float(published)))
                    if overrides is not None:
                        overrides.adopt(backend, _forced(kind, since, expires_at))
                    continue
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
    transitions and overrides, and a slow poll as the safety net for a message lost
    while the subscriber reconnected. Each round also publishes this replica's view of
    its breakers (:data:`VIEWS`), kept ``view_ttl`` seconds, for ``GET /admin/breakers``."""

    def __init__(
        self,
        link: RedisLink,
        period: float,
        retry_seconds: float,
        observe_delay: Callable[[float], None],
        overrides: RedisOverrides,
    ) -> None:
        self._link = link
        self._period = period
        self._retry = retry_seconds
        self._observe = observe_delay
        self.overrides = overrides
        self.breakers: dict[str, FleetBreaker] = {}
        self._tasks: list[asyncio.Task[None]] = []
        self.views_key = link.key("breaker-views")
        # Long enough to outlast a few missed rounds, short enough that a replica that
        # is gone leaves the listing within seconds.
        self.view_ttl = max(5.0, 3 * period)
        link.on_resume(self._resumed)

    def add(self, breaker: FleetBreaker) -> None:
        """Adopt ``breaker``; after a reload, the backend's new breaker replaces the old."""
        self.breakers[breaker.name] = breaker

    def forget(self, backend: str) -> None:
        self.breakers.pop(backend, None)

    async def start(self) -> None:
        if not self.breakers:
            return
        # Before the first review: a restarted replica starts with the fleet's
        # breakers and overrides, not closed until the first poll.
        await self.sync()
        loop = asyncio.get_running_loop()
        channel = next(iter(self.breakers.values())).channel
        self._tasks.append(
            loop.create_task(
                listen(
                    self._link, channel, self.breakers, self._observe, self._retry, self.overrides
                )
            )
        )
        self._tasks.append(loop.create_task(self._poll()))

    async def close(self) -> None:
        for task in self._tasks:
            if not await cancel_and_wait(task, STOP_PATIENCE):
                log.warning("fleet breakers: a sync task did not stop; left behind")
        self._tasks.clear()

    def _resumed(self) -> None:
        for breaker in self.breakers.values():
            breaker.resumed()

    async def _poll(self) -> None:
        while True:
            await asyncio.sleep(self._period)
            await self.sync()

    async def sync(self) -> None:
        """Read every breaker's state and override, and publish this replica's view."""
        # Read each round: a reload may add or forget backends.
        breakers = dict(self.breakers)
        names = list(breakers)
        if not self._link.shared or not names:
            return

        async def read(r: Any) -> list[list[bytes | None]]:
            pipe = r.pipeline(transaction=False)
            for name in names:
                keys = breakers[name].keys
                pipe.hmget(keys.state, "state", "opened_at")
                pipe.hmget(keys.override, "override", "since", "expires_at", "by")
            return list(await pipe.execute())

        try:
            answers = await self._link.run("breaker_sync", read)
        except RedisDown:
            return
        for i, name in enumerate(names):
            state, opened = answers[2 * i]
            breakers[name].adopt(state.decode() if state else CLOSED, float(opened or 0))
            self.overrides.adopt(name, _forced_fields(answers[2 * i + 1]))
        view = replica_view(REPLICA_ID, breakers, shared=True)
        with contextlib.suppress(RedisDown):
            await self._link.script(
                "breaker_views",
                VIEWS,
                [self.views_key],
                ["put", REPLICA_ID, orjson.dumps(view), int(self.view_ttl * 1000)],
            )

    async def views(self) -> list[dict[str, Any]] | None:
        """Every live replica's published view, or None when Redis does not answer."""
        try:
            entries = await self._link.script("breaker_views", VIEWS, [self.views_key], ["get"])
        except RedisDown:
            return None
        views = [orjson.loads(entry) for entry in entries]
        return sorted(views, key=lambda v: str(v.get("replica")))
