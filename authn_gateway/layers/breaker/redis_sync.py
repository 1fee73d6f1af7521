"""How a replica keeps its fleet breakers' mirrors (:mod:`.redis`) and the override board
(:mod:`.redis_overrides`) up to date: a subscriber that adopts each published transition
and override, and a slow poll as the safety net for a message lost while the subscriber
reconnected. Each round also publishes this replica's view of its breakers for
``GET /admin/breakers``."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable
from typing import Any

import orjson

from authn_gateway.fleet.redis_link import REPLICA_ID, RedisDown, RedisLink, lua_script
from authn_gateway.layers.breaker.gate import replica_view
from authn_gateway.layers.breaker.redis import FleetBreaker, decoded
from authn_gateway.layers.breaker.redis_overrides import RedisOverrides, forced_fields, forced_from
from authn_gateway.layers.breaker.transitions import CLOSED
from authn_gateway.tasks import STOP_PATIENCE, cancel_and_wait
from backends.durations import whole_ms

log = logging.getLogger(__name__)

VIEWS = lua_script(__package__, "views.lua")


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
                fields = decoded(message["data"]).split(" ")
                if len(fields) == 6 and fields[0] == "override":
                    # "override backend override since expires_at published_at"
                    _, backend, kind, since, expires_at, published = fields
                    observe_delay(max(0.0, time.time() - float(published)))
                    if overrides is not None:
                        overrides.adopt(backend, forced_from(kind, since, expires_at))
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
            self.overrides.adopt(name, forced_fields(answers[2 * i + 1]))
        view = replica_view(REPLICA_ID, breakers, shared=True)
        with contextlib.suppress(RedisDown):
            await self._link.script(
                "breaker_views",
                VIEWS,
                [self.views_key],
                ["put", REPLICA_ID, orjson.dumps(view), whole_ms(self.view_ttl)],
            )

    async def views(self) -> list[dict[str, Any]] | None:
        """Every live replica's published view, or None when Redis does not answer."""
        try:
            entries = await self._link.script("breaker_views", VIEWS, [self.views_key], ["get"])
        except RedisDown:
            return None
        views = [orjson.loads(entry) for entry in entries]
        return sorted(views, key=lambda v: str(v.get("replica")))
