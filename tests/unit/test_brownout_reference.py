"""The brownout scenario's own parts: the direct-client reference (loadtests/direct.py)
against a real fake IdP in capacity mode, and the runner's end-of-brownout figures."""

from __future__ import annotations

from typing import Any

from loadtests.run import Result, brownout_end, mean_capacity
from loadtests.scenarios import SCENARIOS


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
