"""The monitoring assets against the real thing: a Prometheus server scraping a running
gateway, promtool on the scrape and on the alert rules, and the dashboard's queries."""

from __future__ import annotations

import json
import re
import subprocess
import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from tests.support.backend_configs import userinfo_backend
from tests.support.fakes.idp import FakeIdP
from tests.support.procs import (
    start_gateway,
)
from tests.support.prometheus_helpers import (
    ROOT,
    Stack,
    binary,
    ops_port,
    rule_groups,
    running_prometheus,
    wait_until,
)

DASHBOARD = ROOT / "deploy" / "base" / "dashboard" / "grafana-dashboard.json"


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    workdir = tmp_path_factory.mktemp("prometheus")
    idp = FakeIdP(control_port=0).start_in_thread()
    config = {
        "server": {"ops": {"port": 0}},
        "logging": {"reviews": False},
        "backends": [
            userinfo_backend(
                idp, breaker={"fail_max": 2, "reset_timeout_seconds": 600, "half_open_probes": 1}
            )
        ],
    }
    gateway = start_gateway(config, workdir)
    try:
        metrics_port = ops_port(gateway)
        with running_prometheus(workdir, metrics_port) as url:
            yield Stack(idp, gateway, metrics_port, url)
    finally:
        gateway.stop()
        idp.stop()


def test_prometheus_sees_the_breaker_open_when_the_idp_fails(stack: Stack) -> None:
    expr = 'authn_gateway_breaker_state{backend="idp",state="open"}'
    # Scraped while the IdP is healthy: the breaker is closed.
    assert stack.gateway.review("good-alice").json()["status"]["authenticated"] is True
    wait_until(lambda: stack.value(expr) == 0, what="a scrape showing the breaker closed")

    stack.idp.configure(status=500)
    for i in range(3):
        body = stack.gateway.review(f"good-user{i}").json()
        assert body["status"]["authenticated"] is False
        assert "error" in body["status"]
    wait_until(lambda: stack.value(expr) == 1, what="a scrape showing the breaker open")

    # Both states are in the stored series, closed first.
    now = time.time()
    series = httpx.get(
        f"{stack.prometheus}/api/v1/query_range",
        params={"query": expr, "start": now - 120, "end": now, "step": "1s"},
        timeout=5,
    ).json()["data"]["result"][0]["values"]
    values = [float(v) for _, v in series]
    assert values[0] == 0 and values[-1] == 1
    assert values.index(1) > 0

    # The alert rule, loaded into this Prometheus, is pending (it fires after 1 minute).
    def breaker_alert() -> dict[str, Any] | None:
        alerts = httpx.get(f"{stack.prometheus}/api/v1/alerts", timeout=5).json()
        for alert in alerts["data"]["alerts"]:
            if alert["labels"]["alertname"] == "AuthnGatewayBreakerOpen":
                return dict(alert)
        return None

    alert = wait_until(breaker_alert, what="the AuthnGatewayBreakerOpen alert")
    assert alert["labels"]["backend"] == "idp"
    assert alert["state"] in ("pending", "firing")


def test_a_real_scrape_passes_promtool_check_metrics(stack: Stack) -> None:
    stack.gateway.review("good-bob")
    stack.gateway.review("not-a-good-token")
    scrape = httpx.get(f"http://127.0.0.1:{stack.metrics_port}/metrics", timeout=5).text
    assert "authn_gateway_reviews_total" in scrape
    result = subprocess.run(
        [binary("promtool"), "check", "metrics"],
        input=scrape,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0, result.stdout + result.stderr


def _dashboard_exprs() -> list[str]:
    dashboard = json.loads(DASHBOARD.read_text())
    # A row (type "row") groups the panels below it and queries nothing.
    return [t["expr"] for p in dashboard["panels"] for t in p.get("targets", [])]


def test_dashboard_and_rules_use_only_metrics_the_gateway_exports(stack: Stack) -> None:
    scrape = httpx.get(f"http://127.0.0.1:{stack.metrics_port}/metrics", timeout=5).text
    families = set(re.findall(r"^# TYPE (\S+) ", scrape, re.MULTILINE))
    exprs = _dashboard_exprs() + [r["expr"] for g in rule_groups() for r in g["rules"]]
    # Recording rules' names (level:metric:operations) are made by the rules themselves.
    exprs = [re.sub(r"\bauthn_gateway_\w*:[\w:]+", "", e) for e in exprs]
    used = {name for e in exprs for name in re.findall(r"\bauthn_gateway_\w+", e)}
    assert used
    for name in used:
        # Counters with samples are typed under the family name, without "_total".
        family = re.sub(r"_(total|bucket|sum|count)$", "", name)
        assert name in families or family in families, f"{name} is not exported"


def test_every_dashboard_query_is_valid_promql(stack: Stack) -> None:
    for expr in _dashboard_exprs():
        concrete = expr.replace("$__rate_interval", "1m").replace("$namespace", ".*")
        body = stack.query(concrete)
        assert body["status"] == "success", (expr, body)
