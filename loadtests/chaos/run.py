"""One chaos run: start the fleet, warm it, offer load while the schedule plays, keep
offering until the recovery time after the last fault has passed, then check."""

from __future__ import annotations

import asyncio
import contextlib
import json
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

from .faults import Applied, Executor
from .fleet import ChaosFleet
from .idp import Call
from .invariants import Check, Checker, Replicas
from .load import Load, Review
from .schedule import Fault, timeline
from .settings import RunSettings

# Seconds of load after the recovery time, so that "errors stopped" has reviews to see.
AFTER_RECOVERY = 3.0
READY_PATIENCE = 30.0


@dataclass
class Outcome:
    run: RunSettings
    faults: list[Fault]
    applied: list[Applied] = field(default_factory=list)
    checks: list[Check] = field(default_factory=list)
    events: list[tuple[float, str]] = field(default_factory=list)
    reviews: list[Review] = field(default_factory=list)
    calls: list[tuple[float, Call]] = field(default_factory=list)  # (seconds since t0, call)
    rss: list[tuple[float, int, float]] = field(default_factory=list)
    ended: float = 0.0
    # Where the replicas' logs are, when they were kept.
    workdir: Path | None = None

    @property
    def ok(self) -> bool:
        return bool(self.checks) and all(c.ok for c in self.checks)

    @property
    def failed(self) -> list[str]:
        return [c.name for c in self.checks if not c.ok]


def fault_window(run: RunSettings) -> tuple[float, float]:
    """Faults start after the warm-up and end early enough for recovery to be seen."""
    return run.warmup, max(run.warmup + 1.0, run.duration - run.recovery_seconds - AFTER_RECOVERY)


async def run_once(run: RunSettings, faults: list[Fault], workdir: Path) -> Outcome:
    outcome = Outcome(run, faults, workdir=workdir)
    fleet = ChaosFleet(run, workdir)
    await asyncio.to_thread(fleet.start)
    poller = asyncio.ensure_future(fleet.poll_readiness())
    sampler: asyncio.Future[None] | None = None
    load = Load(fleet, run)
    try:
        deadline = time.monotonic() + READY_PATIENCE
        while len(fleet.ready_urls()) < run.replicas:
            if time.monotonic() > deadline:
                raise RuntimeError("the fleet did not become ready")
            await asyncio.sleep(0.1)
        await load.warm()
        fleet.t0 = time.monotonic()
        sampler = asyncio.ensure_future(_sample_rss(fleet, outcome))
        executor = Executor(fleet)
        playing = asyncio.ensure_future(executor.run(faults))
        await load.offer(run.duration)
        while not playing.done():
            # A lane behind its schedule (rollouts take what they take): load goes on.
            await load.offer(load.now() + 1.0)
        await playing
        outcome.applied = executor.applied
        last = max((a.ended for a in executor.applied), default=0.0)
        await load.offer(max(run.duration, last + run.recovery_seconds + AFTER_RECOVERY))
        await load.drain()
        outcome.ended = load.now()
    finally:
        for task in (poller, sampler):
            if task is not None:
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task
        await load.close()
        await asyncio.to_thread(fleet.stop)
    outcome.events = list(fleet.events)
    outcome.reviews = load.reviews
    calls = fleet.idp.records()
    outcome.calls = [(c.arrived - fleet.t0, c) for c in calls]
    processes = [
        (r.slot, r.started - fleet.t0, None if r.stopped is None else r.stopped - fleet.t0)
        for r in [*fleet.retired, *fleet.replicas]
    ]
    checker = Checker(
        run, load.reviews, calls, outcome.applied, Replicas(processes), outcome.rss, fleet.t0
    )
    outcome.checks = checker.check_all()
    return outcome


async def _sample_rss(fleet: ChaosFleet, outcome: Outcome) -> None:
    while True:
        t = time.monotonic() - fleet.t0
        for slot, mib in fleet.rss_mib().items():
            outcome.rss.append((t, slot, mib))
        await asyncio.sleep(1.0)


def run_in_tempdir(run: RunSettings, faults: list[Fault], keep: Path | None = None) -> Outcome:
    """:func:`run_once` in a fresh directory (``keep``: there, left for its logs)."""
    if keep is not None:
        keep.mkdir(parents=True, exist_ok=True)
        outcome = asyncio.run(run_once(run, faults, keep))
        write_records(outcome, keep / "records.jsonl")
        return outcome
    with tempfile.TemporaryDirectory(prefix="chaos-") as tmp:
        outcome = asyncio.run(run_once(run, faults, Path(tmp)))
        outcome.workdir = None
        return outcome


def write_records(outcome: Outcome, path: Path) -> None:
    """Every review and every IdP call, one JSON object a line (``--keep``)."""
    with path.open("w") as out:
        for r in outcome.reviews:
            out.write(json.dumps({"review": asdict(r)}) + "\n")
        for t, call in outcome.calls:
            ended = None if call.ended is None else call.ended - call.arrived
            row = {"t": t, "took": ended, "status": call.status, "user": call.user}
            out.write(json.dumps({"call": {**row, "probe": call.probe}}) + "\n")


def replay_command(run: RunSettings, only: list[int] | None = None) -> str:
    command = (
        f"python -m loadtests.chaos --seed {run.seed} --duration {run.duration:g} "
        f"--replicas {run.replicas} --rate {run.rate:g}"
    )
    if only is not None:
        command += f" --only {','.join(map(str, only)) or 'none'}"
    return command


def report(outcome: Outcome, only: list[int] | None = None) -> str:
    run = outcome.run
    lines = [
        f"seed {run.seed}: {run.replicas} replicas, {run.duration:g} s scheduled, "
        f"{outcome.ended:.0f} s run, {len(outcome.reviews)} reviews, "
        f"{len(outcome.calls)} IdP calls",
        "",
        "fault schedule:",
        timeline(outcome.faults) or "  (none)",
        "",
        "what happened:",
    ]
    lines += [f"  {t:6.1f}s {text}" for t, text in outcome.events] or ["  (nothing)"]
    lines += ["", "invariants:"]
    for check in outcome.checks:
        lines.append(f"  [{'ok' if check.ok else 'FAILED'}] {check.name}: {check.detail}")
        lines += [f"      {v}" for v in check.violations]
    verdict = "passed" if outcome.ok else f"FAILED ({', '.join(outcome.failed)})"
    lines += ["", f"seed {run.seed} {verdict}; replay: {replay_command(run, only)}"]
    return "\n".join(lines)
