"""The load harness: kube-apiserver's retry policy, the fake Keystone, and a bounded run.

Figures are printed by the harness, never asserted here (2 shared cores).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from loadtests.locustfile import (
    Attempt,
    Retrier,
    RetryPolicy,
    call_with_retries,
    classify,
    service_account_jwt,
)
from tests.support.fakes.idp import FakeIdP
from tests.support.fakes.keystone import FakeKeystone, mint_token


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.now += seconds


def delays(retrier: Retrier, clock: Clock, results: list[Attempt]) -> list[float]:
    """Feed results in turn; return the waits asked for until the policy stops."""
    out = []
    for r in results:
        d = retrier.after(r.status, retry_after=r.retry_after, connection_reset=r.connection_reset)
        if d is None:
            break
        out.append(d)
        clock.sleep(d)
    return out


@pytest.mark.parametrize("status", [500, 502, 504, 429])
def test_retryable_status_gets_five_attempts_with_growing_backoff(status: int) -> None:
    clock = Clock()
    waits = delays(Retrier(clock=clock, rng=lambda: 0.0), clock, [Attempt(status)] * 10)
    assert waits == pytest.approx([0.5, 0.75, 1.125, 1.6875])


def test_backoff_jitter_adds_at_most_a_fifth() -> None:
    clock = Clock()
    waits = delays(Retrier(clock=clock, rng=lambda: 1.0), clock, [Attempt(500)] * 10)
    assert waits == pytest.approx([0.6, 0.9, 1.35, 2.025])


@pytest.mark.parametrize("status", [200, 400, 401, 403, 404, 503])
def test_answers_that_stand_are_not_retried(status: int) -> None:
    assert Retrier().after(status) is None


def test_connection_reset_is_retried_but_refused_connection_is_not() -> None:
    assert Retrier(rng=lambda: 0.0).after(None, connection_reset=True) == pytest.approx(0.5)
    assert Retrier().after(None) is None


def test_retry_after_means_once_a_second_for_thirty_seconds_then_backoff() -> None:
    clock = Clock()
    retrier = Retrier(clock=clock, rng=lambda: 0.0)
    waits = delays(retrier, clock, [Attempt(429, retry_after=True)] * 100)
    # 30 one-second waits while Retry-After lasts, then the 4 backoff waits of a 429.
    assert waits[:30] == [1.0] * 30
    assert waits[30:] == pytest.approx([0.5, 0.75, 1.125, 1.6875])


def test_503_with_retry_after_waits_like_client_go_then_stops() -> None:
    clock = Clock()
    waits = delays(Retrier(clock=clock), clock, [Attempt(503, retry_after=True)] * 100)
    assert waits == [1.0] * 30


def test_success_after_failures_ends_the_retries() -> None:
    clock = Clock()
    results = [Attempt(500), Attempt(429), Attempt(200)]
    assert len(delays(Retrier(clock=clock, rng=lambda: 0.0), clock, results)) == 2


@pytest.fixture
def idp() -> Iterator[FakeIdP]:
    fake = FakeIdP().start_in_thread()
    yield fake
    fake.stop()


def http_attempt(client: httpx.Client, url: str) -> Attempt:
    try:
        r = client.get(url, headers={"Authorization": "Bearer good-x"})
    except httpx.ConnectError:
        return Attempt(None)
    return Attempt(r.status_code, retry_after="retry-after" in r.headers, body=r.content)


FAST = RetryPolicy(initial=0.01, retry_after_interval=0.05, retry_after_window=0.5)


def test_server_answering_500_receives_exactly_five_attempts(idp: FakeIdP) -> None:
    idp.configure(status=500)
    with httpx.Client() as client:
        result, attempts = call_with_retries(lambda: http_attempt(client, idp.url), Retrier(FAST))
    assert (result.status, attempts, idp.calls) == (500, 5, 5)


def test_server_answering_429_with_retry_after_is_polled_then_backed_off(idp: FakeIdP) -> None:
    idp.configure(status=429, retry_after=1)
    with httpx.Client() as client:
        result, attempts = call_with_retries(lambda: http_attempt(client, idp.url), Retrier(FAST))
    # 0.5 s of 0.05 s waits (about 10 polls, fewer if the loop runs slow), then 4 backoffs.
    assert result.status == 429
    assert 6 <= attempts <= 16
    assert idp.calls == attempts


def test_server_that_recovers_mid_retries_ends_them(idp: FakeIdP) -> None:
    idp.configure(status=500)
    with httpx.Client() as client:

        def attempt() -> Attempt:
            if idp.calls == 2:
                idp.configure(status=None)
            return http_attempt(client, idp.url)

        result, attempts = call_with_retries(attempt, Retrier(FAST))
    assert (result.status, attempts) == (200, 3)


def test_refused_connection_is_one_attempt() -> None:
    with httpx.Client() as client:
        result, attempts = call_with_retries(
            lambda: http_attempt(client, "http://127.0.0.1:9/userinfo"), Retrier(FAST)
        )
    assert (result.status, attempts) == (None, 1)


def test_service_account_jwt_is_what_the_gateway_prerejects() -> None:
    import random

    from authn_gateway.review.prerejection import is_service_account_jwt

    token = service_account_jwt("kube-system", "default", random.Random(1))
    assert token.startswith("eyJ") and token.count(".") == 2
    assert is_service_account_jwt(token)


def test_answers_are_classified_as_kube_apiserver_reads_them() -> None:
    assert classify(200, b'{"status": {"authenticated": true}}') == "authenticated"
    assert classify(200, b'{"status": {"authenticated": false}}') == "rejected"
    assert classify(200, b'{"status": {"authenticated": false, "error": "x"}}') == "unavailable"
    assert classify(500, b"") == "http_500"


@pytest.fixture
def keystone() -> Iterator[FakeKeystone]:
    fake = FakeKeystone().start_in_thread()
    yield fake
    fake.stop()


def service_token(
    client: httpx.Client, base: str, password: str = "GatewayPass123"
) -> httpx.Response:
    body = {
        "auth": {
            "identity": {
                "methods": ["password"],
                "password": {
                    "user": {
                        "name": "authn-gateway",
                        "domain": {"name": "Default"},
                        "password": password,
                    }
                },
            },
            "scope": {"system": {"all": True}},
        }
    }
    return client.post(f"{base}/v3/auth/tokens", json=body)


def test_fake_keystone_answers_with_the_recorded_statuses(keystone: FakeKeystone) -> None:
    base = f"http://127.0.0.1:{keystone.port}"
    with httpx.Client() as client:
        assert service_token(client, base, "wrong").status_code == 401
        issued = service_token(client, base)
        assert issued.status_code == 201
        svc = issued.headers["x-subject-token"]
        alice = mint_token("alice")
        url = f"{base}/v3/auth/tokens?nocatalog"
        ok = client.get(url, headers={"X-Auth-Token": svc, "X-Subject-Token": alice})
        assert ok.status_code == 200
        assert ok.json()["token"]["user"]["name"] == "alice"
        assert "catalog" not in ok.json()["token"]
        tampered = alice[:-4] + ("AAAA" if alice[-4:] != "AAAA" else "BBBB")
        bad = client.get(url, headers={"X-Auth-Token": svc, "X-Subject-Token": tampered})
        assert bad.status_code == 404
        expired = mint_token("alice", expires_at=1.0)
        assert (
            client.get(url, headers={"X-Auth-Token": svc, "X-Subject-Token": expired}).status_code
            == 404
        )
        unknown_caller = client.get(
            url, headers={"X-Auth-Token": "garbage", "X-Subject-Token": alice}
        )
        assert unknown_caller.status_code == 401
        assert unknown_caller.headers["www-authenticate"].startswith("Keystone uri=")
        user_caller = client.get(url, headers={"X-Auth-Token": alice, "X-Subject-Token": alice})
        assert user_caller.status_code == 403


def test_fake_keystone_incident_fault_refuses_every_service_token(keystone: FakeKeystone) -> None:
    base = f"http://127.0.0.1:{keystone.port}"
    with httpx.Client() as client:
        svc = service_token(client, base).headers["x-subject-token"]
        keystone.configure(reject_service_tokens=True)
        r = client.get(
            f"{base}/v3/auth/tokens?nocatalog",
            headers={"X-Auth-Token": svc, "X-Subject-Token": mint_token("alice")},
        )
        assert r.status_code == 401
        # Logging in still works: the new token is refused too, as in the incident.
        assert service_token(client, base).status_code == 201


def test_poisson_schedule_keeps_the_rate_and_catches_up_after_a_slow_review() -> None:
    import random

    from loadtests.locustfile import PoissonSchedule

    now = [0.0]
    schedule = PoissonSchedule(2.0, clock=lambda: now[0], rng=random.Random(1))
    for _ in range(2000):
        now[0] += schedule.wait() + 0.05  # each review takes 50 ms
    # 2000 reviews at 2/s: about 1000 s (a constant 0.5 s gap plus 50 ms would be 1100).
    assert 900 < now[0] < 1080
    now[0] += 10.0  # a review that took 10 s: the next one is not held back further
    assert schedule.wait() == 0.0


def _synthetic_run(mode: str, seconds: int = 40) -> Any:
    """A run's result shaped as run_once records it: one timeline row and two samples a
    second, the IdP down from 12 s to 28 s (idp-outage's steps)."""
    from loadtests.run import Result, Sample

    down = range(12, 28)
    rows = [
        {
            "t": 1000.0 + s,
            "attempts": 400,
            "answers": {
                "authenticated": 360 if mode == "gateway" or s not in down else 0,
                "rejected": 40,
                "unavailable": (20 if mode == "gateway" else 360) if s in down else 0,
            },
            "statuses": {"200": 400},
            "p50_ms": 5.0,
            "p99_ms": 20.0,
        }
        for s in range(seconds)
    ]
    calls = 0
    samples = []
    for half in range(2 * seconds):
        calls += (
            0 if mode == "gateway" and half // 2 in down else (10 if mode == "gateway" else 200)
        )
        breaker = "open" if mode == "gateway" and half // 2 in down else "closed"
        samples.append(Sample(1000.0 + half / 2, calls, breaker, 0.0, 0.0, 0.0))
    marks = [(12.0, "IdP down (500)"), (28.0, "IdP back")]
    return Result(mode, 1000.0, float(seconds), {"rows": rows}, samples, {}, marks)


def test_the_plot_keeps_legends_and_fault_names_off_the_data_and_shows_both_sides() -> None:
    # The drawing is the loadtest extra's (matplotlib); the unit tier runs without it.
    pytest.importorskip("matplotlib", reason="the loadtest extra draws the plots")
    from matplotlib.transforms import Bbox

    from loadtests.run import ANSWER_COLORS, figure
    from loadtests.scenarios import SCENARIOS

    scenario = SCENARIOS["idp-outage"]
    fig = figure(scenario, [_synthetic_run("gateway"), _synthetic_run("pass-through")])
    renderer = fig.canvas.get_renderer()
    axes = fig.get_axes()
    plotted = [Bbox(ax.get_window_extent(renderer)) for ax in axes]
    legends = [ax.get_legend() for ax in axes if ax.get_legend() is not None]
    assert len(legends) >= 3
    for legend in legends:
        box = legend.get_window_extent(renderer)
        overlaps = [i for i, area in enumerate(plotted) if box.overlaps(area)]
        assert overlaps == [], f"legend {[t.get_text() for t in legend.get_texts()]} on {overlaps}"
    names = [a for a in axes[0].texts if a.get_text() in ("IdP down (500)", "IdP back")]
    assert len(names) == 2
    for name in names:
        box = name.get_window_extent(renderer)
        # Above the first panel, not on its data, and clear of every legend.
        assert box.y0 >= plotted[0].y1 - 1, (name.get_text(), box, plotted[0])
        for legend in legends:
            assert not box.overlaps(legend.get_window_extent(renderer)), name.get_text()
    # Answers by outcome for both sides: each colour drawn solid (gateway) and dotted
    # (the pass-through webhook), and the legend says which style is which.
    drawn = {(line.get_color(), line.get_linestyle()) for line in axes[0].get_lines()}
    from matplotlib.colors import to_hex

    drawn = {(to_hex(color), style) for color, style in drawn}
    for color in ANSWER_COLORS.values():
        assert {(to_hex(color), "-"), (to_hex(color), ":")} <= drawn, (color, drawn)
    labels = [t.get_text() for t in axes[0].get_legend().get_texts()]
    assert "gateway" in labels and "pass-through (naive webhook)" in labels, labels
    import matplotlib.pyplot as plt

    plt.close(fig)
