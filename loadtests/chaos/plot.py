"""A run's picture: faults, IdP calls against the bound, and the known users' served
share, second by second (matplotlib, as loadtests/run.py draws its rehearsals)."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from .run import Outcome
from .schedule import LANES


def per_second(outcome: Outcome) -> dict[str, list[float]]:
    seconds = max(1, math.ceil(outcome.ended))
    calls = [0.0] * seconds
    for t, call in outcome.calls:
        if not call.probe and 0 <= t < seconds:
            calls[int(t)] += 1
    known = [0.0] * seconds
    served = [0.0] * seconds
    errors = [0.0] * seconds
    for r in outcome.reviews:
        s = int(r.sent)
        if not 0 <= s < seconds:
            continue
        if r.failed:
            errors[s] += 1
        if r.kind == "known":
            known[s] += 1
            served[s] += not r.failed
    share = [served[i] / known[i] if known[i] else math.nan for i in range(seconds)]
    return {"idp_calls": calls, "known_served_share": share, "errors": errors}


def summary(outcome: Outcome) -> dict[str, Any]:
    """What a long run is recorded as (``--json``): no raw reviews."""
    run = outcome.run
    return {
        "seed": run.seed,
        "replicas": run.replicas,
        "duration": run.duration,
        "rate": run.rate,
        "ran_seconds": round(outcome.ended, 1),
        "reviews": len(outcome.reviews),
        "idp_calls": len(outcome.calls),
        "ok": outcome.ok,
        "faults": [f.to_json() for f in outcome.faults],
        "events": [[round(t, 2), text] for t, text in outcome.events],
        "checks": [
            {"name": c.name, "ok": c.ok, "detail": c.detail, "violations": c.violations}
            for c in outcome.checks
        ],
        "per_second": per_second(outcome),
    }


def plot(outcome: Outcome, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    series = per_second(outcome)
    b = outcome.run.bounds
    x = list(range(len(series["idp_calls"])))
    fig, (lanes, idp, share) = plt.subplots(
        3, 1, figsize=(14, 9), sharex=True, height_ratios=[1.2, 1, 1]
    )
    rows = {lane: i for i, lane in enumerate(LANES)}
    for a in outcome.applied:
        y = rows[a.fault.lane]
        if a.ended - a.began >= 0.3:
            lanes.barh(y, a.ended - a.began, left=a.began, height=0.6, alpha=0.6)
        else:
            lanes.plot([a.began], [y], marker="v", markersize=9)
        if a.ended - a.began >= 3:  # labels for the longer ones only: readable
            lanes.text(a.began, y + 0.35, a.fault.kind, fontsize=5, rotation=20)
    lanes.set_yticks(list(rows.values()), list(rows))
    lanes.set_title(f"seed {outcome.run.seed}: faults")
    idp.step(x, series["idp_calls"], where="post", label="IdP calls per second")
    idp.axhline(b.burst + b.rate, color="red", linestyle="--", label="burst + rate x 1 s")
    idp.axhline(
        2 * (b.burst + b.rate), color="orange", linestyle=":", label="bound during Redis faults"
    )
    idp.set_ylabel("calls/s")
    idp.legend(loc="upper right", fontsize=7)
    share.plot(x, series["known_served_share"], label="known users served")
    share.axhline(0.99, color="red", linestyle="--", label="99 %")
    share.set_ylim(-0.05, 1.05)
    share.set_xlabel("seconds since the warm fleet took load")
    share.legend(loc="lower right", fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
