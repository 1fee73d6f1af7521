"""Known users survive Redis losing its data: when sharing resumes (or a replica sees
that Redis came back empty), each replica writes its live local identities back, so
a pod started next, during an IdP outage, still serves them. Real gateway processes,
a real redis-server, the fake IdP; the IdP's own counts."""

from __future__ import annotations

import pytest


@pytest.mark.exclusive
def test_the_shared_cache_cost_measurement_runs_as_documented() -> None:
    # docs/decisions.md and docs/operations.md quote `python -m loadtests.shared_cache_costs`.
    import subprocess
    import sys

    result = subprocess.run(
        [sys.executable, "-m", "loadtests.shared_cache_costs", "--identities", "300"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr
    assert "300 identities in Redis" in result.stdout
    assert "write-back of 300" in result.stdout
    assert "one previous secret" in result.stdout
