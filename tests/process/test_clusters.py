"""One gateway process serving several clusters (issue 37), over real sockets.

Each cluster's kube-apiserver calls with its own caller token. Every review line names
the caller's cluster, ``/metrics`` counts reviews and IdP calls per cluster, and the
fake IdP's own counts (by the tag after a token's last ``@``) agree. A reload (SIGHUP,
as docs/operations.md, "Add a cluster without a restart", says) adds a third cluster:
its kube-apiserver, refused before, is served and counted under the new name by the
same process. A reload whose ``clusters:`` gives one credential to two clusters is
refused in one line, and the clusters already served keep their names.
"""

from __future__ import annotations

import base64
import os
import re
import signal
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Protocol

import httpx
import yaml

from tests.support.backend_configs import userinfo_backend
from tests.support.fakes.idp import FakeIdP
from tests.support.procs import GatewayProcess, metric_value, review_body
from tests.support.prometheus_helpers import ops_port, wait_until


class Start(Protocol):
    def __call__(self, config: dict[str, Any], **kwargs: Any) -> GatewayProcess: ...


#: Each kube-apiserver's caller token: 32 random bytes, as the docs say to make one.
TOKENS = {name: base64.b64encode(os.urandom(32)).decode() for name in ("prod", "staging", "dev")}

REVIEWS = "authn_gateway_cluster_reviews_total"

CALLS = "authn_gateway_cluster_idp_calls_total"


def config(idp: FakeIdP, clusters: list[dict[str, Any]], tokens: list[str]) -> dict[str, Any]:
    return {
        # Metrics on their own port, as deploy/ serves them: the review port serves only
        # authenticated kube-apiservers.
        "server": {
            "ops": {"port": 0},
            "caller_tokens": [{"name": f"{n}-apiserver", "token": TOKENS[n]} for n in tokens],
        },
        "logging": {"reviews": True},
        "clusters": clusters,
        "backends": [userinfo_backend(idp)],
    }


def two_clusters(idp: FakeIdP) -> dict[str, Any]:
    clusters = [
        {"name": "prod", "caller_tokens": ["prod-apiserver"], "weight": 2},
        {"name": "staging", "caller_tokens": ["staging-apiserver"]},
    ]
    return config(idp, clusters, ["prod", "staging"])


def with_dev(idp: FakeIdP) -> dict[str, Any]:
    cfg = two_clusters(idp)
    cfg["clusters"].append({"name": "dev", "caller_tokens": ["dev-apiserver"]})
    cfg["server"]["caller_tokens"].append({"name": "dev-apiserver", "token": TOKENS["dev"]})
    return cfg


def review(gw: GatewayProcess, token: str, caller: str) -> httpx.Response:
    """A TokenReview as ``caller``'s kube-apiserver sends it: its bearer caller token."""
    return httpx.post(
        f"{gw.url}/authenticate?timeout=30s",
        json=review_body(token),
        headers={"Authorization": f"Bearer {TOKENS[caller]}"},
        timeout=10,
    )


def authenticated(gw: GatewayProcess, token: str, caller: str) -> bool:
    response = review(gw, token, caller)
    assert response.status_code == 200, response.text
    status: dict[str, Any] = response.json()["status"]
    assert "error" not in status, status
    return bool(status["authenticated"])


def scrape(gw: GatewayProcess) -> str:
    return httpx.get(f"http://127.0.0.1:{ops_port(gw)}/metrics", timeout=5).text


def review_lines(gw: GatewayProcess, count: int) -> list[str]:
    """The review log lines, once ``count`` of them are written (a writer thread
    writes them a little after each answer); exactly ``count``, one per review."""
    wait_until(lambda: len(_reviews(gw)) >= count, 10, f"{count} review lines")
    lines = _reviews(gw)
    assert len(lines) == count, lines
    return lines


def _reviews(gw: GatewayProcess) -> list[str]:
    return [line for line in gw.logs().splitlines() if "msg=review " in line]


def reload(gw: GatewayProcess, cfg: dict[str, Any], outcome: str) -> None:
    """Write ``cfg`` over the gateway's file and SIGHUP it; returns once ``outcome``
    ("config reloaded" or "config reload refused") is logged once more."""
    before = gw.logs().count(outcome)
    server = {**cfg["server"], "host": "127.0.0.1", "port": gw.port}
    gw.config_path.write_text(yaml.safe_dump({**cfg, "server": server}))
    gw.proc.send_signal(signal.SIGHUP)
    wait_until(lambda: gw.logs().count(outcome) > before, 15, outcome)


def test_each_clusters_reviews_are_logged_and_counted_under_its_name(
    fake_idp: FakeIdP, gateway_factory: Start
) -> None:
    gw = gateway_factory(two_clusters(fake_idp))
    for i in range(3):
        assert authenticated(gw, f"good-alice~{i}@prod", "prod")
        assert authenticated(gw, f"good-alice~{i}@prod", "prod")  # cached: no call
    for i in range(2):
        assert authenticated(gw, f"good-bob~{i}@staging", "staging")
    assert not authenticated(gw, "invalid-token@staging", "staging")
    # A caller with no token of a cluster is refused before anything is counted.
    anonymous = httpx.post(f"{gw.url}/authenticate", json=review_body("good-eve@x"), timeout=10)
    assert anonymous.status_code == 401

    text = scrape(gw)
    assert metric_value(text, REVIEWS, cluster="prod", answer="authenticated") == 6
    assert metric_value(text, REVIEWS, cluster="staging", answer="authenticated") == 2
    assert metric_value(text, REVIEWS, cluster="staging", answer="rejected") == 1
    assert metric_value(text, REVIEWS, cluster="default") == 0
    # The IdP's own counts, per tag, are the gateway's per cluster.
    by_tag = fake_idp.stats().by_tag
    assert by_tag["prod"].calls == 3 == metric_value(text, CALLS, backend="idp", cluster="prod")
    staging = metric_value(text, CALLS, backend="idp", cluster="staging")
    assert by_tag["staging"].calls == 3 == staging
    assert "x" not in by_tag

    lines = review_lines(gw, 9)
    for line in lines:
        caller = re.search(r" caller=token:(\w+)-apiserver", line)
        assert caller is not None, line
        assert line.endswith(f" cluster={caller.group(1)}"), line
    assert sum(line.endswith(" cluster=prod") for line in lines) == 6
    for token in TOKENS.values():
        assert token not in gw.logs()


def test_a_reload_adds_a_cluster_and_a_bad_one_is_refused_in_one_line(
    fake_idp: FakeIdP, gateway_factory: Start
) -> None:
    gw = gateway_factory(two_clusters(fake_idp))
    pid = gw.proc.pid
    assert authenticated(gw, "good-alice@prod", "prod")
    # dev's kube-apiserver is no caller yet.
    assert review(gw, "good-dora@dev", "dev").status_code == 401

    reload(gw, with_dev(fake_idp), "config reloaded")
    for i in range(2):
        assert authenticated(gw, f"good-dora~{i}@dev", "dev")
    assert authenticated(gw, "good-alice@prod", "prod")  # still cached: one call in all
    assert gw.proc.pid == pid and gw.proc.poll() is None  # no restart
    text = scrape(gw)
    assert metric_value(text, REVIEWS, cluster="dev", answer="authenticated") == 2
    assert metric_value(text, REVIEWS, cluster="prod", answer="authenticated") == 2
    assert fake_idp.stats().by_tag["dev"].calls == 2 == metric_value(text, CALLS, cluster="dev")
    assert fake_idp.stats().by_tag["prod"].calls == 1
    lines = review_lines(gw, 4)  # prod, then dev's two after the reload, then prod
    assert [line.rsplit(" cluster=", 1)[1] for line in lines] == ["prod", "dev", "dev", "prod"]

    # A fourth cluster given staging's credential: refused, in one line naming the field.
    bad = with_dev(fake_idp)
    bad["clusters"].append({"name": "qa", "caller_tokens": ["staging-apiserver"]})
    reload(gw, bad, "config reload refused")
    [refusal] = [line for line in gw.logs().splitlines() if "config reload refused" in line]
    assert (
        "clusters[3].caller_tokens[0]: 'staging-apiserver' is also clusters[1]'s: a "
        "credential names one cluster" in refusal
    ), refusal
    text = scrape(gw)
    assert metric_value(text, "authn_gateway_config_reloads_total", result="refused") == 1
    assert metric_value(text, "authn_gateway_config_last_reload_successful") == 0
    # The clusters served keep their names; qa is nowhere.
    assert authenticated(gw, "good-bob@staging", "staging")
    assert authenticated(gw, "good-dora~2@dev", "dev")
    text = scrape(gw)
    assert metric_value(text, REVIEWS, cluster="staging", answer="authenticated") == 1
    assert metric_value(text, REVIEWS, cluster="dev", answer="authenticated") == 3
    assert 'cluster="qa"' not in text
    lines = review_lines(gw, 6)
    assert lines[-2].endswith(" cluster=staging") and lines[-1].endswith(" cluster=dev")
    assert gw.proc.pid == pid
    for token in TOKENS.values():
        assert token not in gw.logs()


def soon(check: Callable[[], bool], what: str, seconds: float = 10.0) -> None:
    """Poll ``check`` every 20 ms (the join below has about a second to happen in)."""
    deadline = time.monotonic() + seconds
    while not check():
        assert time.monotonic() < deadline, f"never: {what}"
        time.sleep(0.02)


def refusal(response: httpx.Response) -> str:
    status: dict[str, Any] = response.json()["status"]
    assert not status["authenticated"], status
    return str(status.get("error", ""))


def test_a_review_that_joined_another_clusters_refused_call_makes_its_own(
    fake_idp: FakeIdP, gateway_factory: Start
) -> None:
    """prod has spent its share of the bucket (1/minute, burst 10; staging weighs 3) and
    storms on. Its review of a token waits for the one call slot (staging's call holds
    it), staging's review of the same token joins that call, and prod's call is then
    refused by prod's share: the IdP was not asked. staging asks under its own share:
    authenticated, and the IdP's own count for the token is one call."""
    backend = userinfo_backend(
        fake_idp,
        bucket={"rate": "1/minute", "burst": 10},
        concurrency={"initial_limit": 1, "min_limit": 1, "max_limit": 1},
        timeouts={"connect_seconds": 0.5, "read_seconds": 4.0, "total_seconds": 4.0},
    )
    clusters = [
        {"name": "prod", "caller_tokens": ["prod-apiserver"]},
        {"name": "staging", "caller_tokens": ["staging-apiserver"], "weight": 3},
    ]
    cfg = {**config(fake_idp, clusters, ["prod", "staging"]), "backends": [backend]}
    gw = gateway_factory(cfg)
    fake_idp.configure(latency=0.05)  # a latency the concurrency limit measures
    for i in range(20):  # prod's share and what staging's lends
        response = review(gw, f"junk-{i}@prod", "prod")
        if "outbound rate limit reached" in refusal(response):
            break
    assert "outbound rate limit reached" in refusal(response)
    fake_idp.configure(latency=1.5)

    def waiting() -> float:
        return metric_value(scrape(gw), "authn_gateway_concurrency_waiting", backend="idp")

    with ThreadPoolExecutor(3) as pool:
        hold = pool.submit(review, gw, "good-hold~@hold", "staging")
        soon(lambda: fake_idp.stats().by_tag.get("hold") is not None, "staging's call is out")
        first = pool.submit(review, gw, "good-carol~@shared", "prod")
        soon(lambda: waiting() == 1, "prod's call waits for the slot")
        second = pool.submit(review, gw, "good-carol~@shared", "staging")
        soon(
            lambda: metric_value(scrape(gw), "authn_gateway_coalesced_waiters_total") == 1,
            "staging's review joined prod's call",
        )
        assert hold.result().status_code == 200
        prod, staging = first.result(), second.result()
    assert "outbound rate limit reached" in refusal(prod)
    assert staging.status_code == 200 and staging.json()["status"]["authenticated"], staging.text
    assert fake_idp.stats().by_tag["shared"].calls == 1


def test_each_clusters_wait_for_a_call_slot_is_recorded_under_its_name(
    fake_idp: FakeIdP, gateway_factory: Start
) -> None:
    """Two clusters' never-seen tokens at once against an IdP that takes 0.2 s and a
    limit of two calls in flight: each call's wait for its slot is a sample of
    authn_gateway_cluster_queue_wait_seconds under its own cluster (one per IdP call,
    as the IdP counts them), and the calls that queued show in each cluster's sum."""
    backend = userinfo_backend(
        fake_idp,
        concurrency={"initial_limit": 2, "min_limit": 2, "max_limit": 2},
        timeouts={"connect_seconds": 0.5, "read_seconds": 4.0, "total_seconds": 4.0},
    )
    cfg = {**two_clusters(fake_idp), "backends": [backend]}
    gw = gateway_factory(cfg)
    fake_idp.configure(latency=0.05)
    for i in range(4):  # measured: from here on a call may wait for a slot
        assert authenticated(gw, f"good-warm~{i}@prod", "prod")
    fake_idp.configure(latency=0.2)
    with ThreadPoolExecutor(8) as pool:
        answers = [
            pool.submit(review, gw, f"good-u{i}~@{cluster}", cluster)
            for i in range(4)
            for cluster in ("prod", "staging")
        ]
        assert all(a.result().status_code == 200 for a in answers)
    text = scrape(gw)
    wait = "authn_gateway_cluster_queue_wait_seconds"
    by_tag = fake_idp.stats().by_tag
    for cluster in ("prod", "staging"):
        calls = by_tag[cluster].calls
        assert calls >= 2, (cluster, calls)
        samples = metric_value(text, f"{wait}_count", backend="idp", cluster=cluster)
        assert samples == calls, (cluster, samples, calls)
        assert metric_value(text, f"{wait}_bucket", cluster=cluster, le="+Inf") == calls
        assert metric_value(text, f"{wait}_sum", backend="idp", cluster=cluster) > 0, cluster
    assert f'{wait}_count{{backend="idp",cluster="default"}}' not in text
