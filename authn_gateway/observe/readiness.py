"""Readiness that protects warm pods: a cold pod waits for its IdPs before taking traffic.

A pod that starts during an IdP outage has an empty cache: it can only answer
"unavailable" to users that the running (warm) pods still serve stale. If it said
ready at once, a rollout would replace every warm pod within a minute. So until each
backend has given one definite answer (valid or invalid, either proves the IdP
answers), the pod is not ready; the rollout stalls on ``maxUnavailable: 0`` and the
warm pods keep serving. After ``readiness.cold_start_grace_seconds`` it is ready
anyway, so that a fleet starting cold all at once still serves.

The pod learns whether an IdP answers with a probe: one review of a random token that
no IdP knows, made when /readyz is asked and repeated at most every few seconds until
it is answered. It is the pod's state, not a config's: a reload (SIGHUP) keeps it.
"""

from __future__ import annotations

import asyncio
import logging
import secrets
import time
from collections.abc import Callable, Sequence

from backends.base import Backend, Unavailable

log = logging.getLogger(__name__)

# Shortest time between two probes of one backend that did not answer.
PROBE_INTERVAL = 2.0
# How long /readyz waits for a probe it started, so that a healthy start is ready at
# the first kubelet probe (whose own timeout is 1 s by default).
READYZ_WAIT = 0.5


def probe_tokens() -> tuple[str, ...]:
    """Tokens no IdP knows, in the shapes backends accept: a Fernet-like string for
    bearer-token IdPs, user:password for LDAP."""
    fernet_like = "gAAAAA" + secrets.token_urlsafe(150)  # Fernet's version byte, then noise
    return (fernet_like, f"authn-gateway-readiness-probe:{secrets.token_hex(16)}")


class Warmth:
    """What this process has learnt: which backends have answered, and since when it runs."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self.clock = clock
        self.started = clock()
        self.answered: set[str] = set()


# One per process: kept across config reloads.
PROCESS_WARMTH = Warmth()


class ReadinessGate:
    def __init__(
        self,
        backends: Sequence[tuple[Backend, float]],
        grace_seconds: float,
        warmth: Warmth = PROCESS_WARMTH,
    ) -> None:
        """``backends``: each backend with the deadline of one call to it."""
        self._backends = list(backends)
        self._grace = grace_seconds
        self._warmth = warmth
        self._probing: asyncio.Task[None] | None = None
        self._last_probe = -PROBE_INTERVAL

    def waiting_for(self) -> list[str]:
        """The backends that have never answered, while the grace period lasts."""
        warmth = self._warmth
        if warmth.clock() - warmth.started >= self._grace:
            return []
        return [b.name for b, _ in self._backends if b.name not in warmth.answered]

    async def ready(self) -> bool:
        if not self.waiting_for():
            return True
        now = self._warmth.clock()
        if self._probing is None and now - self._last_probe >= PROBE_INTERVAL:
            self._last_probe = now
            self._probing = asyncio.get_running_loop().create_task(self._probe())
        if self._probing is not None:
            # shield: a /readyz that gives up must not cancel the probe.
            await asyncio.wait({asyncio.shield(self._probing)}, timeout=READYZ_WAIT)
        return not self.waiting_for()

    def close(self) -> None:
        if self._probing is not None:
            self._probing.cancel()

    async def _probe(self) -> None:
        try:
            waiting = set(self.waiting_for())
            await asyncio.gather(
                *(
                    self._probe_one(b, deadline)
                    for b, deadline in self._backends
                    if b.name in waiting
                )
            )
        finally:
            self._probing = None

    async def _probe_one(self, backend: Backend, deadline: float) -> None:
        token = next((t for t in probe_tokens() if backend.could_accept(t)), None)
        if token is None:
            self._warmth.answered.add(backend.name)  # no token shape to ask it with
            return
        try:
            async with asyncio.timeout(deadline):
                outcome = await backend.authenticate(token)
        except Exception:  # a timeout or a backend bug: not an answer
            outcome = Unavailable("probe failed")
        if isinstance(outcome, Unavailable):
            log.info("readiness: backend %s does not answer yet (%s)", backend.name, outcome.reason)
            return
        self._warmth.answered.add(backend.name)
        log.info("readiness: backend %s answers", backend.name)
