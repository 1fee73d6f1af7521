"""Apiserver-like load: known users, never-seen valid tokens and junk, open loop.

Each second ``rate`` reviews go out whatever the answers do (kube-apiserver's many
clients do not wait for each other), round robin over the replicas that are in
rotation and ready, as a Service spreads them. Every review is recorded as the client
saw it: when, which replica, what was asked, what came back.
"""

from __future__ import annotations

import asyncio
import itertools
import random
import time
from dataclasses import dataclass

import httpx

from tests.support.procs import review_body

from .fleet import ChaosFleet
from .settings import RunSettings

STALE = "authn-gateway.io/stale"


@dataclass
class Review:
    sent: float  # seconds since t0
    done: float
    slot: int | None  # None: no replica was ready
    # When the process that answered started (seconds since t0); None: none was ready.
    process: float | None
    kind: str  # "known", "cold" (never seen, valid) or "junk"
    user: str | None  # the identity the token belongs to; None for junk
    status: int | None  # None: no HTTP answer (connection refused or reset, timeout)
    authenticated: bool = False
    username: str | None = None
    error: str | None = None
    stale: bool = False

    @property
    def failed(self) -> bool:
        """Not the answer the token deserves: an error, a 5xx, no answer at all, or a
        valid token (a known user's, a never-seen one) not authenticated."""
        if self.status != 200 or self.error is not None:
            return True
        return self.user is not None and not self.authenticated


def known_token(i: int) -> tuple[str, str]:
    return f"good-known{i}", f"known{i}"


class Load:
    def __init__(self, fleet: ChaosFleet, run: RunSettings) -> None:
        self.fleet = fleet
        self.run = run
        self.reviews: list[Review] = []
        self._rng = random.Random(f"{run.seed}:load")
        self._tasks: set[asyncio.Task[None]] = set()
        transport = httpx.AsyncHTTPTransport(retries=1)
        limits = httpx.Limits(max_connections=200, max_keepalive_connections=60)
        self._client = httpx.AsyncClient(transport=transport, limits=limits, timeout=10.0)
        self._cold = itertools.count()
        self._junk = itertools.count()
        self._turn = itertools.count()

    def now(self) -> float:
        return time.monotonic() - self.fleet.t0

    def _token(self) -> tuple[str, str, str | None]:
        draw = self._rng.random()
        if draw < self.run.cold_share:
            n = next(self._cold)
            return "cold", f"good-cold{self.run.seed}x{n}", f"cold{self.run.seed}x{n}"
        if draw < self.run.cold_share + self.run.junk_share:
            return "junk", f"junk-{self.run.seed}-{next(self._junk)}", None
        token, user = known_token(self._rng.randrange(self.run.known_users))
        return "known", token, user

    async def warm(self) -> None:
        """Every known user reviewed once on every replica, with the IdP healthy. Not
        recorded: the run's clock (t0) starts after it."""
        for i in range(self.run.known_users):
            token, user = known_token(i)
            for slot, url, process in self.fleet.ready_urls():
                await self._one(url, slot, process, "known", token, user, record=False)

    async def offer(self, until: float) -> None:
        """Send reviews at ``rate`` until ``until`` (seconds since t0)."""
        step = 1.0 / self.run.rate
        due = self.now()
        turn = self._turn
        while due < until:
            delay = due - self.now()
            if delay > 0:
                await asyncio.sleep(delay)
            kind, token, user = self._token()
            ready = self.fleet.ready_urls()
            if not ready:
                t = self.now()
                missed = Review(t, t, None, None, kind, user, None, error="no ready replica")
                self.reviews.append(missed)
            else:
                slot, url, process = ready[next(turn) % len(ready)]
                task = asyncio.ensure_future(self._one(url, slot, process, kind, token, user))
                self._tasks.add(task)
                task.add_done_callback(self._tasks.discard)
            due += step

    async def drain(self) -> None:
        """Wait for the reviews still on their way."""
        if self._tasks:
            await asyncio.wait(self._tasks, timeout=15)

    async def _one(
        self,
        url: str,
        slot: int,
        process: float,
        kind: str,
        token: str,
        user: str | None,
        record: bool = True,
    ) -> None:
        sent = self.now()
        review = Review(sent, sent, slot, process, kind, user, None)
        try:
            answer = await self._client.post(
                f"{url}/authenticate?timeout=30s", json=review_body(token)
            )
            review.status = answer.status_code
            if answer.status_code == 200:
                status = answer.json().get("status", {})
                review.authenticated = bool(status.get("authenticated"))
                review.error = status.get("error")
                who = status.get("user") or {}
                review.username = who.get("username")
                review.stale = (who.get("extra") or {}).get(STALE) == ["true"]
        except httpx.HTTPError as exc:
            review.error = f"transport: {type(exc).__name__}"
        review.done = self.now()
        if record:
            self.reviews.append(review)

    async def close(self) -> None:
        await self._client.aclose()
