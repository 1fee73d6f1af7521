"""What the review path needs of a breaker (:class:`CallGate`), the tickets it hands out,
and one replica's view of its gates for ``GET /admin/breakers``.

Both breakers answer this interface: :class:`.machine.Breaker` in one process,
:class:`.redis.FleetBreaker` across a fleet.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import Any, Protocol

from authn_gateway.layers.breaker.override import Forced, Override
from backends.base import Outcome


class Ticket:
    """Leave for one call to the backend; a probe holds a half-open permit."""

    __slots__ = ("permit", "slot")

    def __init__(self, permit: str | None, slot: bool = False) -> None:
        self.permit = permit
        self.slot = slot  # holds one of the in-flight slots


class Busy(Ticket):
    """Not a ticket: ``max_in_flight`` calls are out already (the gateway's own refusal)."""


BUSY = Busy(permit=None)


class CallGate(Protocol):
    """What the review path needs of a breaker."""

    name: str

    @property
    def override(self) -> Override: ...

    def forced(self) -> Forced | None:
        """The operator override in force, with its times (None when none)."""
        ...

    @property
    def state(self) -> str:
        """closed, open, half-open, forced_open or forced_closed."""
        ...

    @property
    def machine_state(self) -> str:
        """The state machine's own state, whatever an override says."""
        ...

    async def admit(self) -> Ticket | None:
        """A ticket if a call may go to the backend now, :data:`BUSY` if too many are
        in flight, else None (fail fast)."""
        ...

    def fails_fast(self) -> bool:
        """Whether :meth:`admit` would refuse now, known without I/O: forced open, or
        open with its probe not yet due. Checked before a call waits for a local slot."""
        ...

    def release(self, ticket: Ticket) -> None:
        """Give back a ticket whose call was never made."""
        ...

    def record(self, ticket: Ticket, outcome: Outcome, seconds: float | None = None) -> None:
        """One finished call's outcome (and how long it took)."""
        ...

    @property
    def max_hold(self) -> float:
        """The longest a Retry-After may hold this breaker open."""
        ...

    @property
    def slow_threshold(self) -> float | None:
        """Seconds from which a call counts as slow (None: the rule is off)."""
        ...

    def hold_open(self, seconds: float) -> None:
        """Stay open for ``seconds`` (the IdP sent Retry-After), then probe as usual."""
        ...


def replica_view(replica: str, gates: Mapping[str, CallGate], shared: bool) -> dict[str, Any]:
    """One replica's view of its breakers, as ``GET /admin/breakers`` lists it."""
    now = time.time()
    backends: dict[str, Any] = {}
    for name, gate in gates.items():
        forced = gate.forced()
        backends[name] = {
            "state": gate.state,
            # What the breaker itself says: where a release returns to.
            "machine_state": gate.machine_state,
            "override": forced.override.value if forced is not None else Override.NONE.value,
            "expires_at": round(forced.expires_at, 3) if forced is not None else None,
        }
    return {"replica": replica, "at": round(now, 3), "shared": shared, "backends": backends}
