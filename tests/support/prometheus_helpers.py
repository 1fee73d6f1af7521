"""Helpers shared by the tiers of test_prometheus."""

from __future__ import annotations

import contextlib
import json
import re
import shutil
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from tests.support.fakes.idp import FakeIdP
from tests.support.procs import (
    GatewayProcess,
    free_port,
    wait_for_port,
)

ROOT = Path(__file__).resolve().parents[2]

RULES = ROOT / "deploy" / "base" / "prometheusrule.yaml"

DASHBOARD = ROOT / "deploy" / "base" / "dashboard" / "grafana-dashboard.json"

# The job name the ServiceMonitor gives (the metrics Service's name); the rules use it.
JOB = "authn-gateway-metrics"


def binary(name: str) -> str:
    path = shutil.which(name)
    if path is None:
        pytest.fail(f"{name} is required (Debian package prometheus; scripts/test.sh installs it)")
    return path


def wait_until(predicate: Any, timeout: float = 30.0, what: str = "condition") -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.25)
    raise AssertionError(f"timed out waiting for {what}")


def ops_port(gw: GatewayProcess) -> int:
    def find() -> int | None:
        for line in gw.logs().splitlines():
            if "ops listener" in line:
                return int(line.rsplit(":", 1)[1])
        return None

    port: int = wait_until(find, 15, "the ops listener")
    return port


def rule_groups() -> list[dict[str, Any]]:
    groups: list[dict[str, Any]] = yaml.safe_load(RULES.read_text())["spec"]["groups"]
    return groups


@dataclass
class Stack:
    idp: FakeIdP
    gateway: GatewayProcess
    metrics_port: int
    prometheus: str

    def query(self, expr: str) -> dict[str, Any]:
        response = httpx.get(f"{self.prometheus}/api/v1/query", params={"query": expr}, timeout=5)
        body: dict[str, Any] = response.json()
        return body

    def value(self, expr: str) -> float | None:
        result = self.query(expr)["data"]["result"]
        return float(result[0]["value"][1]) if result else None


@contextlib.contextmanager
def running_prometheus(workdir: Path, metrics_port: int) -> Iterator[str]:
    """A Prometheus with the shipped rules scraping ``metrics_port`` every second; its URL."""
    rules_file = workdir / "rules.yaml"
    rules_file.write_text(yaml.safe_dump({"groups": rule_groups()}))
    prom_config = {
        "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
        "rule_files": [str(rules_file)],
        "scrape_configs": [
            {"job_name": JOB, "static_configs": [{"targets": [f"127.0.0.1:{metrics_port}"]}]}
        ],
    }
    (workdir / "prometheus.yml").write_text(yaml.safe_dump(prom_config))
    port = free_port()
    log = (workdir / "prometheus.log").open("wb")
    prometheus = subprocess.Popen(
        [
            binary("prometheus"),
            f"--config.file={workdir / 'prometheus.yml'}",
            f"--storage.tsdb.path={workdir / 'data'}",
            f"--web.listen-address=127.0.0.1:{port}",
            "--log.level=warn",
        ],
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    try:
        wait_for_port(port, timeout=30, proc=prometheus)
        url = f"http://127.0.0.1:{port}"
        wait_until(
            lambda: httpx.get(f"{url}/-/ready", timeout=2).status_code == 200, what="Prometheus"
        )
        yield url
    finally:
        prometheus.terminate()
        prometheus.wait(15)


def _annotations(alert: str, labels: dict[str, str]) -> dict[str, str]:
    rule = next(r for g in rule_groups() for r in g["rules"] if r.get("alert") == alert)
    out = {}
    for key, template in rule["annotations"].items():
        assert "$value" not in template, "this helper only expands $labels"
        out[key] = re.sub(r"\{\{ \$labels\.(\w+) \}\}", lambda m: labels[m.group(1)], template)
    return out


def dashboard_row(title: str) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """The dashboard's row titled ``title`` and the panels under it (to the next row)."""
    panels: list[dict[str, Any]] = json.loads(DASHBOARD.read_text())["panels"]
    [row] = [p for p in panels if p["type"] == "row" and p["title"] == title]
    after = panels[panels.index(row) + 1 :]
    under = after[: next((i for i, p in enumerate(after) if p["type"] == "row"), len(after))]
    return row, under


def grafana_to_promql(expr: str, rate_interval: str = "5m") -> str:
    """A panel's query as Grafana sends it: every namespace, ``rate_interval``."""
    return expr.replace("$__rate_interval", rate_interval).replace("$namespace", ".*")


def _series(name: str, labels: dict[str, str]) -> str:
    return name + "{" + ",".join(f'{k}="{v}"' for k, v in labels.items()) + "}"


def promql_panels_test(
    tmp_path: Path,
    series: list[dict[str, Any]],
    exprs: list[str],
    expected: list[list[tuple[str, float]]],
) -> None:
    """Each of ``exprs`` (rounded to 0.01) at 30m of ``series`` (one sample a minute)
    gives its ``expected`` (labels, value) samples, by promtool against the shipped rules."""
    tests = [
        {
            "expr": f"round({expr}, 0.01)",
            "eval_time": "30m",
            "exp_samples": [{"labels": labels, "value": value} for labels, value in samples],
        }
        for expr, samples in zip(exprs, expected, strict=True)
    ]
    _promtool_test(
        tmp_path,
        [{"interval": "1m", "input_series": series, "promql_expr_test": tests}],
        interval="1m",
    )


def _promtool_test(tmp_path: Path, tests: list[dict[str, Any]], interval: str = "15s") -> None:
    """Run ``tests`` (promtool's unit-test format) against the shipped rules."""
    rules_file = tmp_path / "rules.yaml"
    rules_file.write_text(yaml.safe_dump({"groups": rule_groups()}))
    test_file = tmp_path / "tests.yaml"
    test_file.write_text(
        yaml.safe_dump(
            {"rule_files": [str(rules_file)], "evaluation_interval": interval, "tests": tests}
        )
    )
    result = subprocess.run(
        [binary("promtool"), "test", "rules", str(test_file)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0, result.stdout + result.stderr
