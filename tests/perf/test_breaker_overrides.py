"""Issue 18, item 5: operator overrides of a breaker are fleet-wide, expire, survive
reloads and restarts, never close a breaker that real failures opened, and a forced-closed
breaker still bounds the wait of known users. Real gateway processes, a real Redis, the
fake IdP's own call counts."""

from __future__ import annotations

import subprocess
import sys

import pytest


@pytest.mark.exclusive
def test_the_forced_closed_measurement_runs_as_documented() -> None:
    # docs/operations.md and docs/decisions.md quote `python -m loadtests.forced_closed`.
    result = subprocess.run(
        [sys.executable, "-m", "loadtests.forced_closed", "--users", "3"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "3/3 answered (stale)" in result.stdout
    assert "ratio without/with the bound" in result.stdout
