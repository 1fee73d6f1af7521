"""How many replicas share this Redis, from their own heartbeats.

While Redis answers, the fleet's bounds are Redis' (one breaker count, one slot set,
one bucket). While it does not, each replica runs on its *share* of them: a bucket of
R/n and B/n, ``max(1, fail_max // n)`` failures to open and ``max(1, L // n)`` slots.
``n`` is the larger of ``redis.expected_replicas`` and the replicas seen heartbeating
in the last :data:`WINDOW_SECONDS`, so an HPA that scales past ``expected_replicas``
does not multiply the fleet's calls to the IdP when Redis goes away (issue 14). A
replica that has never reached Redis knows only ``expected_replicas``.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable

from authn_gateway.fleet.redis_link import REPLICA_ID, RedisDown, RedisLink
from authn_gateway.tasks import STOP_PATIENCE, cancel_and_wait

log = logging.getLogger(__name__)

# A replica that stopped heartbeating still counts for this long: a rolling update's
# old and new pods are both counted while they overlap, which errs on the safe side.
WINDOW_SECONDS = 15.0
PERIOD_SECONDS = 1.0

# Scores are Redis' own clock, so the replicas' clocks need not agree.
HEARTBEAT = """
local t = redis.call('TIME')
local now = tonumber(t[1]) + tonumber(t[2]) / 1e6
redis.call('ZADD', KEYS[1], now, ARGV[1])
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now - tonumber(ARGV[2]))
redis.call('PEXPIRE', KEYS[1], math.ceil(tonumber(ARGV[2]) * 1000))
return redis.call('ZCARD', KEYS[1])
"""


class FleetSize:
    def __init__(
        self,
        link: RedisLink,
        expected: int,
        on_change: Callable[[int], None] | None = None,
        period: float = PERIOD_SECONDS,
        window: float = WINDOW_SECONDS,
    ) -> None:
        self._link = link
        self.expected = expected
        self.seen = 0  # replicas heartbeating in the window, at the last answer
        self._listeners: list[Callable[[int], None]] = [] if on_change is None else [on_change]
        self._period = period
        self._window = window
        self._task: asyncio.Task[None] | None = None

    @property
    def share(self) -> int:
        """The ``n`` each replica divides the fleet's bounds by while Redis is down."""
        return max(self.expected, self.seen)

    def on_change(self, listener: Callable[[int], None]) -> None:
        """Called with the new share whenever it changes."""
        self._listeners.append(listener)

    async def beat(self) -> None:
        """One heartbeat; the share is kept as it was if Redis does not answer."""
        before = self.share
        with contextlib.suppress(RedisDown):
            key = self._link.key("replicas")
            args = [REPLICA_ID, repr(self._window)]
            self.seen = int(await self._link.script("heartbeat", HEARTBEAT, [key], args))
        if self.share != before:
            for listener in self._listeners:
                listener(self.share)

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._run())

    async def close(self) -> None:
        if self._task is not None and not await cancel_and_wait(self._task, STOP_PATIENCE):
            log.warning("fleet size: the heartbeat did not stop; left behind")

    async def _run(self) -> None:
        while True:
            if self._link.shared:
                await self.beat()
            await asyncio.sleep(self._period)


def share_of(total: int, share: int) -> int:
    """One replica's part of a fleet-wide count: never more than its share, never 0."""
    return max(1, total // share)
