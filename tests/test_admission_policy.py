"""deploy/policy: the ValidatingAdmissionPolicy that makes stale identities read-only.

No kube-apiserver can run here (Debian ships only kubectl; it is not on PyPI), so
this checks the objects' structure as kube-apiserver's v1 schema defines it, and
evaluates every CEL expression with cel-python (a CEL implementation of the spec)
on AdmissionRequests shaped as kube-apiserver builds them.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import celpy
import pytest
import yaml

from tests.test_deploy import render

POLICY_FILE = (
    Path(__file__).resolve().parent.parent / "deploy" / "policy" / "stale-identities-read-only.yaml"
)
STALE_KEY = "authn-gateway.io/stale"


def documents() -> tuple[dict[str, Any], dict[str, Any]]:
    policy, binding = yaml.safe_load_all(POLICY_FILE.read_text())
    return policy, binding


def evaluate(expression: str, request: dict[str, Any]) -> Any:
    env = celpy.Environment()
    result = env.program(env.compile(expression)).evaluate({"request": celpy.json_to_cel(request)})
    if isinstance(result, celpy.CELEvalError):
        raise AssertionError(f"{expression!r} failed: {result}")
    return result


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
    assert set(binding["spec"]["validationActions"]) <= {"Deny", "Warn", "Audit"}
    assert "Deny" in binding["spec"]["validationActions"]
    spec = policy["spec"]
    assert spec["failurePolicy"] in ("Fail", "Ignore")
    for rule in spec["matchConstraints"]["resourceRules"]:
        assert set(rule) <= {"apiGroups", "apiVersions", "operations", "resources", "scope"}
        assert set(rule["operations"]) <= {"CREATE", "UPDATE", "DELETE", "CONNECT", "*"}
    for condition in spec["matchConditions"]:
        assert set(condition) == {"name", "expression"}
    for validation in spec["validations"]:
        assert set(validation) <= {"expression", "message", "messageExpression", "reason"}
        assert validation.get("reason") in (
            None,
            "Unauthorized",
            "Forbidden",
            "Invalid",
            "RequestEntityTooLarge",
        )


def test_every_write_operation_is_covered_including_exec_and_subresources() -> None:
    policy, _ = documents()
    [rule] = policy["spec"]["matchConstraints"]["resourceRules"]
    assert set(rule["operations"]) == {"CREATE", "UPDATE", "DELETE", "CONNECT"}
    assert "*/*" in rule["resources"]  # pods/exec, deployments/scale, ...
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


def test_a_matched_request_is_refused_with_a_message_naming_the_user() -> None:
    policy, _ = documents()
    [validation] = policy["spec"]["validations"]
    stale = request({STALE_KEY: ["true"]})
    assert bool(evaluate(validation["expression"], stale)) is False
    message = evaluate(validation["messageExpression"], stale)
    assert "alice" in message and "read-only" in message
