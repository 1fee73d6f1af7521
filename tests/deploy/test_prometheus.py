"""The monitoring assets against the real thing: a Prometheus server scraping a running
gateway, promtool on the scrape and on the alert rules, and the dashboard's queries."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import httpx
import yaml

from tests.support.fakes.keystone import (
    DEFAULT_SERVICE_PASSWORD,
    SERVICE_USER,
    FakeKeystone,
    mint_token,
)
from tests.support.procs import (
    metric_value,
    start_gateway,
)
from tests.support.prometheus_helpers import (
    JOB,
    Stack,
    _annotations,
    _promtool_test,
    _series,
    binary,
    dashboard_row,
    grafana_to_promql,
    ops_port,
    promql_panels_test,
    rule_groups,
    running_prometheus,
    wait_until,
)


def test_alert_rules_pass_promtool_check_rules(tmp_path: Path) -> None:
    rules_file = tmp_path / "rules.yaml"
    rules_file.write_text(yaml.safe_dump({"groups": rule_groups()}))
    result = subprocess.run(
        [binary("promtool"), "check", "rules", str(rules_file)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    names = {rule["alert"] for group in rule_groups() for rule in group["rules"] if "alert" in rule}
    assert names >= {
        "AuthnGatewayBreakerOpen",
        "AuthnGatewayServingStale",
        "AuthnGatewayBackendUnavailable",
        "AuthnGatewayRedisFallback",
        "AuthnGatewayNoReviews",
        "AuthnGatewayIdPSaturated",
        "AuthnGatewayStaleLimitHalfSpent",
        "AuthnGatewayAuthorizationPolicyRefused",
        "AuthnGatewayAuthorizationUnavailable",
    }


def test_breaker_alert_fires_only_after_a_minute_open(tmp_path: Path) -> None:
    rules_file = tmp_path / "rules.yaml"
    rules_file.write_text(yaml.safe_dump({"groups": rule_groups()}))
    labels = {"backend": "idp", "pod": "gw-0", "severity": "warning"}
    # Closed until t=15s, then open, with a half-open probe at t=45s that fails: the
    # flip must not restart the minute.
    states = {"closed": "1 0x7", "open": "0 1 1 0 1 1 1 1", "half-open": "0 0 0 1 0 0 0 0"}
    tests = {
        "rule_files": [str(rules_file)],
        "evaluation_interval": "15s",
        "tests": [
            {
                "interval": "15s",
                "input_series": [
                    *(
                        {
                            "series": _series(
                                "authn_gateway_breaker_state",
                                {"backend": "idp", "state": state, "pod": "gw-0"},
                            ),
                            "values": values,
                        }
                        for state, values in states.items()
                    ),
                    {"series": f'up{{job="{JOB}"}}', "values": "1x8"},
                    {
                        "series": 'authn_gateway_reviews_total{answer="authenticated"}',
                        "values": "0+10x8",
                    },
                ],
                "alert_rule_test": [
                    {"eval_time": "45s", "alertname": "AuthnGatewayBreakerOpen", "exp_alerts": []},
                    {
                        "eval_time": "90s",
                        "alertname": "AuthnGatewayBreakerOpen",
                        "exp_alerts": [
                            {
                                "exp_labels": labels,
                                "exp_annotations": _annotations("AuthnGatewayBreakerOpen", labels),
                            }
                        ],
                    },
                    {"eval_time": "90s", "alertname": "AuthnGatewayDown", "exp_alerts": []},
                    {"eval_time": "90s", "alertname": "AuthnGatewayNoReviews", "exp_alerts": []},
                ],
            }
        ],
    }
    test_file = tmp_path / "tests.yaml"
    test_file.write_text(yaml.safe_dump(tests))
    result = subprocess.run(
        [binary("promtool"), "test", "rules", str(test_file)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0, result.stdout + result.stderr


def _override_series(
    backend: str, pod: str, override: str, since: str, until: int
) -> list[dict[str, str]]:
    """One pod's override gauges, per minute: ``override`` in force from minute 1 to
    ``until`` (since = ``since``), none before and after."""
    minutes = 60
    forced = " ".join("1" if 1 <= m < until else "0" for m in range(minutes))
    none = " ".join("0" if 1 <= m < until else "1" for m in range(minutes))
    started = " ".join(since if 1 <= m < until else "0" for m in range(minutes))
    labels = {"backend": backend, "pod": pod}
    return [
        {
            "series": _series("authn_gateway_breaker_override", {**labels, "override": override}),
            "values": forced,
        },
        {
            "series": _series("authn_gateway_breaker_override", {**labels, "override": "none"}),
            "values": none,
        },
        {
            "series": _series("authn_gateway_breaker_override_since_timestamp_seconds", labels),
            "values": started,
        },
    ]


def test_a_forced_state_older_than_30_minutes_alerts_forced_closed_included(
    tmp_path: Path,
) -> None:
    alert = "AuthnGatewayBreakerOverrideForgotten"
    # keystone forced closed at t=60s on both pods (fleet-wide) until minute 45; gw-1
    # restarts around minute 20 (a gap in its series), which must not reset the age.
    series = [
        *_override_series("keystone", "gw-0", "forced_closed", "60", 45),
        *_override_series("keystone", "gw-1", "forced_closed", "60", 45),
        # gitlab forced open for 10 minutes only: released in time, never alerts.
        *_override_series("gitlab", "gw-0", "forced_open", "60", 11),
    ]
    gw1_since = series[5]
    values = gw1_since["values"].split()
    gw1_since["values"] = " ".join(values[:19] + ["_"] * 3 + values[22:])
    labels = {"backend": "keystone", "override": "forced_closed", "severity": "warning"}
    _promtool_test(
        tmp_path,
        [
            {
                "interval": "1m",
                "input_series": series,
                "alert_rule_test": [
                    {"eval_time": "10m", "alertname": alert, "exp_alerts": []},
                    {"eval_time": "30m", "alertname": alert, "exp_alerts": []},
                    {
                        "eval_time": "32m",
                        "alertname": alert,
                        "exp_alerts": [
                            {"exp_labels": labels, "exp_annotations": _annotations(alert, labels)}
                        ],
                    },
                    {"eval_time": "50m", "alertname": alert, "exp_alerts": []},
                ],
            }
        ],
        interval="1m",
    )


def test_idp_saturated_fires_after_five_minutes_of_refusals_only(tmp_path: Path) -> None:
    labels = {"backend": "idp", "namespace": "authn", "severity": "warning"}
    refused = {"backend": "idp", "reason": "queue_full", "namespace": "authn", "pod": "gw-0"}
    tests = [
        {
            "interval": "30s",
            # Refusals at 2/s for 12 minutes, then none.
            "input_series": [
                {
                    "series": _series("authn_gateway_concurrency_refusals_total", refused),
                    "values": "0+60x24 1440x20",
                },
                {"series": f'up{{job="{JOB}"}}', "values": "1x44"},
                {
                    "series": 'authn_gateway_reviews_total{answer="authenticated"}',
                    "values": "0+10x44",
                },
            ],
            "alert_rule_test": [
                {"eval_time": "4m", "alertname": "AuthnGatewayIdPSaturated", "exp_alerts": []},
                {
                    "eval_time": "11m",
                    "alertname": "AuthnGatewayIdPSaturated",
                    "exp_alerts": [
                        {
                            "exp_labels": labels,
                            "exp_annotations": {
                                "summary": "The identity provider behind idp is saturated",
                                "description": "The gateway refuses 2 calls/s to idp because "
                                "its latency says it has no spare capacity. Cached users are "
                                "served stale; new tokens may get an error.",
                                "runbook": "docs/operations.md#authngatewayidpsaturated",
                            },
                        }
                    ],
                },
                # Refusals stopped at 12m; the 5m rate is 0 by 18m.
                {"eval_time": "20m", "alertname": "AuthnGatewayIdPSaturated", "exp_alerts": []},
            ],
        }
    ]
    _promtool_test(tmp_path, tests, interval="30s")


def _calls(backend: str, outcome: str, values: str) -> dict[str, str]:
    labels = {"backend": backend, "outcome": outcome, "pod": "gw-0"}
    return {"series": _series("authn_gateway_backend_calls_total", labels), "values": values}


def test_reject_all_alert_fires_against_the_backends_own_baseline(tmp_path: Path) -> None:
    # Per minute, two hours of normal traffic and then one hour of the incident.
    series = [
        # Keystone's keys go out of sync at t=120m: every token is "invalid" from then on.
        _calls("keystone", "authenticated", "0+60x120 7200x60"),
        _calls("keystone", "rejected", "0+6x120 720+60x60"),
        # A chained backend that normally rejects 95% (others' tokens), unchanged.
        _calls("chained", "authenticated", "0+3x180"),
        _calls("chained", "rejected", "0+57x180"),
        # A caller floods bad tokens at t=120m; valid users still get in.
        _calls("flooded", "authenticated", "0+60x180"),
        _calls("flooded", "rejected", "0+6x120 720+120x60"),
        # A quiet backend: one call a minute, all rejected after t=120m, too few to page.
        _calls("quiet", "authenticated", "0+1x120 120x60"),
        _calls("quiet", "rejected", "0x120 0+1x60"),
        # Calls that went unanswered are not answers; they do not move the share.
        _calls("keystone", "unavailable", "0+600x180"),
    ]
    labels = {"backend": "keystone", "severity": "critical"}
    rule = next(
        r
        for g in rule_groups()
        for r in g["rules"]
        if r.get("alert") == "AuthnGatewayBackendRejectsEveryone"
    )
    annotations = {
        "summary": _annotations_without_value(rule["annotations"]["summary"], labels),
        "description": rule["annotations"]["description"].replace(
            "{{ $value | humanizePercentage }}", "0%"
        ),
        "runbook": rule["annotations"]["runbook"],
    }
    alert = "AuthnGatewayBackendRejectsEveryone"
    _promtool_test(
        tmp_path,
        [
            {
                "interval": "1m",
                "input_series": series,
                "alert_rule_test": [
                    {"eval_time": "119m", "alertname": alert, "exp_alerts": []},
                    # The share has fallen, but not yet for the 10 minutes the rule waits.
                    {"eval_time": "132m", "alertname": alert, "exp_alerts": []},
                    {
                        "eval_time": "150m",
                        "alertname": alert,
                        "exp_alerts": [{"exp_labels": labels, "exp_annotations": annotations}],
                    },
                ],
                "promql_expr_test": [
                    {
                        "expr": "round(100 * authn_gateway_backend:rejected_ratio:rate10m)",
                        "eval_time": "150m",
                        "exp_samples": [
                            {"labels": f'{{backend="{backend}"}}', "value": value}
                            for backend, value in (
                                ("keystone", 100),
                                ("chained", 95),
                                ("flooded", 67),
                                ("quiet", 100),
                            )
                        ],
                    }
                ],
            }
        ],
        interval="1m",
    )


def test_redis_alert_fires_on_a_flip_shorter_than_a_scrape(tmp_path: Path) -> None:
    changes, alert = "authn_gateway_redis_mode_changes_total", "AuthnGatewayRedisModeFlipped"
    labels = {"pod": "gw-0", "severity": "warning"}
    fired = [{"exp_labels": labels, "exp_annotations": _annotations(alert, labels)}]
    _promtool_test(
        tmp_path,
        [
            {
                "interval": "1m",
                # gw-0 was in local mode for a few seconds at t=5m (its mode gauge, sampled
                # every minute, never showed it); gw-1 never left shared mode.
                "input_series": [
                    {
                        "series": _series(changes, {"pod": "gw-0", "to": "local"}),
                        "values": "0x4 1x25",
                    },
                    {
                        "series": _series(changes, {"pod": "gw-0", "to": "shared"}),
                        "values": "0x4 1x25",
                    },
                    {"series": _series(changes, {"pod": "gw-1", "to": "local"}), "values": "0x30"},
                    {
                        "series": 'authn_gateway_redis_mode{pod="gw-0",mode="local"}',
                        "values": "0x30",
                    },
                ],
                "alert_rule_test": [
                    {"eval_time": "4m", "alertname": alert, "exp_alerts": []},
                    {"eval_time": "6m", "alertname": alert, "exp_alerts": fired},
                    {"eval_time": "14m", "alertname": alert, "exp_alerts": fired},
                    {"eval_time": "20m", "alertname": alert, "exp_alerts": []},
                    # The 2-minute rule on the gauge never saw it.
                    {
                        "eval_time": "20m",
                        "alertname": "AuthnGatewayRedisFallback",
                        "exp_alerts": [],
                    },
                ],
            }
        ],
        interval="1m",
    )


def test_one_user_filling_the_cache_alerts_past_a_hundred_in_ten_minutes(
    tmp_path: Path,
) -> None:
    capped, alert = "authn_gateway_cache_user_capped_total", "AuthnGatewayOneUserFillsTheCache"
    labels = {"namespace": "authn", "pod": "gw-0", "severity": "info"}
    fired = [{"exp_labels": labels, "exp_annotations": _annotations(alert, labels)}]
    series = _series(capped, {"namespace": "authn", "pod": "gw-0"})
    quiet = _series(capped, {"namespace": "authn", "pod": "gw-1"})
    _promtool_test(
        tmp_path,
        [
            {
                "interval": "1m",
                # gw-0: 5 a minute for 10 minutes (50: a service user's rotation), then
                # 60 a minute for 10 minutes (bulk minting), then none; gw-1 never.
                "input_series": [
                    {"series": series, "values": "0+5x10 50+60x10 650x20"},
                    {"series": quiet, "values": "0x40"},
                ],
                "alert_rule_test": [
                    {"eval_time": "10m", "alertname": alert, "exp_alerts": []},
                    {"eval_time": "14m", "alertname": alert, "exp_alerts": fired},
                    {"eval_time": "35m", "alertname": alert, "exp_alerts": []},
                ],
            }
        ],
        interval="1m",
    )


def _annotations_without_value(template: str, labels: dict[str, str]) -> str:
    return re.sub(r"\{\{ \$labels\.(\w+) \}\}", lambda m: labels[m.group(1)], template)


def test_a_keystone_that_rejects_every_token_is_seen_in_the_rejected_share(
    tmp_path: Path,
) -> None:
    """Fernet keys out of sync: Keystone answers 404 for every user token. No call
    fails, so no breaker opens; the rejected share the reject-all alert watches is
    what moves, in a real Prometheus scraping the gateway."""
    keystone = FakeKeystone().start_in_thread()
    try:
        backend = {
            "name": "keystone",
            "type": "keystone",
            "auth_url": f"http://127.0.0.1:{keystone.port}/v3",
            "service": {
                "username": SERVICE_USER,
                "password": DEFAULT_SERVICE_PASSWORD,
                "system_scope": "all",
            },
            "cache": {"negative_ttl_seconds": 0},
        }
        config = {"server": {"ops": {"port": 0}}, "backends": [backend]}
        gateway = start_gateway(config, tmp_path)
        try:
            metrics_port = ops_port(gateway)
            with running_prometheus(tmp_path, metrics_port) as url, httpx.Client() as client:
                prom = Stack(keystone, gateway, metrics_port, url)
                calls = "authn_gateway_backend_calls_total"
                # Normal days: users get in; the odd token is invalid.
                for i in range(10):
                    body = gateway.review(mint_token(f"user{i}"), client=client).json()
                    assert body["status"]["authenticated"] is True
                bad = mint_token("user0", key=b"not keystone's key")
                assert gateway.review(bad, client=client).json()["status"]["authenticated"] is False
                # Prometheus has both series before the incident (a rate needs two samples).
                wait_until(
                    lambda: prom.value(f'{calls}{{outcome="rejected"}}') == 1, what="a scrape"
                )
                # The keys change under the tokens users hold.
                keystone.key = b"a key the users' tokens were not made with"
                before = keystone.counts["validate"]
                for i in range(30):
                    status = gateway.review(mint_token(f"late{i}"), client=client).json()["status"]
                    assert status["authenticated"] is False and "error" not in status, status
                scrape = client.get(f"http://127.0.0.1:{metrics_port}/metrics").text
                assert metric_value(scrape, calls, backend="keystone", outcome="rejected") == 31
                assert metric_value(scrape, calls, backend="keystone", outcome="unavailable") == 0
                assert keystone.counts["validate"] - before >= 30  # Keystone said 404 to each
                assert metric_value(scrape, "authn_gateway_breaker_state", state="closed") == 1
                # What the alert compares with its baseline: every answer since is "invalid".
                share = "authn_gateway_backend:rejected_ratio:rate10m"
                wait_until(lambda: prom.value(share) == 1.0, what="the recorded share at 1")
                closed = 'authn_gateway_breaker_state{backend="keystone",state="closed"}'
                assert prom.value(closed) == 1
        finally:
            gateway.stop()
    finally:
        keystone.stop()


def test_certificate_expiry_alert_fires_at_14_days(tmp_path: Path) -> None:
    rules_file = tmp_path / "rules.yaml"
    rules_file.write_text(yaml.safe_dump({"groups": rule_groups()}))
    cert = {"role": "client_ca", "subject": "CN=client-ca", "pod": "gw-0"}
    # The CA ends 20 days after the test's time 0: 6 days of silence, then the alert.
    expiry = {
        "series": _series("authn_gateway_tls_certificate_expiry_timestamp_seconds", cert),
        "values": f"{20 * 86400}x2100",
    }
    labels = {**cert, "severity": "warning"}
    tests = {
        "rule_files": [str(rules_file)],
        "evaluation_interval": "5m",
        "tests": [
            {
                # Samples as often as evaluations: a sparser series goes stale in between.
                "interval": "5m",
                "input_series": [expiry],
                "alert_rule_test": [
                    {
                        "eval_time": "5d",
                        "alertname": "AuthnGatewayCertificateExpiring",
                        "exp_alerts": [],
                    },
                    {
                        "eval_time": "7d",
                        "alertname": "AuthnGatewayCertificateExpiring",
                        "exp_alerts": [
                            {
                                "exp_labels": labels,
                                "exp_annotations": _annotations(
                                    "AuthnGatewayCertificateExpiring", labels
                                ),
                            }
                        ],
                    },
                ],
            }
        ],
    }
    test_file = tmp_path / "tests.yaml"
    test_file.write_text(yaml.safe_dump(tests))
    result = subprocess.run(
        [binary("promtool"), "test", "rules", str(test_file)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0, result.stdout + result.stderr


def test_stale_limit_alert_fires_at_half_of_max_stale_since_the_fleets_last_success(
    tmp_path: Path,
) -> None:
    def series(name: str, values: str, **labels: str) -> dict[str, str]:
        return {"series": _series(name, labels), "values": values}

    last, limit = (
        "authn_gateway_backend_last_success_timestamp_seconds",
        "authn_gateway_cache_max_stale_seconds",
    )
    stale = "authn_gateway_stale_answers_total"
    # Per minute. The IdP behind idp fails at 10m; gw-1 still got an answer at 20m (the
    # fleet's last success), then nothing until it recovers at 70m. max_stale is 1 h,
    # so half of it is spent at 50m. A quiet backend has had no answer for an hour but
    # serves nobody stale.
    input_series = [
        series(last, "0+60x10 600x70", backend="idp", pod="gw-0"),
        series(last, "0+60x20 1200x49 4200+60x10", backend="idp", pod="gw-1"),
        series(limit, "3600x80", backend="idp", pod="gw-0"),
        series(limit, "3600x80", backend="idp", pod="gw-1"),
        series(stale, "0x10 0+60x70", backend="idp", pod="gw-0"),
        series(last, "0x80", backend="quiet", pod="gw-0"),
        series(limit, "600x80", backend="quiet", pod="gw-0"),
        series(stale, "0x80", backend="quiet", pod="gw-0"),
    ]
    alert = "AuthnGatewayStaleLimitHalfSpent"
    labels = {"backend": "idp", "severity": "critical"}
    rule = next(r for g in rule_groups() for r in g["rules"] if r.get("alert") == alert)
    annotations = {
        "summary": _annotations_without_value(rule["annotations"]["summary"], labels),
        "description": rule["annotations"]["description"].replace(
            "{{ $value | humanizeDuration }}", "33m 0s"
        ),
        "runbook": rule["annotations"]["runbook"],
    }
    _promtool_test(
        tmp_path,
        [
            {
                "interval": "1m",
                "input_series": input_series,
                "alert_rule_test": [
                    {"eval_time": "49m", "alertname": alert, "exp_alerts": []},
                    # Over half at 50m; pending for its 2 minutes.
                    {"eval_time": "51m", "alertname": alert, "exp_alerts": []},
                    {
                        "eval_time": "53m",
                        "alertname": alert,
                        "exp_alerts": [{"exp_labels": labels, "exp_annotations": annotations}],
                    },
                    # The IdP answers again at 70m.
                    {"eval_time": "72m", "alertname": alert, "exp_alerts": []},
                ],
            }
        ],
        interval="1m",
    )


def test_admin_auth_failures_alert_fires_under_guessing_not_for_a_typo(tmp_path: Path) -> None:
    labels = {"namespace": "authn", "pod": "gw-0"}
    series = {
        reason: _series("authn_gateway_admin_auth_failures_total", {**labels, "reason": reason})
        for reason in ("wrong", "throttled", "missing")
    }
    alert = "AuthnGatewayAdminAuthFailures"
    tests = [
        {
            "interval": "1m",
            "input_series": [
                # Two typos at 5 and 6 minutes; a guesser from 20 minutes on: 10 checked,
                # then refused unchecked at 100 a minute.
                {"series": series["missing"], "values": "0x4 1 2x40"},
                {"series": series["wrong"], "values": "0x19 10x25"},
                {"series": series["throttled"], "values": "0x20 100+100x24"},
            ],
            "alert_rule_test": [
                {"eval_time": "15m", "alertname": alert, "exp_alerts": []},  # two typos
                {
                    "eval_time": "22m",
                    "alertname": alert,
                    "exp_alerts": [
                        {
                            "exp_labels": {**labels, "severity": "warning"},
                            "exp_annotations": {
                                "summary": "gw-0 refused 210 admin API requests for their "
                                "credentials in 10 minutes",
                                "description": "Failed admin authentications (missing or "
                                "wrong bearer token, or refused unchecked after too many): a "
                                "client with an old token, or someone guessing it.",
                                "runbook": "docs/operations.md#authngatewayadminauthfailures",
                            },
                        }
                    ],
                },
            ],
        }
    ]
    _promtool_test(tmp_path, tests, interval="1m")


def test_config_reload_refused_alert_fires_after_ten_minutes_and_clears_on_an_applied_one(
    tmp_path: Path,
) -> None:
    labels = {"namespace": "authn", "pod": "gw-0"}
    alert = "AuthnGatewayConfigReloadRefused"
    gauge = _series("authn_gateway_config_last_reload_successful", labels)
    tests = [
        {
            "interval": "1m",
            "input_series": [
                # Serving its file; a refused reload at 5 m; a good file applied at 30 m.
                {"series": gauge, "values": "1x4 0x24 1x10"},
            ],
            "alert_rule_test": [
                {"eval_time": "4m", "alertname": alert, "exp_alerts": []},
                {"eval_time": "12m", "alertname": alert, "exp_alerts": []},  # not 10 min yet
                {
                    "eval_time": "16m",
                    "alertname": alert,
                    "exp_alerts": [
                        {
                            "exp_labels": {**labels, "severity": "warning"},
                            "exp_annotations": _annotations(alert, labels),
                        }
                    ],
                },
                {"eval_time": "31m", "alertname": alert, "exp_alerts": []},
            ],
        }
    ]
    _promtool_test(tmp_path, tests, interval="1m")


def test_policy_refused_alert_fires_after_five_minutes_and_clears_when_the_file_loads(
    tmp_path: Path,
) -> None:
    alert = "AuthnGatewayAuthorizationPolicyRefused"
    gauge = "authn_gateway_authorization_policy_refused"
    labels = {"namespace": "authn", "pod": "gw-0"}
    fired = [
        {
            "exp_labels": {**labels, "severity": "warning"},
            "exp_annotations": _annotations(alert, labels),
        }
    ]
    tests = [
        {
            "interval": "1m",
            "input_series": [
                # gw-0: an invalid edit of the ConfigMap at 4m, fixed at 15m.
                {"series": _series(gauge, labels), "values": "0x3 1x11 0x10"},
                # gw-1: an edit fixed within two minutes: never for 5 minutes.
                {"series": _series(gauge, {**labels, "pod": "gw-1"}), "values": "0x3 1x1 0x20"},
            ],
            "alert_rule_test": [
                {"eval_time": "3m", "alertname": alert, "exp_alerts": []},
                {"eval_time": "7m", "alertname": alert, "exp_alerts": []},  # pending
                {"eval_time": "10m", "alertname": alert, "exp_alerts": fired},
                {"eval_time": "14m", "alertname": alert, "exp_alerts": fired},
                {"eval_time": "16m", "alertname": alert, "exp_alerts": []},
            ],
        }
    ]
    _promtool_test(tmp_path, tests, interval="1m")


def test_authorization_unavailable_alert_fires_on_on_error_answers_only(tmp_path: Path) -> None:
    alert = "AuthnGatewayAuthorizationUnavailable"
    decisions = "authn_gateway_authorization_decisions_total"

    def answered(pod: str, answer: str, values: str) -> dict[str, str]:
        labels = {"namespace": "authn", "pod": pod, "api_version": "authorization.k8s.io/v1",
                  "answer": answer, "cluster": "default"}  # fmt: skip
        return {"series": _series(decisions, labels), "values": values}

    labels = {"namespace": "authn", "pod": "gw-0"}
    fired = [
        {
            "exp_labels": {**labels, "severity": "critical"},
            "exp_annotations": _annotations(alert, labels),
        }
    ]
    tests = [
        {
            "interval": "1m",
            "input_series": [
                # gw-0 decides until 10m, then has no policy (on_error) until 20m.
                answered("gw-0", "allowed", "0+50x10 500x10 500+50x10"),
                answered("gw-0", "unavailable", "0x10 0+40x10 400x10"),
                # gw-1: no rule matched is an answer, not an outage; denials too.
                answered("gw-1", "no_opinion", "0+30x30"),
                answered("gw-1", "denied", "0+5x30"),
            ],
            "alert_rule_test": [
                {"eval_time": "9m", "alertname": alert, "exp_alerts": []},
                {"eval_time": "12m", "alertname": alert, "exp_alerts": []},  # pending
                {"eval_time": "14m", "alertname": alert, "exp_alerts": fired},
                {"eval_time": "20m", "alertname": alert, "exp_alerts": fired},
                # The policy back at 20m: the 5-minute rate is 0 from 25m.
                {"eval_time": "28m", "alertname": alert, "exp_alerts": []},
            ],
        }
    ]
    _promtool_test(tmp_path, tests, interval="1m")


def test_the_dashboards_authorization_row_shows_answers_reloads_rules_and_cache_hits(
    tmp_path: Path,
) -> None:
    row, panels = dashboard_row("Authorization")
    assert [p["title"] for p in panels] == [
        "SubjectAccessReviews by answer",
        "Authorization policy reloads and refused files",
        "Authorization rules in force",
        "Authorization decision cache hit ratio",
    ]
    assert all(p["gridPos"]["y"] > row["gridPos"]["y"] for p in panels)
    exprs = [grafana_to_promql(t["expr"]) for p in panels for t in p["targets"]]

    def per_minute(name: str, per_second: float, **labels: str) -> dict[str, str]:
        return {"series": _series(name, labels), "values": f"0+{60 * per_second:g}x40"}

    def gauge(name: str, value: float, pod: str) -> dict[str, str]:
        return {"series": _series(name, {"pod": pod}), "values": f"{value:g}x40"}

    decisions = "authn_gateway_authorization_decisions_total"
    reloads = "authn_gateway_authorization_policy_reloads_total"
    refused, rules = (
        "authn_gateway_authorization_policy_refused",
        "authn_gateway_authorization_policy_rules",
    )
    v1 = {"api_version": "authorization.k8s.io/v1", "cluster": "default"}
    series = [
        per_minute(decisions, 1, pod="gw-0", answer="allowed", **v1),
        per_minute(decisions, 0.5, pod="gw-0", answer="no_opinion", **v1),
        per_minute(decisions, 1, pod="gw-1", answer="allowed", **v1),
        per_minute(decisions, 0.2, pod="gw-1", answer="unavailable", **v1),
        per_minute(decisions, 0.1, pod="gw-1", answer="denied", **v1),
        per_minute("authn_gateway_authorization_cache_hits_total", 1.4, pod="gw-0"),
        # gw-0's file is refused at every check; gw-1 loads one change a minute.
        per_minute(reloads, 1 / 60, pod="gw-0", result="refused"),
        per_minute(reloads, 1 / 60, pod="gw-1", result="loaded"),
        gauge(refused, 1, "gw-0"),
        gauge(refused, 0, "gw-1"),
        gauge(rules, 20, "gw-0"),
        gauge(rules, 21, "gw-1"),
    ]
    expected: list[list[tuple[str, float]]] = [
        [('{answer="allowed"}', 2), ('{answer="no_opinion"}', 0.5),
         ('{answer="unavailable"}', 0.2), ('{answer="denied"}', 0.1)],
        [('{result="refused"}', 5), ('{result="loaded"}', 5)],  # in 5 minutes
        [('{pod="gw-0"}', 1), ('{pod="gw-1"}', 0)],
        [('{pod="gw-0"}', 20), ('{pod="gw-1"}', 21)],
        [("{}", 0.5)],  # 1.4 hits a second of 2.8 answers
    ]  # fmt: skip
    promql_panels_test(tmp_path, series, exprs, expected)
