"""The gateway's own delay is not the IdP's: a real gateway process is frozen (SIGSTOP)
while its call is at the fake IdP, so the IdP's answer waits unread in the socket, as it
does when a starved CPU or a flood of reviews keeps the gateway's event loop behind.
Asserted on the IdP's own call counter: whether the breaker let the next call through."""

from __future__ import annotations

import os
import signal
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
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


@contextmanager
def frozen(gw: GatewayProcess) -> Iterator[None]:
    os.kill(gw.proc.pid, signal.SIGSTOP)
    try:
        yield
    finally:
        os.kill(gw.proc.pid, signal.SIGCONT)


def review_frozen_mid_call(
    gw: GatewayProcess, idp: FakeIdP, token: str, freeze: float
) -> dict[str, Any]:
    """Review ``token``; once the IdP has the call, freeze the gateway for ``freeze`` s."""
    before = idp.stats().calls
    answer: dict[str, Any] = {}
    t = threading.Thread(target=lambda: answer.update(review(gw, token)))
    t.start()
    deadline = time.monotonic() + 10
    while idp.stats().calls == before:
        assert time.monotonic() < deadline, "the gateway never called the IdP"
        time.sleep(0.005)
    with frozen(gw):
        time.sleep(freeze)
    t.join(timeout=30)
    return answer


def backend(idp: FakeIdP, **breaker: Any) -> dict[str, Any]:
    # One failure opens it: a single timeout counted against the IdP would show.
    return userinfo_backend(
        idp, breaker={"fail_max": 1, "reset_timeout_seconds": 60, "slow_calls": None, **breaker}
    )


def test_a_timeout_spent_waiting_for_the_gateways_own_loop_does_not_open_the_breaker(
    fake_idp: FakeIdP, gateway_factory: GatewayFactory
) -> None:
    gw = gateway_factory({"backends": [backend(fake_idp)]})
    review(gw, "good-warm")  # the loop's lag monitor runs from the first call
    fake_idp.configure(latency=0.1)
    # The IdP answers in 0.1 s; the gateway reads it 1.5 s later, past its 1 s timeout.
    answer = review_frozen_mid_call(gw, fake_idp, "good-frozen", freeze=1.5)
    assert not answer["authenticated"]
    metrics = httpx.get(f"{gw.url}/metrics").text
    assert metric_value(metrics, "authn_gateway_backend_own_timeouts_total") == 1
    # Still closed: the next never-seen token reaches the IdP.
    calls = fake_idp.stats().calls
    assert review(gw, "good-next")["authenticated"]
    assert fake_idp.stats().calls == calls + 1


def test_a_timeout_at_the_idp_still_opens_the_breaker(
    fake_idp: FakeIdP, gateway_factory: GatewayFactory
) -> None:
    # The control: the same timeout, spent at the IdP, is the IdP's failure.
    gw = gateway_factory({"backends": [backend(fake_idp)]})
    review(gw, "good-warm")
    fake_idp.configure(latency=1.5)
    assert not review(gw, "good-hung")["authenticated"]
    fake_idp.configure(latency=0.0)
    calls = fake_idp.stats().calls
    assert not review(gw, "good-next")["authenticated"]
    assert fake_idp.stats().calls == calls  # open: not asked
    metrics = httpx.get(f"{gw.url}/metrics").text
    assert metric_value(metrics, "authn_gateway_backend_own_timeouts_total") == 0


def test_an_answer_left_unread_by_a_frozen_gateway_is_not_a_slow_call(
    fake_idp: FakeIdP, gateway_factory: GatewayFactory
) -> None:
    slow = {"duration_threshold_seconds": 0.3, "rate_threshold": 0.5, "min_calls": 1}
    gw = gateway_factory(
        {
            "backends": [
                backend(
                    fake_idp,
                    fail_max=1000,
                    slow_calls=slow,
                )
                | {"timeouts": {"connect_seconds": 1.0, "read_seconds": 3.0, "total_seconds": 3.0}}
            ]
        }
    )
    review(gw, "good-warm")
    # Answered in 50 ms, read 0.8 s later: 0.85 s by the clock, 50 ms of it the IdP's.
    fake_idp.configure(latency=0.05)
    assert review_frozen_mid_call(gw, fake_idp, "good-frozen", freeze=0.8)["authenticated"]
    metrics = httpx.get(f"{gw.url}/metrics").text
    assert metric_value(metrics, "authn_gateway_backend_slow_calls_total") == 0
    assert metric_value(metrics, "authn_gateway_backend_call_own_delay_seconds_total") >= 0.5
    calls = fake_idp.stats().calls
    assert review(gw, "good-next")["authenticated"]
    assert fake_idp.stats().calls == calls + 1
    # The control: an IdP slow by itself is a slow call and opens the breaker (3 of the
    # window's 6 calls reach the 0.5 rate).
    fake_idp.configure(latency=0.5)
    for i in range(3):
        assert review(gw, f"good-slow{i}")["authenticated"]
    fake_idp.configure(latency=0.0)
    calls = fake_idp.stats().calls
    assert not review(gw, "good-after")["authenticated"]
    assert fake_idp.stats().calls == calls
