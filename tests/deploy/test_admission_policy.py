"""deploy/policy: the ValidatingAdmissionPolicy that makes stale identities read-only.

No kube-apiserver can run here (Debian ships only kubectl; it is not on PyPI), so
this validates the objects with kube-apiserver's own rules as encoded in
tests/support/kube (admissionregistration validation, cited there), and evaluates
every CEL expression with cel-python (a CEL implementation of the spec) on
AdmissionRequests shaped as kube-apiserver builds them.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import celpy
import orjson
import pytest
import yaml

from authn_gateway.config import GatewayConfig
from authn_gateway.review.markers import Markers
from authn_gateway.review.tokenreview import render_verdict
from backends.base import Authenticated, UserInfo, Verdict
from tests.support.kube import validate
from tests.support.kustomize import render

POLICY_FILE = (
    Path(__file__).resolve().parents[2] / "deploy" / "policy" / "stale-identities-read-only.yaml"
)

STALE_KEY = "authn-gateway.io/stale"

V1 = "authentication.k8s.io/v1"

DEMO = {"name": "demo", "type": "static", "tokens": [{"token": "t", "username": "u"}]}


def documents() -> tuple[dict[str, Any], dict[str, Any]]:
    policy, binding = yaml.safe_load_all(POLICY_FILE.read_text())
    return policy, binding


def evaluate(expression: str, request: dict[str, Any]) -> Any:
    env = celpy.Environment()
    result = env.program(env.compile(expression)).evaluate({"request": celpy.json_to_cel(request)})
    if isinstance(result, celpy.CELEvalError):
        raise AssertionError(f"{expression!r} failed: {result}")
    return result


def gateway_extra(stale: bool) -> dict[str, list[str]]:
    """``user.extra`` exactly as the gateway renders it with its default markers."""
    markers = GatewayConfig.model_validate({"backends": [DEMO]}).markers
    verdict = Verdict(Authenticated(UserInfo("alice", extra={"team": ("a",)})), "ldap", stale=stale)
    body = render_verdict(V1, verdict, Markers(markers.prefix, markers.stale, markers.backend))
    extra: dict[str, list[str]] = orjson.loads(body.body)["status"]["user"]["extra"]
    return extra


def request(extra: dict[str, list[str]] | None, operation: str = "CREATE") -> dict[str, Any]:
    user: dict[str, Any] = {"username": "alice", "groups": ["dev", "system:authenticated"]}
    if extra is not None:
        user["extra"] = extra
    return {
        "operation": operation,
        "userInfo": user,
        "resource": {"group": "apps", "version": "v1", "resource": "deployments"},
        "namespace": "default",
    }


def test_kustomize_renders_exactly_the_policy_and_its_binding() -> None:
    assert render("policy") == documents()


def test_the_policy_and_its_binding_are_v1_objects_that_refer_to_each_other() -> None:
    policy, binding = documents()
    assert policy["apiVersion"] == binding["apiVersion"] == "admissionregistration.k8s.io/v1"
    assert (policy["kind"], binding["kind"]) == (
        "ValidatingAdmissionPolicy",
        "ValidatingAdmissionPolicyBinding",
    )
    assert binding["spec"]["policyName"] == policy["metadata"]["name"]
    assert "Deny" in binding["spec"]["validationActions"]


def test_kube_apiserver_would_admit_the_policy_and_its_binding() -> None:
    # The rules of pkg/apis/admissionregistration/validation/validation.go
    # (ValidateValidatingAdmissionPolicy, ...Binding), encoded in tests/support/kube.
    # Broken copies are refused there: tests/deploy/test_deploy_kube_validation.py.
    policy, binding = documents()
    assert validate(policy) == []
    assert validate(binding) == []


def test_every_write_operation_is_covered_including_exec_and_subresources() -> None:
    policy, _ = documents()
    [rule] = policy["spec"]["matchConstraints"]["resourceRules"]
    assert set(rule["operations"]) == {"CREATE", "UPDATE", "DELETE", "CONNECT"}
    # Every resource and subresource (pods/exec, deployments/scale, ...); kube refuses
    # anything next to "*/*".
    assert rule["resources"] == ["*/*"]
    assert rule["apiGroups"] == ["*"]


@pytest.mark.parametrize(
    ("extra", "matches"),
    [
        ({STALE_KEY: ["true"], "authn-gateway.io/backend": ["keystone"]}, True),
        ({"authn-gateway.io/backend": ["keystone"]}, False),  # a fresh answer
        ({}, False),
        (None, False),  # no extra at all
        ({STALE_KEY: ["false"]}, False),
    ],
)
def test_the_policy_matches_stale_identities_only(
    extra: dict[str, list[str]] | None, matches: bool
) -> None:
    policy, _ = documents()
    [condition] = policy["spec"]["matchConditions"]
    assert evaluate(condition["expression"], request(extra)) == matches


@pytest.mark.parametrize("stale", [True, False])
def test_the_policy_reads_the_markers_the_gateway_sends(stale: bool) -> None:
    policy, _ = documents()
    [condition] = policy["spec"]["matchConditions"]
    assert evaluate(condition["expression"], request(gateway_extra(stale))) == stale


def test_a_matched_request_is_refused_with_a_message_naming_the_user() -> None:
    policy, _ = documents()
    [validation] = policy["spec"]["validations"]
    stale = request({STALE_KEY: ["true"]})
    assert bool(evaluate(validation["expression"], stale)) is False
    message = evaluate(validation["messageExpression"], stale)
    assert "alice" in message and "read-only" in message
