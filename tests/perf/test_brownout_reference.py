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
from tests.support.fakes.idp import FakeIdP

REPO = Path(__file__).resolve().parents[2]


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
