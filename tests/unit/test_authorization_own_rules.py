"""The gateway's own rules (authorization.rules): who, what, the effect; first match
decides; patterns are names, ``*`` or RE2 regexes."""

from __future__ import annotations

from typing import Any

import orjson
import pytest
from pydantic import ValidationError

from authn_gateway.authorization.keystone_policy import PROJECT_ID, PROJECT_NAME, ROLES
from authn_gateway.authorization.own_rules import compile_rules
from authn_gateway.authorization.rules import ALLOWED, DENIED, NO_OPINION, policy_of
from authn_gateway.authorization.sar import (
    V1,
    AccessReview,
    NonResourceAttributes,
    ResourceAttributes,
)
from authn_gateway.config.authorization import AuthorizationSettings, compile_regex


def decide(rules: list[dict[str, Any]], review: AccessReview) -> str:
    settings = AuthorizationSettings.model_validate({"rules": rules})
    return policy_of([("rules", compile_rules(settings.rules))]).decide(review).kind


def who(user: str = "alice", uid: str = "", groups: tuple[str, ...] = (),
        roles: tuple[str, ...] = (), project: str = "",
        project_id: str = "") -> dict[str, Any]:  # fmt: skip
    extra: dict[str, tuple[str, ...]] = {ROLES: roles} if roles else {}
    if project:
        extra[PROJECT_NAME] = (project,)
    if project_id:
        extra[PROJECT_ID] = (project_id,)
    return {"user": user, "uid": uid, "groups": groups, "extra": extra}


def res(verb: str, resource: str, namespace: str = "", subresource: str = "", group: str = "",
        name: str = "", **subject: Any) -> AccessReview:  # fmt: skip
    s = who(**subject)
    attrs = ResourceAttributes(namespace, verb, group, "v1", resource, subresource, name)
    return AccessReview(V1, s["user"], s["uid"], s["groups"], s["extra"], attrs, None)


def nonres(verb: str, path: str, **subject: Any) -> AccessReview:
    s = who(**subject)
    at = NonResourceAttributes(path, verb)
    return AccessReview(V1, s["user"], s["uid"], s["groups"], s["extra"], None, at)


READ_PODS = {"verbs": ["get", "list"], "resources": ["pods", "pods/log"]}


def test_who_keys_all_hold_and_any_value_of_each() -> None:
    rules = [{"roles": ["member", "admin"], "projects": ["demo"], "resources": [READ_PODS]}]
    assert decide(rules, res("get", "pods", "a", roles=("member",), project="demo")) == ALLOWED
    assert decide(rules, res("get", "pods", "a", roles=("member",), project_id="demo")) == ALLOWED
    assert decide(rules, res("get", "pods", "a", roles=("member",), project="other")) == NO_OPINION
    assert decide(rules, res("get", "pods", "a", project="demo")) == NO_OPINION


def test_all_roles_needs_every_one() -> None:
    rules = [{"all_roles": ["a", "b"], "resources": [READ_PODS]}]
    assert decide(rules, res("get", "pods", roles=("a", "b", "c"))) == ALLOWED
    assert decide(rules, res("get", "pods", roles=("a",))) == NO_OPINION


def test_users_match_the_name_and_uids_the_uid_never_one_for_the_other() -> None:
    # As RBAC's User subjects and k8s-keystone-auth's "user" match (whose webhook never
    # reads spec.uid): a user whose id is another user's name gets nothing of theirs.
    by_name = [{"users": ["4f1c"], "resources": [READ_PODS]}]
    assert decide(by_name, res("get", "pods", user="4f1c")) == ALLOWED
    assert decide(by_name, res("get", "pods", user="alice", uid="4f1c")) == NO_OPINION
    by_uid = [{"uids": ["4f1c"], "resources": [READ_PODS]}]
    assert decide(by_uid, res("get", "pods", user="alice", uid="4f1c")) == ALLOWED
    assert decide(by_uid, res("get", "pods", user="4f1c", uid="")) == NO_OPINION
    anyone_with_an_id = [{"uids": ["*"], "resources": [READ_PODS]}]
    assert decide(anyone_with_an_id, res("get", "pods", user="bob", uid="")) == NO_OPINION


def test_resources_read_as_rbac_reads_them() -> None:
    def can(resources: list[str], resource: str, subresource: str = "") -> str:
        rules = [{"resources": [{"verbs": ["get"], "resources": resources}]}]
        return decide(rules, res("get", resource, "ns", subresource))

    assert can(["pods"], "pods") == ALLOWED
    assert can(["pods"], "pods", "log") == NO_OPINION  # a subresource is its own
    assert can(["pods/log"], "pods", "log") == ALLOWED
    assert can(["pods/*"], "pods", "exec") == ALLOWED
    assert can(["pods/*"], "pods") == NO_OPINION
    assert can(["*/scale"], "deployments", "scale") == ALLOWED
    assert can(["*"], "secrets", "x") == ALLOWED
    assert can(["~(pods|services)(/.*)?"], "services", "proxy") == ALLOWED


def test_namespaces_names_groups_and_exceptions() -> None:
    block = {"verbs": ["*"], "namespaces": ["~team-[a-z]+"], "except_namespaces": ["team-ops"],
             "except_resources": ["secrets"], "api_groups": ["", "apps"]}  # fmt: skip
    rules = [{"groups": ["devs"], "resources": [block]}]
    devs = {"groups": ("devs",)}
    assert decide(rules, res("delete", "pods", "team-web", **devs)) == ALLOWED
    assert decide(rules, res("delete", "pods", "team-ops", **devs)) == NO_OPINION
    assert decide(rules, res("get", "secrets", "team-web", **devs)) == NO_OPINION
    assert decide(rules, res("get", "deployments", "team-web", group="apps", **devs)) == ALLOWED
    assert decide(rules, res("get", "jobs", "team-web", group="batch", **devs)) == NO_OPINION
    assert decide(rules, res("get", "pods", "", **devs)) == NO_OPINION  # cluster-scoped
    named = [{"resources": [{"verbs": ["get"], "names": ["web-0"]}]}]
    assert decide(named, res("get", "pods", "a", name="web-0")) == ALLOWED
    assert decide(named, res("get", "pods", "a", name="web-1")) == NO_OPINION


def test_an_exception_takes_out_the_resource_with_its_subresources() -> None:
    # k8s-keystone-auth's "!['pods']" never compares the subresource: it shuts out
    # pods/exec and pods/log too (authorizer.go, resourcePermissionAllowed reads
    # GetResource() alone). Our "except pods" does the same; "pods/exec" only that one.
    def can(excepted: list[str], resource: str, subresource: str = "") -> str:
        rules = [{"resources": [{"verbs": ["*"], "except_resources": excepted}]}]
        return decide(rules, res("create", resource, "default", subresource))

    assert can(["pods"], "pods") == NO_OPINION
    assert can(["pods"], "pods", "exec") == NO_OPINION
    assert can(["pods"], "pods", "log") == NO_OPINION
    assert can(["pods"], "services", "proxy") == ALLOWED
    assert can(["pods/exec"], "pods", "exec") == NO_OPINION
    assert can(["pods/exec"], "pods", "log") == ALLOWED
    assert can(["pods/exec"], "pods") == ALLOWED
    assert can(["pods/*"], "pods", "log") == NO_OPINION
    assert can(["pods/*"], "pods") == ALLOWED
    assert can(["*/scale"], "deployments", "scale") == NO_OPINION
    assert can(["~po.*"], "pods", "exec") == NO_OPINION  # tried on "pods" too
    assert can(["~po.*"], "services") == ALLOWED
    # In a deny rule, the exception narrows what is denied, subresources included.
    rules = [{"effect": "deny", "resources": [{"verbs": ["*"], "except_resources": ["pods"]}]}]
    assert decide(rules, res("create", "pods", "default", "exec")) == NO_OPINION
    assert decide(rules, res("create", "secrets", "default")) == DENIED


def test_paths_exact_prefix_and_regex() -> None:
    paths = ["/healthz", "/apis/*", "~/version/?"]
    rules = [{"non_resources": [{"verbs": ["get"], "paths": paths}]}]
    assert decide(rules, nonres("get", "/healthz")) == ALLOWED
    assert decide(rules, nonres("get", "/healthz/etcd")) == NO_OPINION
    assert decide(rules, nonres("get", "/apis/apps/v1")) == ALLOWED
    assert decide(rules, nonres("get", "/version/")) == ALLOWED
    assert decide(rules, nonres("post", "/healthz")) == NO_OPINION
    assert decide(rules, res("get", "pods")) == NO_OPINION  # a resource request


def test_every_trailing_star_of_a_path_is_the_prefix_mark() -> None:
    # k8s-keystone-auth: HasPrefix(path, TrimRight(rule, "*")) once the rule ends in "*".
    rules = [{"non_resources": [{"verbs": ["get"], "paths": ["/api**", "/x/*"]}]}]
    assert decide(rules, nonres("get", "/api")) == ALLOWED
    assert decide(rules, nonres("get", "/apis/apps")) == ALLOWED
    assert decide(rules, nonres("get", "/api*")) == ALLOWED
    assert decide(rules, nonres("get", "/ap")) == NO_OPINION
    assert decide(rules, nonres("get", "/x/")) == ALLOWED
    assert decide(rules, nonres("get", "/x")) == NO_OPINION


def test_the_first_rule_that_holds_decides() -> None:
    rules = [
        {"effect": "deny", "name": "no-secrets",
         "resources": [{"verbs": ["*"], "resources": ["secrets"]}]},
        {"resources": [{"verbs": ["*"]}]},
    ]  # fmt: skip
    assert decide(rules, res("get", "secrets", "a")) == DENIED
    assert decide(rules, res("get", "pods", "a")) == ALLOWED
    settings = AuthorizationSettings.model_validate({"rules": rules})
    policy = policy_of([("rules", compile_rules(settings.rules))])
    status = orjson.loads(policy.decide(res("get", "secrets")).bodies[V1])["status"]
    assert status == {
        "allowed": False,
        "denied": True,
        "reason": "denied by authorization.rules[0] (no-secrets)",
    }


def test_a_crafted_name_costs_linear_time_whatever_the_regex() -> None:
    # (a+)+$ backtracks exponentially in Python's re; RE2 does not backtrack.
    # Python's re would not return here for longer than the suite's timeout.
    rules = [{"resources": [{"verbs": ["get"], "namespaces": ["~(a+)+$"]}]}]
    assert decide(rules, res("get", "pods", "a" * 5000 + "!")) == NO_OPINION
    assert type(compile_regex("(a+)+$")).__module__ == "re2"


@pytest.mark.parametrize(
    ("rules", "where", "message"),
    [
        ([{"resources": [{"verbs": ["get"], "namespaces": ["~team-("]}]}],
         ("rules", 0, "resources", 0, "namespaces", 0), "bad regex: missing ): team-("),
        ([{"non_resources": [{"verbs": ["get"], "paths": ["~[z-a]"]}]}],
         ("rules", 0, "non_resources", 0, "paths", 0),
         "bad regex: invalid character class range: z-a"),
        # What RE2 cannot match in linear time is refused at load, not matched slowly.
        ([{"resources": [{"verbs": ["get"], "names": [r"~(a)\1"]}]}],
         ("rules", 0, "resources", 0, "names", 0), "bad regex: invalid escape sequence: \\1"),
        ([{"resources": [{"verbs": ["get"], "resources": ["~pods(?=/log)"]}]}],
         ("rules", 0, "resources", 0, "resources", 0), "bad regex: invalid perl operator: (?="),
        ([{"roles": ["member"]}], ("rules", 0),
         "needs resources or non_resources (a rule for nothing never holds)"),
        ([{"effect": "maybe", "resources": [READ_PODS]}], ("rules", 0, "effect"), None),
        ([{"resources": [{"verbs": []}]}], ("rules", 0, "resources", 0, "verbs"), None),
    ],
)  # fmt: skip
def test_invalid_rules_are_refused_naming_the_rule(
    rules: list[dict[str, Any]], where: tuple[Any, ...], message: str | None
) -> None:
    with pytest.raises(ValidationError) as caught:
        AuthorizationSettings.model_validate({"rules": rules})
    error = caught.value.errors()[0]
    assert error["loc"] == where
    if message is not None:
        assert error["msg"].removeprefix("Value error, ") == message


def test_a_section_without_rules_or_file_is_refused() -> None:
    with pytest.raises(ValidationError, match="needs keystone_policy_file or rules"):
        AuthorizationSettings.model_validate({})
