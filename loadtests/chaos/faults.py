"""Applying a schedule to a fleet: each fault at its time, undone after its length.

What actually happened is recorded (:class:`Applied`): when each fault began and ended
(a rollout ends when it ends, a deploy-lane fault may wait for the one before it), and
what the admin API answered (``fleet``: whether the other replicas were told).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from .fleet import ChaosFleet
from .schedule import Fault
from .settings import SECRET_A, SECRET_B

IDP_FAULTS: dict[str, Callable[[dict[str, Any]], dict[str, Any]]] = {
    "idp_refuse": lambda p: {"refuse": True},
    "idp_hang": lambda p: {"hang": True},
    "idp_500": lambda p: {"status": 500},
    "idp_429": lambda p: {"status": 429, "retry_after": p["retry_after"]},
    "idp_401": lambda p: {"status": 401},
    "idp_slow": lambda p: {"latency": p["latency"]},
    "idp_capacity": lambda p: {"capacity": p["capacity"], "service_time": p["service_time"]},
}
IDP_HEALTHY = {
    "refuse": False,
    "hang": False,
    "status": None,
    "retry_after": None,
    "latency": 0.0,
    "capacity": None,
}


@dataclass
class Applied:
    fault: Fault
    began: float  # seconds since t0
    ended: float
    # For admin actions: whether the answer said the fleet was told (False: Redis was
    # down, the action holds on the replica that was called only). None: not an admin call.
    fleet: bool | None = None
    via: int | None = None
    failed: str | None = None


class Executor:
    def __init__(self, fleet: ChaosFleet) -> None:
        self.fleet = fleet
        self.applied: list[Applied] = []

    def now(self) -> float:
        return time.monotonic() - self.fleet.t0

    async def run(self, faults: list[Fault]) -> None:
        """Lanes side by side; a lane's faults one after the other (one may start late
        when the one before it took longer, as a rollout does)."""
        lanes: dict[str, list[Fault]] = {}
        for fault in sorted(faults, key=lambda f: f.start):
            lanes.setdefault(fault.lane, []).append(fault)
        await asyncio.gather(*(self._lane(mine) for mine in lanes.values()))

    async def _lane(self, faults: list[Fault]) -> None:
        for fault in faults:
            await self._one(fault)

    async def _one(self, fault: Fault) -> None:
        await asyncio.sleep(max(0.0, fault.start - self.now()))
        record = Applied(fault, self.now(), self.now())
        try:
            if fault.lane == "deploy":
                await self._deploy_fault(fault)
            else:
                await self._timed(fault, record)
        except Exception as exc:  # a fault that could not be applied is reported, not fatal
            record.failed = f"{type(exc).__name__}: {exc}"
            self.fleet.note(f"fault #{fault.index} {fault.kind} failed: {record.failed}")
        record.ended = self.now()
        self.applied.append(record)

    async def _timed(self, fault: Fault, record: Applied) -> None:
        undo = await self._apply(fault, record)
        if fault.length:
            await asyncio.sleep(max(0.0, record.began + fault.length - self.now()))
        if undo is not None:
            await undo()

    async def _apply(self, fault: Fault, record: Applied) -> Callable[[], Awaitable[None]] | None:
        fleet, p, kind = self.fleet, fault.params, fault.kind
        if kind in IDP_FAULTS:
            await asyncio.to_thread(fleet.idp.configure, **IDP_FAULTS[kind](p))
            fleet.note(f"idp: {kind} {p}")

            async def heal() -> None:
                await asyncio.to_thread(fleet.idp.configure, **IDP_HEALTHY)
                fleet.note("idp: healthy")

            return heal
        if kind == "redis_cut":
            await asyncio.to_thread(fleet.proxy.cut, True)
            fleet.note("redis: cut off")

            async def reconnect() -> None:
                await asyncio.to_thread(fleet.proxy.cut, False)
                fleet.note("redis: reachable")

            return reconnect
        if kind == "redis_slow":
            fleet.proxy.latency = p["latency"]
            fleet.note(f"redis: +{p['latency']}s per answer")

            async def fast() -> None:
                fleet.proxy.latency = 0.0
                fleet.note("redis: latency back to normal")

            return fast
        if kind == "redis_flushall":
            await fleet.flushall()
            return None
        if kind == "redis_restart_empty":
            await fleet.restart_redis_empty()
            return None
        return await self._admin(fault, record)

    async def _admin(self, fault: Fault, record: Applied) -> Callable[[], Awaitable[None]] | None:
        fleet, p, kind = self.fleet, fault.params, fault.kind
        via = p["via"]
        record.via = via
        if kind.startswith("breaker_"):
            action = "force-open" if kind == "breaker_force_open" else "force-closed"
            doc = await fleet.breaker(via, action)
            record.fleet = doc.get("stored_in") == "redis" if isinstance(doc, dict) else None

            async def release() -> None:
                await fleet.breaker(via, "release")

            return release
        if kind == "evict":
            doc = await fleet.admin(via, "POST", "/admin/evict", {"user": p["user"]})
            record.fleet = bool(doc.get("fleet"))
            return None
        if kind == "deny":
            body = {"user": p["user"], "seconds": 600}
            doc = await fleet.admin(via, "POST", "/admin/deny", body)
            record.fleet = bool(doc.get("fleet"))

            async def lift() -> None:
                await fleet.admin(via, "DELETE", "/admin/deny", {"user": p["user"]})

            return lift
        raise ValueError(f"unknown fault kind {kind!r}")

    async def _deploy_fault(self, fault: Fault) -> None:
        fleet, p, kind = self.fleet, fault.params, fault.kind
        if kind == "replica_restart":
            await fleet.restart(p["replica"])
        elif kind == "replica_reload":
            await fleet.reload(p["replica"], valid=True)
        elif kind == "replica_reload_invalid":
            await fleet.reload(p["replica"], valid=False)
        elif kind == "roll":
            await fleet.roll()
        elif kind == "secret_rotation":
            await fleet.rotate_secret(SECRET_B if fleet.secret == SECRET_A else SECRET_A)
        else:
            raise ValueError(f"unknown fault kind {kind!r}")
