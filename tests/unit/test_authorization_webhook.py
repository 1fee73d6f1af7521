"""The webhook's decisions end to end in process: the policy file and its reloads, the
decision cache (kube's: an allowed TTL, an unauthorized TTL, a bounded LRU), and the
answers when no policy can decide."""

from __future__ import annotations

import contextlib
import io
import logging
import os
from pathlib import Path
from typing import Any

import orjson
import pytest
import yaml
from prometheus_client import generate_latest

from authn_gateway import cli
from authn_gateway.authorization.cache import DecisionCache
from authn_gateway.authorization.keystone_policy import ROLES
from authn_gateway.authorization.metrics import AuthorizationMetrics
from authn_gateway.authorization.rules import ALLOWED, NO_OPINION, Policy, Rule
from authn_gateway.authorization.sar import V1, V1BETA1, BadAccessReview
from authn_gateway.authorization.webhook import (
    SHIPPED_MATCH_CONDITION,
    AuthorizationWebhook,
    match_condition_warning,
)
from authn_gateway.config.authorization import AuthorizationSettings
from authn_gateway.config.sections import MarkerSettings
from authn_gateway.observe.metrics import Metrics
from tests.support.config_helpers import MINIMAL

MEMBERS_READ_PODS = [
    {
        "resource": {"verbs": ["get"], "resources": ["pods"], "version": "*", "namespace": "*"},
        "match": [{"type": "role", "values": ["member"]}],
    }
]


def write(path: Path, content: Any) -> None:
    """Replace the file as a ConfigMap volume does: a new file moved into place."""
    staged = path.with_suffix(".new")
    staged.write_bytes(content if isinstance(content, bytes) else orjson.dumps(content))
    os.replace(staged, path)


def sar(verb: str = "get", roles: tuple[str, ...] = ("member",), api_version: str = V1) -> bytes:
    groups = "groups" if api_version == V1 else "group"
    return orjson.dumps(
        {
            "apiVersion": api_version,
            "kind": "SubjectAccessReview",
            "spec": {
                "resourceAttributes": {"namespace": "demo", "verb": verb, "resource": "pods"},
                "user": "alice",
                groups: ["developers"],
                "extra": {ROLES: list(roles)},
            },
        }
    )


def status(answer: bytes) -> dict[str, Any]:
    doc = orjson.loads(answer)
    assert doc["kind"] == "SubjectAccessReview"
    return dict(doc["status"])


def webhook(path: Path, metrics: Metrics | None = None, **settings: Any) -> AuthorizationWebhook:
    config = AuthorizationSettings.model_validate({"keystone_policy_file": str(path), **settings})
    return AuthorizationWebhook(config, metrics or Metrics())


def sample(metrics: Metrics, name: str, **labels: str) -> float | None:
    value = metrics.registry.get_sample_value(name, labels)
    return value


@pytest.fixture
def policy(tmp_path: Path) -> Path:
    path = tmp_path / "policy.json"
    write(path, MEMBERS_READ_PODS)
    return path


def test_a_member_may_read_pods_and_nothing_else(policy: Path) -> None:
    hook = webhook(policy)
    assert status(hook.answer(sar("get"))) == {
        "allowed": True,
        "reason": f"allowed by {policy.name} [0]",
    }
    assert status(hook.answer(sar("delete"))) == {
        "allowed": False,
        "reason": "authn-gateway: no rule matched",
    }
    assert status(hook.answer(sar("get", roles=()))) == status(hook.answer(sar("delete")))


def test_the_answer_carries_the_requests_api_version(policy: Path) -> None:
    hook = webhook(policy)
    assert orjson.loads(hook.answer(sar(api_version=V1BETA1)))["apiVersion"] == V1BETA1
    assert orjson.loads(hook.answer(sar(api_version=V1)))["apiVersion"] == V1


def test_decisions_are_counted_by_answer_and_hits_apart(policy: Path) -> None:
    metrics = Metrics()
    hook = webhook(policy, metrics)
    for _ in range(3):
        hook.answer(sar("get"))
    hook.answer(sar("delete"))
    decisions = "authn_gateway_authorization_decisions_total"
    assert sample(metrics, decisions, api_version=V1, answer="allowed", cluster="default") == 3
    assert sample(metrics, decisions, api_version=V1, answer="no_opinion", cluster="default") == 1
    assert sample(metrics, "authn_gateway_authorization_cache_hits_total") == 2


def test_decisions_are_counted_for_the_callers_cluster_from_one_shared_cache(
    policy: Path,
) -> None:
    metrics = Metrics()
    hook = webhook(policy, metrics)
    first = hook.answer(sar("get"), "staging")
    # Another cluster asking the same is answered from the same entry: the policy is
    # the gateway's, so the answer does not depend on who asks.
    assert hook.answer(sar("get"), "prod") == first
    hook.answer(sar("delete"), "prod")
    decisions = "authn_gateway_authorization_decisions_total"
    by = {
        (cluster, answer): sample(metrics, decisions, api_version=V1, answer=answer,
                                  cluster=cluster)
        for cluster in ("staging", "prod", "default")
        for answer in ("allowed", "no_opinion")
    }  # fmt: skip
    assert by == {
        ("staging", "allowed"): 1, ("prod", "allowed"): 1, ("prod", "no_opinion"): 1,
        ("staging", "no_opinion"): None, ("default", "allowed"): None,
        ("default", "no_opinion"): None,
    }  # fmt: skip
    assert sample(metrics, "authn_gateway_authorization_cache_hits_total") == 1


def test_a_malformed_review_is_refused_and_neither_counted_nor_kept(policy: Path) -> None:
    metrics = Metrics()
    hook = webhook(policy, metrics)
    with pytest.raises(BadAccessReview, match="kind must be SubjectAccessReview"):
        hook.answer(b'{"apiVersion": "authorization.k8s.io/v1", "kind": "TokenReview"}')
    assert len(hook.cache) == 0
    assert "answer=" not in generate_latest(metrics.registry).decode()


# --- reloads ----------------------------------------------------------------------


def test_a_changed_file_is_in_force_at_the_next_check_and_the_cache_emptied(
    policy: Path,
) -> None:
    metrics = Metrics()
    hook = webhook(policy, metrics)
    assert status(hook.answer(sar("delete")))["allowed"] is False
    assert len(hook.cache) == 1
    assert hook.source.check() is False  # unchanged: not read again
    any_verb = {**MEMBERS_READ_PODS[0]["resource"], "verbs": ["*"]}
    write(policy, [{**MEMBERS_READ_PODS[0], "resource": any_verb}])
    assert hook.source.check() is True
    assert len(hook.cache) == 0
    assert status(hook.answer(sar("delete")))["allowed"] is True
    assert sample(metrics, "authn_gateway_authorization_policy_reloads_total", result="loaded") == 1


def test_an_invalid_change_is_refused_in_one_line_naming_the_rule_and_the_old_policy_kept(
    policy: Path, caplog: pytest.LogCaptureFixture
) -> None:
    metrics = Metrics()
    hook = webhook(policy, metrics)
    write(policy, [MEMBERS_READ_PODS[0], {"match": [{"type": "admin", "values": ["*"]}]}])
    with caplog.at_level(logging.ERROR, "authn_gateway.authorization"):
        assert hook.source.check() is False
    lines = [r.getMessage() for r in caplog.records]
    assert lines == [
        "authorization: policy refused, keeping the policy in force: "
        f"{policy}: [1].match[0].type: unknown match type 'admin' (role, project, group, user)"
    ]
    assert status(hook.answer(sar("get")))["allowed"] is True
    assert (
        sample(metrics, "authn_gateway_authorization_policy_reloads_total", result="refused") == 1
    )
    assert sample(metrics, "authn_gateway_authorization_policy_refused") == 1
    assert sample(metrics, "authn_gateway_authorization_policy_rules") == 1
    # The same bad content is not read again every interval; a fix is.
    assert hook.source.check() is False
    write(policy, MEMBERS_READ_PODS)
    assert hook.source.check() is True
    assert sample(metrics, "authn_gateway_authorization_policy_refused") == 0


def test_a_file_that_goes_away_is_refused_and_the_old_policy_kept(policy: Path) -> None:
    hook = webhook(policy)
    policy.unlink()
    assert hook.source.check() is False
    assert hook.source.error == f"{policy}: cannot read: No such file or directory"
    assert status(hook.answer(sar("get")))["allowed"] is True


def test_a_config_reload_while_the_file_is_broken_keeps_its_rules(policy: Path) -> None:
    first = webhook(policy)
    write(policy, b"[{")
    config = AuthorizationSettings.model_validate({"keystone_policy_file": str(policy)})
    second = AuthorizationWebhook(config, Metrics(), previous=first)
    assert second.source.error == f"{policy}: not valid JSON (line 1)"
    assert status(second.answer(sar("get")))["allowed"] is True


# --- no policy: on_error ---------------------------------------------------------------


def test_without_a_policy_the_answer_is_no_opinion_with_the_error(tmp_path: Path) -> None:
    metrics = Metrics()
    missing = tmp_path / "policy.json"
    hook = webhook(missing, metrics)
    assert hook.source.policy is None
    answer = status(hook.answer(sar("get")))
    assert answer == {
        "allowed": False,
        "reason": "authn-gateway: no policy could decide",
        "evaluationError": "no policy in force",
    }
    assert len(hook.cache) == 0  # the next review after the fix is decided by it
    decisions = "authn_gateway_authorization_decisions_total"
    assert sample(metrics, decisions, api_version=V1, answer="unavailable", cluster="default") == 1
    write(missing, MEMBERS_READ_PODS)
    assert hook.source.check() is True
    assert status(hook.answer(sar("get")))["allowed"] is True


def test_on_error_deny_denies(tmp_path: Path) -> None:
    hook = webhook(tmp_path / "absent.json", on_error="deny")
    assert status(hook.answer(sar("get")))["denied"] is True


def test_an_exception_while_deciding_is_counted_and_answered_on_error(policy: Path) -> None:
    metrics = Metrics()
    hook = webhook(policy, metrics)

    def broken(review: object) -> bool:
        raise KeyError("alice")

    hook.source.policy = Policy((Rule("broken", "allow", broken),), "broken")
    answer = status(hook.answer(sar("get")))
    assert answer["allowed"] is False and answer["evaluationError"] == "internal error (logged)"
    errors = "authn_gateway_internal_errors_total"
    assert sample(metrics, errors, where="authorization", error="KeyError") == 1


# --- the cache ---------------------------------------------------------------------


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_allowed_answers_are_kept_their_ttl_and_others_theirs() -> None:
    clock = Clock()
    cache = DecisionCache(10, authorized_ttl=300, unauthorized_ttl=30, clock=clock)
    cache.put(b"allowed", V1, ALLOWED, b"yes")
    cache.put(b"refused", V1, NO_OPINION, b"no")
    clock.now += 29
    assert cache.get(b"refused") == (V1, NO_OPINION, b"no")
    clock.now += 1
    assert cache.get(b"refused") is None
    assert cache.get(b"allowed") == (V1, ALLOWED, b"yes")
    clock.now += 270
    assert cache.get(b"allowed") is None
    assert len(cache) == 0


def test_the_cache_is_bounded_least_recently_used_first_out() -> None:
    cache = DecisionCache(2, 300, 30)
    cache.put(b"a", V1, ALLOWED, b"a")
    cache.put(b"b", V1, ALLOWED, b"b")
    assert cache.get(b"a") is not None
    cache.put(b"c", V1, ALLOWED, b"c")
    assert (cache.get(b"a"), cache.get(b"b")) == ((V1, ALLOWED, b"a"), None)
    assert len(cache) == 2


def test_a_zero_ttl_or_size_keeps_nothing() -> None:
    cache = DecisionCache(10, 300, 0)
    cache.put(b"n", V1, NO_OPINION, b"n")
    assert len(cache) == 0
    off = DecisionCache(0, 300, 30)
    off.put(b"y", V1, ALLOWED, b"y")
    assert len(off) == 0


def test_keys_are_keyed_hashes_of_fixed_size() -> None:
    cache, other = DecisionCache(1, 1, 1), DecisionCache(1, 1, 1)
    body = sar() * 100
    assert len(cache.key(body)) == 16
    assert cache.key(body) == cache.key(body) != other.key(body)


def test_metrics_group_declares_its_families() -> None:
    metrics = Metrics()
    metrics.group(AuthorizationMetrics)
    text = generate_latest(metrics.registry).decode()
    assert "authn_gateway_authorization_policy_reloads_total" in text


# --- the markers the shipped matchCondition reads ---------------------------------------


@pytest.mark.parametrize(
    ("markers", "warned"),
    [
        ({}, None),
        ({"stale": False}, None),  # the stale marker is not what it reads
        ({"backend": False}, "markers.backend is off"),
        ({"prefix": "example.com/"},
         "markers.prefix is 'example.com/' (the marker is 'example.com/backend')"),
        ({"prefix": "example.com/", "backend": False}, "markers.backend is off"),
    ],
)  # fmt: skip
def test_markers_the_shipped_match_condition_cannot_see_are_one_line(
    markers: dict[str, Any], warned: str | None
) -> None:
    settings = MarkerSettings.model_validate(markers)
    line = match_condition_warning(settings)
    if warned is None:
        assert line is None
        return
    assert line is not None and "\n" not in line
    assert line.startswith(f"authorization: {warned}: kube-apiserver wired with the shipped ")
    assert f'matchCondition "{SHIPPED_MATCH_CONDITION}") never asks this webhook' in line


def check_config(path: Path, caplog: pytest.LogCaptureFixture) -> tuple[int, list[str]]:
    caplog.clear()
    with caplog.at_level(logging.WARNING), contextlib.redirect_stdout(io.StringIO()):
        status = cli.main(["check-config", str(path)])
    return status, [r.getMessage() for r in caplog.records if "matchCondition" in r.getMessage()]


def test_check_config_warns_in_one_line_when_the_match_condition_cannot_hold(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    policy = tmp_path / "policy.json"
    write(policy, MEMBERS_READ_PODS)
    path = tmp_path / "gw.yaml"
    config = yaml.safe_load(MINIMAL)
    config["authorization"] = {"keystone_policy_file": str(policy)}
    path.write_text(yaml.safe_dump(config))
    assert check_config(path, caplog) == (0, [])
    path.write_text(yaml.safe_dump({**config, "markers": {"backend": False}}))
    status, [line] = check_config(path, caplog)
    assert status == 0  # a warning: the flags route has no matchCondition
    assert line.startswith("authorization: markers.backend is off: ")
    # Without authorization there is nothing to warn of.
    del config["authorization"]
    path.write_text(yaml.safe_dump({**config, "markers": {"backend": False}}))
    assert check_config(path, caplog) == (0, [])
