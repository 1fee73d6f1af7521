"""The fleet a chaos run acts on: redis-server behind a proxy, the recording IdP, and N
real gateway processes, with what a Deployment does to them (restart, reload, roll).

Traffic goes only to replicas in rotation and ready (``/readyz``, polled every
:data:`READY_POLL` s), as a Service routes only to ready endpoints; a replica leaves
the rotation before it is stopped, as a terminating pod leaves its endpoints. A roll
is a Deployment's with ``maxSurge: 1, maxUnavailable: 0``: the new pod must be ready
before the old one stops, so a rollout during an IdP outage stalls (up to
:data:`ROLL_PATIENCE` s per pod, then the new pod is given up and the old one kept).
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import redis
import yaml

from tests.support.procs import GatewayProcess, free_port, start_gateway
from tests.support.redis_server import RedisServer

from .idp import RecordingIdP
from .proxy import RedisProxy
from .settings import ADMIN_TOKEN, BACKEND, SECRET_A, RunSettings, gateway_config

READY_POLL = 0.5
ROLL_PATIENCE = 20.0


@dataclass
class Replica:
    slot: int
    gw: GatewayProcess
    started: float  # time.monotonic() when its process started
    in_rotation: bool = True
    ready: bool = False
    stopped: float | None = None  # time.monotonic() when it was stopped

    @property
    def url(self) -> str:
        return self.gw.url


@dataclass
class ChaosFleet:
    run: RunSettings
    workdir: Path
    redis: RedisServer = field(init=False)
    proxy: RedisProxy = field(init=False)
    idp: RecordingIdP = field(init=False)
    replicas: list[Replica] = field(default_factory=list)
    # Replicas stopped during the run, kept for their logs and start times.
    retired: list[Replica] = field(default_factory=list)
    secret: str = SECRET_A
    previous: tuple[str, ...] = ()
    reload_mark: int = 0
    # (seconds since t0, what happened), in the order it happened.
    events: list[tuple[float, str]] = field(default_factory=list)
    t0: float = field(default_factory=time.monotonic)
    _started_count: int = 0

    # ---- lifecycle ----

    def start(self) -> ChaosFleet:
        self.redis = RedisServer(self.workdir).start()
        self.proxy = RedisProxy(self.redis.port).start()
        self.idp = RecordingIdP()
        self.idp.start_in_thread()
        for slot in range(self.run.replicas):
            self.replicas.append(self._spawn(slot))
        return self

    def stop(self) -> None:
        for replica in self.replicas:
            with contextlib.suppress(Exception):
                replica.gw.stop()
        self.proxy.stop()
        self.redis.stop()
        self.idp.stop()

    def config(self) -> dict[str, Any]:
        return gateway_config(
            self.run, self.proxy.url, self.idp.url, self.secret, self.previous, self.reload_mark
        )

    def _spawn(self, slot: int, port: int | None = None) -> Replica:
        self._started_count += 1
        name = f"replica{slot}-{self._started_count}"
        gw = start_gateway(self.config(), self.workdir, port=port, name=name)
        return Replica(slot, gw, time.monotonic())

    def note(self, text: str) -> None:
        self.events.append((time.monotonic() - self.t0, text))

    def ready_urls(self) -> list[tuple[int, str, float]]:
        """(slot, url, when its process started: seconds since t0) of each replica in
        rotation and ready. A roll's new process shares its slot with the old one until
        the swap: the start time tells which of them answered."""
        return [
            (r.slot, r.url, r.started - self.t0) for r in self.replicas if r.in_rotation and r.ready
        ]

    async def poll_readiness(self) -> None:
        async with httpx.AsyncClient(timeout=2.0) as client:
            while True:
                for replica in list(self.replicas):
                    try:
                        answer = await client.get(f"{replica.url}/readyz")
                        replica.ready = answer.status_code == 200
                    except httpx.HTTPError:
                        replica.ready = False
                await asyncio.sleep(READY_POLL)

    def rss_mib(self) -> dict[int, float]:
        """Each running replica's resident set, from /proc."""
        sizes: dict[int, float] = {}
        for replica in self.replicas:
            try:
                status = Path(f"/proc/{replica.gw.proc.pid}/status").read_text()
            except OSError:
                continue
            for line in status.splitlines():
                if line.startswith("VmRSS:"):
                    sizes[replica.slot] = int(line.split()[1]) / 1024
        return sizes

    # ---- what a Deployment does ----

    async def restart(self, slot: int) -> None:
        """The container restarts in place (a crash, an OOM kill): out of rotation, stopped,
        started again on the same port; back in rotation once ready."""
        old = self.replicas[slot]
        old.in_rotation = False
        old.stopped = time.monotonic()
        await asyncio.to_thread(old.gw.stop, signal.SIGKILL)
        self.retired.append(old)
        new = await asyncio.to_thread(self._spawn, slot, old.gw.port)
        self.replicas[slot] = new
        self.note(f"replica {slot} restarted")

    async def roll(self, why: str = "rolled") -> bool:
        """Replace every replica, one at a time, each new one ready before its old one
        stops. False when a new pod did not become ready in time (the rollout stalled)."""
        for slot in range(len(self.replicas)):
            new = await asyncio.to_thread(self._spawn, slot, free_port())
            new.in_rotation = False
            self.replicas.append(new)  # polled for readiness meanwhile
            deadline = time.monotonic() + ROLL_PATIENCE
            while not new.ready and time.monotonic() < deadline:
                await asyncio.sleep(0.2)
            self.replicas.remove(new)
            if not new.ready:
                await asyncio.to_thread(new.gw.stop)
                self.retired.append(new)
                self.note(f"rollout ({why}) stalled at replica {slot}: new pod never ready")
                return False
            old = self.replicas[slot]
            new.in_rotation = True
            self.replicas[slot] = new
            old.in_rotation = False
            await asyncio.sleep(0.5)  # its endpoint is gone before SIGTERM, as in kube
            old.stopped = time.monotonic()
            await asyncio.to_thread(old.gw.stop)
            self.retired.append(old)
        self.note(f"rollout ({why}) done")
        return True

    async def reload(self, slot: int, valid: bool) -> None:
        """SIGHUP with a changed valid config, or with an invalid one (then the file is
        put back, so that a later restart starts)."""
        gw = self.replicas[slot].gw
        if valid:
            self.reload_mark += 1
            text = yaml.safe_dump({**self.config(), "server": self._server(gw)})
        else:
            text = "backends: 7\n"
        good = yaml.safe_dump({**self.config(), "server": self._server(gw)})
        gw.config_path.write_text(text)
        gw.proc.send_signal(signal.SIGHUP)
        self.note(f"replica {slot} reloaded ({'valid' if valid else 'invalid'} config)")
        await asyncio.sleep(1.0)
        gw.config_path.write_text(good)

    @staticmethod
    def _server(gw: GatewayProcess) -> dict[str, Any]:
        return {"host": "127.0.0.1", "port": gw.port}

    async def rotate_secret(self, new_secret: str) -> None:
        """docs/operations.md, "Rotate the gateway secret", steps 1 and 2: every replica
        accepts the new secret, then writes with it (the old one still read)."""
        old = self.secret
        self.previous = (new_secret,)
        if await self.roll("secret rotation, step 1: accept the new secret"):
            self.secret, self.previous = new_secret, (old,)
            await self.roll("secret rotation, step 2: write with the new secret")

    # ---- Redis ----

    async def flushall(self) -> None:
        await asyncio.to_thread(lambda: redis.Redis(port=self.redis.port).flushall())
        self.note("redis FLUSHALL")

    async def restart_redis_empty(self) -> None:
        def bounce() -> None:
            self.redis.stop()
            self.redis.start()

        await asyncio.to_thread(bounce)
        self.note("redis restarted empty")

    # ---- the admin API (on a ready replica) ----

    async def admin(self, slot: int, method: str, path: str, body: dict[str, Any]) -> Any:
        url = f"{self.replicas[slot].url}{path}"
        headers = {"authorization": f"Bearer {ADMIN_TOKEN}"}
        async with httpx.AsyncClient(timeout=10.0) as client:
            answer = await client.request(method, url, json=body, headers=headers)
        doc = answer.json() if answer.content else {}
        said = {k: doc[k] for k in ("state", "fleet", "stored_in", "message") if k in doc}
        self.note(f"admin {method} {path} {body} via replica {slot}: {answer.status_code} {said}")
        return doc

    async def breaker(self, slot: int, action: str) -> Any:
        body = {"seconds": 600} if action != "release" else {}
        return await self.admin(slot, "POST", f"/admin/breakers/{BACKEND}/{action}", body)
