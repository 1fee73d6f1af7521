"""The three-cluster brownout (loadtests/clusters.py, issue 37), as documented: its
figures are printed, and only what holds on any machine is checked here: the IdP's own
counts never pass the bucket, and the fair share serves the quiet clusters' logins where
one shared budget does not."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.exclusive
def test_the_documented_clusters_command_prints_its_checks_and_the_fair_share_holds(
    tmp_path: Path,
) -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "loadtests.clusters", "--seconds", "8", "--out", str(tmp_path)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "| check: b, c logins served >= 0.95" in proc.stdout
    assert (tmp_path / "clusters.png").stat().st_size > 10_000
    fair, shared = json.loads((tmp_path / "clusters.json").read_text())
    assert (fair["variant"], shared["variant"]) == ("fair", "shared")
    for run in (fair, shared):
        # The IdP's own per-second counts: never more than the bucket lets through.
        assert run["idp_peak_calls_in_a_second"] <= run["bucket_allows_in_a_second"], run
        assert all(run["clusters"][n]["errors_5xx"] == 0 for n in "abc"), run
    for quiet in ("b", "c"):
        got, before = fair["clusters"][quiet], shared["clusters"][quiet]
        assert got["logins_served"] >= 0.9, (quiet, got)
        assert got["logins_served"] >= 2 * before["logins_served"], (quiet, got, before)
        # The storm's cluster gets the rest, and no more than the IdP can do.
    assert fair["clusters"]["a"]["idp_calls_per_s"] <= fair["capacity_per_s"]
