"""The brownout scenario's own parts: the direct-client reference (loadtests/direct.py)
against a real fake IdP in capacity mode, and the runner's end-of-brownout figures."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import httpx
import pytest

from loadtests.direct import VARIANTS, compare
from loadtests.run import Result, brownout_end, mean_capacity
from loadtests.scenarios import SCENARIOS
from tests.support.fakes.idp import FakeIdP

REPO = Path(__file__).resolve().parent.parent


def control(idp: FakeIdP) -> Any:
    def call(path: str, body: dict[str, Any] | None) -> dict[str, Any]:
        url = f"http://127.0.0.1:{idp.control_port}{path}"
        if path.endswith("/stats"):
            return dict(httpx.get(url, timeout=5).json())
        return dict(httpx.post(url, json=body or {}, timeout=5).json())

    return call


@pytest.mark.exclusive
def test_the_direct_reference_never_has_more_than_six_calls_at_the_idp(fake_idp: FakeIdP) -> None:
    figures = compare(fake_idp.url, control(fake_idp), 4, 0.05, seconds=2.0)
    assert set(figures) == set(VARIANTS)
    for variant in ("fixed-6, cold first", "fixed-6, arrival order"):
        f = figures[variant]
        # The IdP's own count of calls at once: the reference's limit holds.
        assert 1 <= f["idp_max_in_flight"] <= 6, (variant, f)
        assert f["idp_served"] > 0
    # Each variant ran on a fresh queue: the IdP was reset, and is left reset.
    assert fake_idp.stats().calls == 0
    assert fake_idp.faults.capacity is None


@pytest.mark.exclusive
def test_the_documented_direct_command_prints_its_table() -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "loadtests.direct", "--seconds", "1"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "| cold authenticated/s (offered)" in proc.stdout
    assert "fixed-6, arrival order" in proc.stdout


def result(rows: list[dict[str, Any]]) -> Result:
    return Result("gateway", 1000.0, 10.0, {"rows": rows}, [], {})


def row(t: float, unavailable: int = 0, s500: int = 0) -> dict[str, Any]:
    return {
        "t": t,
        "answers": {"authenticated": 10, "unavailable": unavailable},
        "statuses": {"200": 10, "500": s500},
    }


def test_errors_stop_counts_to_the_end_of_the_last_second_with_an_error() -> None:
    res = result([row(1004, unavailable=3), row(1006, unavailable=1), row(1007), row(1008)])
    # The brownout ended at 5.5 s; the last error was in the second 6..7.
    assert res.errors_stop_after(5.5) == 1.5
    assert result([row(1004, unavailable=3), row(1006)]).errors_stop_after(5.5) == 0.0
    # A 5xx is an error too.
    assert result([row(1008, s500=1)]).errors_stop_after(5.5) == 3.5


def test_the_brownout_scenario_ends_its_brownout_and_averages_capacity_over_it() -> None:
    brownout = SCENARIOS["brownout"]
    assert brownout_end(brownout) == 0.8
    assert mean_capacity(brownout) == 80.0
    shift = SCENARIOS["brownout-shift"]
    assert brownout_end(shift) is None
    # 4, then 2 from 33 %, then 8 from 66 %: in calls/s at 50 ms each.
    assert abs(mean_capacity(shift) - (4 * 0.33 + 2 * 0.33 + 8 * 0.34) / 0.05) < 1e-9
