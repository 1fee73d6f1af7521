"""Operator overrides of a backend's breaker: forced open or forced closed, for a while.

An override is a :class:`Forced` record kept by backend name in an :class:`Overrides`
board, apart from the breaker's own state machine: the machine keeps its state
underneath, so releasing an override returns to whatever the machine says (an IdP
that is still failing stays open), and a reload, which builds new breakers, finds
the board unchanged. Every override expires (``admin.override_default_seconds``,
1 h by default; repeating the call renews it), so a forgotten one cannot outlive the
incident by much. The board lives in this process (:class:`.memory.MemoryOverrides`)
or in Redis for the whole fleet (:class:`.redis.RedisOverrides`).
"""

from __future__ import annotations

import enum
import time
from dataclasses import dataclass
from typing import Any, Protocol


class Override(enum.Enum):
    """Operator overrides, like resilience4j's FORCED_OPEN and DISABLED."""

    NONE = "none"
    FORCED_OPEN = "forced_open"
    FORCED_CLOSED = "forced_closed"


@dataclass(frozen=True)
class Forced:
    """One override in force. Times are Unix seconds."""

    override: Override
    #: When this override was first set; a renewal keeps it, so its age stays true.
    since: float
    expires_at: float
    #: Who set or last renewed it ("name@address"), for the admin listing.
    by: str = ""

    def active(self, now: float) -> bool:
        return now < self.expires_at

    def to_json(self, now: float | None = None) -> dict[str, Any]:
        now = time.time() if now is None else now
        return {
            "override": self.override.value,
            "since": round(self.since, 3),
            "expires_at": round(self.expires_at, 3),
            "expires_in_seconds": round(max(0.0, self.expires_at - now), 1),
            "by": self.by,
        }


def renewed(
    previous: Forced | None, override: Override, now: float, seconds: float, by: str
) -> Forced:
    """The record for setting ``override`` now: the same override again keeps its start."""
    since = previous.since if previous is not None and previous.override is override else now
    return Forced(override, since, now + seconds, by)


class Overrides(Protocol):
    """The overrides of every backend, by name."""

    def current(self, backend: str) -> Forced | None:
        """The override in force now (None when there is none or it expired); no I/O."""
        ...

    async def put(self, backend: str, override: Override, seconds: float, by: str) -> bool:
        """Set (or, with :attr:`Override.NONE`, clear) ``backend``'s override for
        ``seconds``. True when it is stored for the fleet, False when for this process
        only (one process, or Redis unreachable: then it is written when Redis is back)."""
        ...

    async def read(self, backend: str) -> Forced | None:
        """The override as stored (Redis, when shared), else :meth:`current`."""
        ...


class Overridden:
    """The operator's override of one breaker (``name``), read from its store: shared
    by the in-process breaker and the fleet one."""

    name: str
    overrides: Overrides

    def forced(self) -> Forced | None:
        return self.overrides.current(self.name)

    @property
    def override(self) -> Override:
        forced = self.overrides.current(self.name)
        return forced.override if forced is not None else Override.NONE

    @property
    def state(self) -> str:
        """closed, open, half-open, forced_open or forced_closed: the override in force,
        else the state machine's own state."""
        override = self.override
        if override is not Override.NONE:
            return str(override.value)
        return self.machine_state

    @property
    def machine_state(self) -> str:
        """The state machine's own state, whatever an override says."""
        raise NotImplementedError
