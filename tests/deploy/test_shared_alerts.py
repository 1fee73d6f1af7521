"""promtool unit tests of the alerts on the fleet's shared state: two gateway secrets in
one fleet, and Redis errors that switch no replica to local state."""

from __future__ import annotations

from pathlib import Path

from tests.support.prometheus_helpers import _annotations, _promtool_test, _series

INFO = "authn_gateway_secret_info"


def _info(pod: str, key_id: str, role: str, values: str, namespace: str = "gw") -> dict[str, str]:
    labels = {"namespace": namespace, "pod": pod, "key_id": key_id, "role": role}
    return {"series": _series(INFO, labels), "values": values}


def test_two_current_secrets_alert_after_ten_minutes_not_during_a_rollout(
    tmp_path: Path,
) -> None:
    alert = "AuthnGatewaySecretMismatch"
    labels = {"namespace": "gw", "severity": "warning"}
    fired = [{"exp_labels": labels, "exp_annotations": _annotations(alert, labels)}]
    # Per minute. gw-0 stays on key aaaa, accepting bbbb (previous: not a second secret).
    # gw-1 runs bbbb for 5 minutes at t=5m (a rollout, back to aaaa), then from t=20m on.
    series = [
        _info("gw-0", "aaaa", "current", "1x60"),
        _info("gw-0", "bbbb", "previous", "1x60"),
        _info("gw-1", "aaaa", "current", "1x4 _x5 1x10 _x40"),
        _info("gw-1", "bbbb", "current", "_x4 1x5 _x10 1x40"),
        # Another gateway in its own namespace, with its own secret: not a mismatch.
        _info("gw-0", "cccc", "current", "1x60", namespace="other"),
    ]
    _promtool_test(
        tmp_path,
        [
            {
                "interval": "1m",
                "input_series": series,
                "alert_rule_test": [
                    {"eval_time": "8m", "alertname": alert, "exp_alerts": []},
                    {"eval_time": "15m", "alertname": alert, "exp_alerts": []},
                    {"eval_time": "28m", "alertname": alert, "exp_alerts": []},
                    {"eval_time": "32m", "alertname": alert, "exp_alerts": fired},
                ],
            }
        ],
        interval="1m",
    )


def test_a_late_redis_answer_that_switched_nothing_alerts(tmp_path: Path) -> None:
    errors, alert = "authn_gateway_redis_errors_total", "AuthnGatewayRedisErrors"
    labels = {"pod": "gw-0", "severity": "warning"}
    fired = [{"exp_labels": labels, "exp_annotations": _annotations(alert, labels)}]
    _promtool_test(
        tmp_path,
        [
            {
                "interval": "1m",
                # gw-0: two late cache reads at t=5m, fewer than slow_calls_to_local in a
                # row, so it never switched to local state; gw-1 had no error.
                "input_series": [
                    {
                        "series": _series(errors, {"pod": "gw-0", "operation": "cache_get"}),
                        "values": "0x4 2x25",
                    },
                    {
                        "series": _series(errors, {"pod": "gw-1", "operation": "cache_get"}),
                        "values": "0x30",
                    },
                    {
                        "series": _series(
                            "authn_gateway_redis_mode_changes_total", {"pod": "gw-0", "to": "local"}
                        ),
                        "values": "0x30",
                    },
                ],
                "alert_rule_test": [
                    {"eval_time": "4m", "alertname": alert, "exp_alerts": []},
                    {"eval_time": "6m", "alertname": alert, "exp_alerts": fired},
                    {"eval_time": "20m", "alertname": alert, "exp_alerts": []},
                    {
                        "eval_time": "6m",
                        "alertname": "AuthnGatewayRedisModeFlipped",
                        "exp_alerts": [],
                    },
                ],
            }
        ],
        interval="1m",
    )
