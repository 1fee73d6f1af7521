"""Failed admin authentications are counted and limited (issue 29, finding 12).

Before, ``admin.token: "a"`` was found by guessing and 2,778 wrong guesses a second
were answered 401, none counted or slowed. Now the token must be strong
(tests/{process,unit}/test_secrets.py), and every failure is counted and limited per source address
and overall, while an operator at a clean address still gets in. The guard's rules are
checked on its own clock; the numbers on a real server over real sockets.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from pydantic import SecretStr
from starlette.requests import Request

from authn_gateway.observe.metrics import Metrics
from authn_gateway.serve import admin_auth
from authn_gateway.serve.admin_auth import AdminGuard
from tests.support.admin_auth_helpers import TOKEN


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def request(source: str, authorization: str | None) -> Request:
    headers = [] if authorization is None else [(b"authorization", authorization.encode())]
    return Request(
        {
            "type": "http",
            "method": "GET",
            "path": "/admin/deny",
            "headers": headers,
            "client": (source, 40000),
        }
    )


def failures(metrics: Metrics, reason: str) -> float:
    value = metrics.registry.get_sample_value(
        "authn_gateway_admin_auth_failures_total", {"reason": reason}
    )
    return value or 0.0


@pytest.fixture
def guard() -> Iterator[tuple[AdminGuard, Clock, Metrics]]:
    clock, metrics = Clock(), Metrics()
    yield AdminGuard(SecretStr(TOKEN), metrics, clock=clock), clock, metrics


def status(guard: AdminGuard, source: str, authorization: str | None) -> int:
    refused = guard.refusal(request(source, authorization))
    return 200 if refused is None else refused.status_code


def test_the_right_token_passes_and_is_never_counted(
    guard: tuple[AdminGuard, Clock, Metrics],
) -> None:
    g, _, metrics = guard
    for _ in range(50):
        assert status(g, "10.0.0.1", f"Bearer {TOKEN}") == 200
    assert status(g, "10.0.0.1", f"bearer   {TOKEN} ") == 200  # RFC 6750: scheme any case
    for reason in ("missing", "wrong", "throttled"):
        assert failures(metrics, reason) == 0, reason


def test_a_source_gets_ten_failures_then_429_unchecked_then_one_every_six_seconds(
    guard: tuple[AdminGuard, Clock, Metrics],
) -> None:
    g, clock, metrics = guard
    seen = [status(g, "10.0.0.9", "Bearer guess") for _ in range(12)]
    assert seen == [401] * 10 + [429] * 2, seen
    refused = g.refusal(request("10.0.0.9", "Bearer guess"))
    assert refused is not None and refused.headers["retry-after"] == "6"
    # Throttled means unchecked: even the right token is not looked at.
    assert status(g, "10.0.0.9", f"Bearer {TOKEN}") == 429
    assert (failures(metrics, "wrong"), failures(metrics, "throttled")) == (10, 4)
    clock.now += 6.0
    assert [status(g, "10.0.0.9", "Bearer guess") for _ in range(2)] == [401, 429]
    clock.now += 6.0
    assert status(g, "10.0.0.9", f"Bearer {TOKEN}") == 200
    # A full minute refills the burst.
    clock.now += 60.0
    assert [status(g, "10.0.0.9", None) for _ in range(11)] == [401] * 10 + [429]
    assert failures(metrics, "missing") == 10


def test_another_address_still_gets_in_while_one_is_throttled(
    guard: tuple[AdminGuard, Clock, Metrics],
) -> None:
    g, _, _ = guard
    for _ in range(30):
        status(g, "10.0.0.9", "Bearer guess")
    assert status(g, "10.0.0.9", "Bearer guess") == 429
    assert status(g, "10.0.0.10", f"Bearer {TOKEN}") == 200


def test_past_the_overall_budget_suspect_sources_wait_and_clean_ones_are_still_checked(
    guard: tuple[AdminGuard, Clock, Metrics],
) -> None:
    g, clock, metrics = guard
    # 100 failures from 100 addresses: each under its own limit, the overall one spent.
    for i in range(100):
        assert status(g, f"10.1.0.{i}", "Bearer guess") == 401
    # A source that failed recently now waits, whatever it sends.
    assert status(g, "10.1.0.5", "Bearer guess") == 429
    assert status(g, "10.1.0.5", f"Bearer {TOKEN}") == 429
    # A new address is checked: the operator gets in; a guesser gets one try, then waits.
    assert status(g, "10.2.0.1", f"Bearer {TOKEN}") == 200
    assert status(g, "10.2.0.2", "Bearer guess") == 401
    assert status(g, "10.2.0.2", "Bearer guess") == 429
    # The overall budget refills at one a second.
    clock.now += 1.0
    assert status(g, "10.1.0.5", "Bearer guess") == 401
    assert status(g, "10.1.0.5", "Bearer guess") == 429
    # Past the suspect window and the refill, an old failure is forgotten.
    clock.now += admin_auth.SUSPECT_SECONDS
    assert status(g, "10.1.0.6", f"Bearer {TOKEN}") == 200
    assert failures(metrics, "wrong") == 102


def test_a_full_table_counts_unknown_sources_as_suspect_once_the_budget_is_spent() -> None:
    clock, metrics = Clock(), Metrics()
    g = AdminGuard(SecretStr(TOKEN), metrics, clock=clock, max_sources=5)
    for i in range(100):  # every one still suspect: the table stays full
        status(g, f"10.3.0.{i}", "Bearer guess")
    # Cycling to new addresses cannot wash a record clean.
    assert status(g, "10.4.0.1", "Bearer guess") == 429
    assert status(g, "10.4.0.1", f"Bearer {TOKEN}") == 429
    # Once the overall budget has refilled, every address is checked again.
    clock.now += admin_auth.SUSPECT_SECONDS + 120
    assert status(g, "10.4.0.1", f"Bearer {TOKEN}") == 200


def test_an_empty_admin_token_that_bypassed_the_config_matches_nothing() -> None:
    g = AdminGuard(SecretStr(""), Metrics(), clock=Clock())
    for header in ("Bearer ", "Bearer", "", "Bearer \t"):
        assert status(g, "10.5.0.1", header) == 401, repr(header)
