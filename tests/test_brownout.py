"""Brownouts on real processes: a gateway process in front of the fake IdP in capacity
mode or answering late. Every guarantee is asserted on the IdP's own counters."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

import httpx

from loadtests.fakes.idp import FakeIdP
from tests.conftest import userinfo_backend
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


def test_an_idp_that_answers_every_call_late_is_cut_off_by_the_slow_call_rule(
    fake_idp: FakeIdP, gateway_factory: GatewayFactory
) -> None:
    backend = userinfo_backend(
        fake_idp,
        # fail_max high: only the slow-call rule can open it (every answer is a 200).
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
    gw = gateway_factory({"backends": [backend]})
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
    gw = gateway_factory({"backends": [backend]})
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
