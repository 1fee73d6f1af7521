"""/readyz protects warm pods: a pod restarted during an IdP outage is not ready until
its IdP answers or the grace period ends; a warm pod stays ready, reloads included."""

from __future__ import annotations

import signal
import time
from typing import Any

import httpx

from tests.support.backend_configs import userinfo_backend
from tests.support.fakes.idp import FakeIdP
from tests.support.procs import GatewayProcess

KNOWN = [f"good-user{i}" for i in range(5)]


def config(idp: FakeIdP, grace: float) -> dict[str, Any]:
    return {
        "readiness": {"cold_start_grace_seconds": grace},
        # Short TTL, long stale: known users are served stale as soon as the IdP fails.
        "cache": {"positive_ttl_seconds": 1, "max_stale_seconds": 3600},
        "backends": [userinfo_backend(idp)],
    }


def readyz(gw: GatewayProcess) -> httpx.Response:
    return httpx.get(f"{gw.url}/readyz", timeout=10)


def wait_ready(gw: GatewayProcess, timeout: float) -> tuple[int, float]:
    """Poll /readyz until ready; the number of 503s seen, and how long it took."""
    started, refusals = time.monotonic(), 0
    while time.monotonic() - started < timeout:
        if readyz(gw).status_code == 200:
            return refusals, time.monotonic() - started
        refusals += 1
        time.sleep(0.25)
    raise AssertionError(f"not ready after {timeout}s:\n{gw.logs()}")


def authenticated(gw: GatewayProcess, token: str) -> bool:
    return bool(gw.review(token).json()["status"]["authenticated"])


def test_a_healthy_start_is_ready_after_one_probe(fake_idp: FakeIdP, gateway_factory: Any) -> None:
    gw = gateway_factory(config(fake_idp, grace=600))
    wait_ready(gw, 30)
    # One review of a token the IdP does not know told the pod that its IdP answers.
    assert fake_idp.stats().by_status == {401: 1}
    assert readyz(gw).text == "ready"
    assert fake_idp.calls == 1  # ready is kept, not probed again


def test_a_restart_during_an_outage_waits_for_the_grace_period(
    fake_idp: FakeIdP, gateway_factory: Any
) -> None:
    warm = gateway_factory(config(fake_idp, grace=4))
    wait_ready(warm, 30)
    assert all(authenticated(warm, t) for t in KNOWN)
    fake_idp.configure(status=503)
    time.sleep(1.2)  # past the positive TTL: what follows is served stale
    assert all(authenticated(warm, t) for t in KNOWN)
    assert readyz(warm).status_code == 200  # a warm pod stays ready through the outage

    # The restart: a new pod, cold, while the IdP still fails.
    warm.stop()
    fake_idp.reset_stats()
    cold = gateway_factory(config(fake_idp, grace=4))
    first = readyz(cold)
    assert first.status_code == 503
    assert first.text == "not ready: no answer yet from idp"
    # It knows none of the users the warm pod served: this is why it must not take over.
    assert not any(authenticated(cold, t) for t in KNOWN)
    refusals, _ = wait_ready(cold, 30)
    assert refusals >= 1
    # Ready by the grace period, the IdP still failing; its probes were few.
    assert fake_idp.stats().by_status.keys() == {503}
    assert fake_idp.calls <= 4 / 2 + 2 + len(KNOWN)


def test_a_cold_pod_is_ready_once_its_idp_answers_again(
    fake_idp: FakeIdP, gateway_factory: Any
) -> None:
    fake_idp.configure(status=503)
    gw = gateway_factory(config(fake_idp, grace=600))
    for _ in range(3):
        assert readyz(gw).status_code == 503
        time.sleep(0.5)
    fake_idp.configure(status=None)
    wait_ready(gw, 30)
    assert 401 in fake_idp.stats().by_status


def test_a_reload_during_an_outage_keeps_a_warm_pod_ready(
    fake_idp: FakeIdP, gateway_factory: Any
) -> None:
    gw = gateway_factory(config(fake_idp, grace=600))
    wait_ready(gw, 30)
    fake_idp.configure(status=503)
    gw.proc.send_signal(signal.SIGHUP)
    deadline = time.monotonic() + 30
    while "config reloaded" not in gw.logs() and time.monotonic() < deadline:
        time.sleep(0.1)
    assert "config reloaded" in gw.logs()
    # The process has had its answer; a new config's gateway does not make it cold.
    assert readyz(gw).status_code == 200


def test_an_idp_that_hangs_keeps_a_cold_pod_unready_with_one_probe_at_a_time(
    fake_idp: FakeIdP, gateway_factory: Any
) -> None:
    fake_idp.configure(hang=True)
    gw = gateway_factory(config(fake_idp, grace=600))
    for _ in range(3):
        # /readyz answers without waiting for the hung probe (kubelet would give up).
        assert readyz(gw).status_code == 503
    assert 1 <= fake_idp.calls <= 2  # one probe at a time, at most one every 2 s
    fake_idp.configure(hang=False)
    wait_ready(gw, 30)
