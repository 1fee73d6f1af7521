"""Brownouts on real processes: a gateway process in front of the fake IdP in capacity
mode or answering late. Every guarantee is asserted on the IdP's own counters."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

import httpx

from tests.support.backend_configs import userinfo_backend
from tests.support.fakes.idp import FakeIdP
from tests.support.procs import GatewayProcess, metric_value, review_body

GatewayFactory = Callable[..., GatewayProcess]


def review(gw: GatewayProcess, token: str) -> dict[str, Any]:
    with httpx.Client(timeout=30) as client:
        resp = client.post(f"{gw.url}/authenticate", json=review_body(token))
    assert resp.status_code == 200
    status: dict[str, Any] = resp.json()["status"]
    return status


def concurrently(n: int, target: Callable[[int], None]) -> None:
    threads = [threading.Thread(target=target, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()


def slow_call_gateway(fake_idp: FakeIdP, gateway_factory: GatewayFactory) -> GatewayProcess:
    """A breaker that only the slow-call rule can open (fail_max high; every answer is a
    200): 80 % of at least 10 calls slower than 0.3 s."""
    backend = userinfo_backend(
        fake_idp,
        breaker={
            "fail_max": 1000,
            "reset_timeout_seconds": 30,
            "slow_calls": {
                "duration_threshold_seconds": 0.3,
                "rate_threshold": 0.8,
                "window_seconds": 60,
                "min_calls": 10,
            },
        },
    )
    return gateway_factory({"backends": [backend]})


def test_an_idp_that_answers_every_call_late_is_cut_off_by_the_slow_call_rule(
    fake_idp: FakeIdP, gateway_factory: GatewayFactory
) -> None:
    gw = slow_call_gateway(fake_idp, gateway_factory)
    fake_idp.configure(latency=0.4)
    answers: list[bool] = []
    concurrently(10, lambda i: answers.append(review(gw, f"good-slow{i}")["authenticated"]))
    assert answers == [True] * 10
    assert fake_idp.stats().calls == 10
    metrics = httpx.get(f"{gw.url}/metrics").text
    assert metric_value(metrics, "authn_gateway_breaker_state", state="open") == 1
    # Open: new tokens are answered without the IdP.
    for i in range(5):
        assert review(gw, f"good-after{i}").get("error")
    assert fake_idp.stats().calls == 10


def test_slow_calls_under_the_rate_leave_the_breaker_closed(
    fake_idp: FakeIdP, gateway_factory: GatewayFactory
) -> None:
    gw = slow_call_gateway(fake_idp, gateway_factory)
    fake_idp.configure(latency=0.4)
    concurrently(5, lambda i: review(gw, f"good-slow{i}"))
    fake_idp.configure(latency=0.0)
    for i in range(10):
        review(gw, f"good-fast{i}")
    assert review(gw, "good-last")["authenticated"]
    # 5 slow and 11 fast of 16: every one reached the IdP.
    assert fake_idp.stats().calls == 16
    metrics = httpx.get(f"{gw.url}/metrics").text
    assert metric_value(metrics, "authn_gateway_breaker_state", state="closed") == 1


def flood_cold(gw: GatewayProcess, n: int, prefix: str) -> list[dict[str, Any]]:
    answers: list[dict[str, Any]] = []
    concurrently(n, lambda i: answers.append(review(gw, f"good-{prefix}{i}")))
    return answers


def saturated_backend(idp: FakeIdP, concurrency: dict[str, Any]) -> dict[str, Any]:
    return userinfo_backend(
        idp,
        breaker={"fail_max": 1000, "reset_timeout_seconds": 30, "slow_calls": None},
        concurrency=concurrency,
        # Wide margins on a shared machine: two calls in flight take 0.4 s at the IdP.
        timeouts={"connect_seconds": 1.0, "read_seconds": 2.0, "total_seconds": 2.0},
    )


def test_under_the_limit_the_idp_does_no_work_for_callers_that_gave_up(
    fake_idp: FakeIdP, gateway_factory: GatewayFactory
) -> None:
    # One worker, 200 ms a call: ten calls fit in the 2 s call timeout, not thirty.
    gw = gateway_factory(
        {"backends": [saturated_backend(fake_idp, {"initial_limit": 2, "max_limit": 2})]}
    )
    fake_idp.configure(capacity=1, service_time=0.2)
    answers = flood_cold(gw, 30, "cold")
    wait_until_idle(fake_idp)
    st = fake_idp.stats()
    authenticated = sum(1 for a in answers if a["authenticated"])
    # Refused at once rather than queued at the IdP: nothing wasted, nothing expired,
    # every call the IdP served answered a review.
    assert st.wasted == 0 and st.expired == 0
    assert st.served == authenticated >= 2
    assert st.max_queued <= 2
    refused = [a["error"] for a in answers if not a["authenticated"]]
    assert refused and all("saturated" in e for e in refused)


def test_without_the_limit_the_same_flood_wastes_idp_work(
    fake_idp: FakeIdP, gateway_factory: GatewayFactory
) -> None:
    # The control for the test above: it must be able to fail.
    gw = gateway_factory({"backends": [saturated_backend(fake_idp, {"enabled": False})]})
    fake_idp.configure(capacity=1, service_time=0.2)
    flood_cold(gw, 30, "cold")
    wait_until_idle(fake_idp)
    st = fake_idp.stats()
    assert st.wasted > 0
    assert st.max_queued > 4


def wait_until_idle(idp: FakeIdP, timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while idp.stats().in_flight:
        assert time.monotonic() < deadline, "the fake IdP never drained its queue"
        time.sleep(0.05)
