"""promtool unit tests of what shows one gateway serving many clusters (issue 37):
AuthnGatewayClusterDominatesIdP fires when one cluster takes most of a backend's IdP
calls while another cluster's calls are shed, and not for a cluster that is the only
one asking, nor for clusters within their shares, nor for the busiest cluster while
the others get all they ask; the runbook's queries and the dashboard's "Clusters" row
show each cluster's figures on the same series."""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

from tests.support.metric_names import FIXTURE
from tests.support.prometheus_helpers import (
    ROOT,
    _promtool_test,
    _series,
    dashboard_row,
    promql_panels_test,
    rule_groups,
)

ALERT = "AuthnGatewayClusterDominatesIdP"

CALLS = "authn_gateway_cluster_idp_calls_total"

SHED = "authn_gateway_cluster_shed_total"

REVIEWS = "authn_gateway_cluster_reviews_total"

WAIT = "authn_gateway_cluster_queue_wait_seconds_bucket"

OPERATIONS = ROOT / "docs" / "operations.md"

DASHBOARD = ROOT / "deploy" / "base" / "dashboard" / "grafana-dashboard.json"

MINUTES = 60


def counter(per_second: Callable[[int], float]) -> str:
    """A counter's samples, one a minute, growing in minute m by ``per_second(m)`` a
    second."""
    total, values = 0.0, []
    for minute in range(MINUTES + 1):
        if minute:
            total += 60 * per_second(minute)
        values.append(f"{total:g}")
    return " ".join(values)


def storm(during: float, otherwise: float) -> Callable[[int], float]:
    """``during`` a second from minute 10 to minute 40, else ``otherwise``."""
    return lambda minute: during if 10 < minute <= 40 else otherwise


def calls(
    backend: str, cluster: str, rate: Callable[[int], float], **labels: str
) -> dict[str, str]:
    labels = {"backend": backend, "cluster": cluster, "share": "own", "pod": "gw-0", **labels}
    return {"series": _series(CALLS, labels), "values": counter(rate)}


def shed(backend: str, cluster: str, rate: Callable[[int], float], **labels: str) -> dict[str, str]:
    labels = {"backend": backend, "cluster": cluster, "reason": "bucket", "pod": "gw-0", **labels}
    return {"series": _series(SHED, labels), "values": counter(rate)}


def reviews(cluster: str, answer: str, rate: Callable[[int], float]) -> dict[str, str]:
    labels = {"cluster": cluster, "answer": answer, "pod": "gw-0"}
    return {"series": _series(REVIEWS, labels), "values": counter(rate)}


def annotations(cluster: str, backend: str, share: str) -> dict[str, str]:
    [rule] = [r for g in rule_groups() for r in g["rules"] if r.get("alert") == ALERT]
    expanded = {}
    for key, template in rule["annotations"].items():
        text = template.replace("{{ $value | humanizePercentage }}", share)
        text = text.replace("{{ $labels.cluster }}", cluster)
        expanded[key] = text.replace("{{ $labels.backend }}", backend)
    return expanded


def test_a_storming_cluster_alerts_while_another_is_shed_and_no_other_case_does(
    tmp_path: Path,
) -> None:
    # From minute 10 to 40, cluster ci storms keystone with never-seen tokens: 9 of
    # its 10 calls/s (two replicas, its own share and borrowed), while prod's calls
    # are shed (its bucket share is spent) and ci's own flood is shed by the hundred.
    series = [
        calls("keystone", "ci", storm(1.5, 0.5), pod="gw-0"),
        calls("keystone", "ci", storm(3.0, 0.0), pod="gw-0", share="borrowed"),
        calls("keystone", "ci", storm(4.5, 0.5), pod="gw-1"),
        calls("keystone", "prod", storm(0.5, 0.5), pod="gw-0"),
        calls("keystone", "prod", storm(0.5, 0.5), pod="gw-1"),
        shed("keystone", "prod", storm(1.0, 0.0), pod="gw-1"),
        shed("keystone", "ci", storm(50.0, 0.0), pod="gw-0", reason="queue_full"),
        shed("keystone", "ci", storm(50.0, 0.0), pod="gw-1"),
        # The only cluster of its backend: all of its calls, and its own calls shed.
        calls("solo", "only", storm(10.0, 1.0)),
        shed("solo", "only", storm(5.0, 0.0)),
        # Two clusters within their shares, both shed: half each.
        calls("fair", "a", storm(5.0, 1.0)),
        calls("fair", "b", storm(5.0, 1.0)),
        shed("fair", "a", storm(1.0, 0.0)),
        shed("fair", "b", storm(1.0, 0.0)),
        # The busiest by far, but the other cluster gets all it asks: only big is shed.
        calls("busy", "big", storm(9.0, 1.0)),
        calls("busy", "small", storm(1.0, 1.0)),
        shed("busy", "big", storm(20.0, 0.0)),
    ]
    labels = {"backend": "keystone", "cluster": "ci", "severity": "warning"}
    fired = [{"exp_labels": labels, "exp_annotations": annotations("ci", "keystone", "90%")}]
    _promtool_test(
        tmp_path,
        [
            {
                "interval": "1m",
                "input_series": series,
                "alert_rule_test": [
                    {"eval_time": "9m", "alertname": ALERT, "exp_alerts": []},
                    # ci's share of the 10-minute rate passes 0.8 at about 14m: pending.
                    {"eval_time": "20m", "alertname": ALERT, "exp_alerts": []},
                    {"eval_time": "30m", "alertname": ALERT, "exp_alerts": fired},
                    {"eval_time": "40m", "alertname": ALERT, "exp_alerts": fired},
                    # The storm ended at 40m; by 50m the window holds none of it.
                    {"eval_time": "55m", "alertname": ALERT, "exp_alerts": []},
                ],
                "promql_expr_test": [
                    {
                        # What the alert compares: each cluster's share of its backend.
                        "expr": f"round(100 * sum by (backend, cluster) (rate({CALLS}[10m]))"
                        f" / on (backend) group_left sum by (backend) (rate({CALLS}[10m])))",
                        "eval_time": "30m",
                        "exp_samples": [
                            {"labels": f'{{backend="{b}",cluster="{c}"}}', "value": v}
                            for b, c, v in (
                                ("keystone", "ci", 90),
                                ("keystone", "prod", 10),
                                ("solo", "only", 100),
                                ("fair", "a", 50),
                                ("fair", "b", 50),
                                ("busy", "big", 90),
                                ("busy", "small", 10),
                            )
                        ],
                    }
                ],
            }
        ],
        interval="1m",
    )


def test_the_alert_names_each_dominant_cluster_per_backend_and_namespace(
    tmp_path: Path,
) -> None:
    # Two gateways (namespaces) with the same cluster and backend names: each is
    # judged on its own calls. In gw-a, ci storms and prod is shed; in gw-b, ci takes
    # 90 % of calls too but nobody else is shed.
    series = [
        calls("idp", "ci", storm(9.0, 9.0), namespace="gw-a"),
        calls("idp", "prod", storm(1.0, 1.0), namespace="gw-a"),
        shed("idp", "prod", storm(2.0, 2.0), namespace="gw-a"),
        calls("idp", "ci", storm(9.0, 9.0), namespace="gw-b"),
        calls("idp", "prod", storm(1.0, 1.0), namespace="gw-b"),
        shed("idp", "ci", storm(2.0, 2.0), namespace="gw-b"),
    ]
    labels = {"backend": "idp", "cluster": "ci", "namespace": "gw-a", "severity": "warning"}
    fired = [{"exp_labels": labels, "exp_annotations": annotations("ci", "idp", "90%")}]
    _promtool_test(
        tmp_path,
        [
            {
                "interval": "1m",
                "input_series": series,
                "alert_rule_test": [
                    # Over 0.8 from the first rate (1m): pending for 10 minutes.
                    {"eval_time": "8m", "alertname": ALERT, "exp_alerts": []},
                    {"eval_time": "15m", "alertname": ALERT, "exp_alerts": fired},
                ],
            }
        ],
        interval="1m",
    )


def storm_series() -> list[dict[str, str]]:
    """ci storms keystone from minute 10 to 40 (9 of its 10 calls/s, 3 borrowed) and
    its calls wait for slots; prod's are shed; ci's reviews are mostly refusals."""
    return [
        calls("keystone", "ci", storm(1.5, 0.5), pod="gw-0"),
        calls("keystone", "ci", storm(3.0, 0.0), pod="gw-0", share="borrowed"),
        calls("keystone", "ci", storm(4.5, 0.5), pod="gw-1"),
        calls("keystone", "prod", storm(1.0, 1.0)),
        calls("ldap", "prod", storm(7.0, 7.0)),  # another backend: not in the answer
        shed("keystone", "prod", storm(1.0, 0.0), pod="gw-1"),
        shed("keystone", "ci", storm(50.0, 0.0), reason="queue_full"),
        shed("keystone", "ci", storm(20.0, 0.0), pod="gw-1"),
        reviews("ci", "rejected", storm(100.0, 0.0)),
        reviews("ci", "authenticated", storm(2.0, 2.0)),
        reviews("prod", "authenticated", storm(5.0, 5.0)),
        reviews("prod", "unavailable", storm(1.0, 0.0)),
        *wait("ci", 0.5, storm(9.0, 1.0)),
        *wait("prod", 0.01, storm(1.0, 1.0)),
    ]


def wait(cluster: str, bound: float, rate: Callable[[int], float]) -> list[dict[str, str]]:
    """A cluster's queue-wait histogram on keystone: every wait just under ``bound``."""
    return [
        {
            "series": _series(WAIT, {"backend": "keystone", "cluster": cluster, "le": le}),
            "values": counter(rate if float(le) >= bound else lambda _: 0.0),
        }
        for le in ("0.005", "0.01", "0.25", "0.5", "+Inf")
    ]


def runbook_section() -> str:
    text = OPERATIONS.read_text()
    start = text.index(f"### {ALERT}")
    return text[start : text.index("\n### ", start + 1)]


def test_the_runbooks_queries_show_who_storms_and_who_is_shed(tmp_path: Path) -> None:
    [block] = re.findall(r"```promql\n(.*?)```", runbook_section(), re.S)
    queries = block.strip().splitlines()
    assert len(queries) == 3, queries
    series = storm_series()
    # Per query: (the other label's value per cluster, the rate a second).
    expected = [
        ("answer", [("ci", "rejected", 100), ("ci", "authenticated", 2),
                    ("prod", "authenticated", 5), ("prod", "unavailable", 1)]),
        ("share", [("ci", "own", 6), ("ci", "borrowed", 3), ("prod", "own", 1)]),
        ("reason", [("ci", "queue_full", 50), ("ci", "bucket", 20), ("prod", "bucket", 1)]),
    ]  # fmt: skip
    tests = [
        {
            "expr": f"round({query}, 0.001)",
            "eval_time": "30m",
            "exp_samples": [
                {"labels": f'{{cluster="{cluster}",{label}="{value}"}}', "value": rate}
                for cluster, value, rate in samples
            ],
        }
        for query, (label, samples) in zip(queries, expected, strict=True)
    ]
    _promtool_test(
        tmp_path,
        [{"interval": "1m", "input_series": series, "promql_expr_test": tests}],
        interval="1m",
    )


def test_the_runbook_lists_every_metric_per_cluster_the_gateway_exports() -> None:
    exported = {
        line.split()[0]
        for line in FIXTURE.read_text().splitlines()
        if line.startswith("authn_gateway_cluster_")
    }
    assert len(exported) == 4, exported
    text = OPERATIONS.read_text()
    table = text[text.index("### Seen per cluster") : text.index("## Running it")]
    listed = set(re.findall(r"^\| `(authn_gateway_cluster_\w+)`", table, re.M))
    assert listed == exported


def labels(**values: str) -> str:
    return "{" + ",".join(f'{k}="{v}"' for k, v in values.items()) + "}"


def clusters_row() -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """The dashboard's "Clusters" row and the panels under it."""
    return dashboard_row("Clusters")


def test_the_dashboards_clusters_row_shows_each_clusters_figures(tmp_path: Path) -> None:
    row, panels = clusters_row()
    assert [p["title"] for p in panels] == [
        "Reviews by cluster and answer",
        "IdP calls by cluster (own or borrowed share)",
        "Queue wait p99 by cluster",
        "Shed calls by cluster and reason",
    ]
    assert all(p["gridPos"]["y"] > row["gridPos"]["y"] for p in panels)
    exprs = [t["expr"] for p in panels for t in p["targets"]]
    # As Grafana sends them: every namespace, a 5-minute rate.
    concrete = [e.replace("$__rate_interval", "5m").replace("$namespace", ".*") for e in exprs]
    k = "keystone"
    expected: list[list[tuple[str, float]]] = [
        [(labels(cluster="ci", answer="rejected"), 100),
         (labels(cluster="ci", answer="authenticated"), 2),
         (labels(cluster="prod", answer="authenticated"), 5),
         (labels(cluster="prod", answer="unavailable"), 1)],
        [(labels(backend=k, cluster="ci", share="own"), 6),
         (labels(backend=k, cluster="ci", share="borrowed"), 3),
         (labels(backend=k, cluster="prod", share="own"), 1),
         (labels(backend="ldap", cluster="prod", share="own"), 7)],
        # Each cluster's share of its backend's calls: what the alert compares with 0.8.
        [(labels(backend=k, cluster="ci"), 0.9), (labels(backend=k, cluster="prod"), 0.1),
         (labels(backend="ldap", cluster="prod"), 1)],
        [(labels(backend=k, cluster="ci"), 0.5), (labels(backend=k, cluster="prod"), 0.01)],
        [(labels(backend=k, cluster="ci", reason="queue_full"), 50),
         (labels(backend=k, cluster="ci", reason="bucket"), 20),
         (labels(backend=k, cluster="prod", reason="bucket"), 1)],
    ]  # fmt: skip
    promql_panels_test(tmp_path, storm_series(), concrete, expected)


def test_no_two_dashboard_panels_overlap() -> None:
    panels = json.loads(DASHBOARD.read_text())["panels"]
    cells: dict[tuple[int, int], str] = {}
    for panel in panels:
        grid = panel["gridPos"]
        assert grid["x"] + grid["w"] <= 24, panel["title"]
        for x in range(grid["x"], grid["x"] + grid["w"]):
            for y in range(grid["y"], grid["y"] + grid["h"]):
                assert (x, y) not in cells, (panel["title"], cells.get((x, y)))
                cells[(x, y)] = panel["title"]
    ids = [p["id"] for p in panels]
    assert len(ids) == len(set(ids))
