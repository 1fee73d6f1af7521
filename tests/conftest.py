from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import HealthCheck, settings

from tests.support.fakes.idp import FakeIdP
from tests.support.procs import GatewayProcess, start_gateway

# Fixtures shared by tests of several tiers.
pytest_plugins = ["tests.support.fixtures"]

# Property tests: a fast profile for the suite, a long one by hand
# (HYPOTHESIS_PROFILE=long .venv/bin/pytest tests/unit/test_chaos_runner.py). No deadline:
# the machine is shared, and a slow example is not a failing one. The suite's profile
# draws the same examples on every run (derandomize): a commit's CI run answers for
# that commit; the long profile, with fresh random examples, is how new cases are
# looked for (CI once drew "gB" and a burst of 1, each a finding of the long kind).
settings.register_profile(
    "ci",
    max_examples=100,
    deadline=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.too_slow],
)
settings.register_profile(
    "long", max_examples=5000, deadline=None, suppress_health_check=[HealthCheck.too_slow]
)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))


@pytest.fixture
def fake_idp() -> Iterator[FakeIdP]:
    """A fault-injecting IdP on a free loopback port, in a thread of its own."""
    idp = FakeIdP(control_port=0).start_in_thread()
    try:
        yield idp
    finally:
        idp.stop()


@pytest.fixture
def gateway_factory(tmp_path: Path) -> Iterator[object]:
    """Start real ``authn-gateway serve`` processes; all are stopped at teardown."""
    started: list[GatewayProcess] = []

    def start(config: dict[str, object], **kwargs: object) -> GatewayProcess:
        gw = start_gateway(config, tmp_path, **kwargs)  # type: ignore[arg-type]
        started.append(gw)
        return gw

    yield start
    for gw in started:
        gw.stop()
