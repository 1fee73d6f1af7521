"""k8s-keystone-auth's policy format, decided as its authorizer decides it.

The tables are k8s-keystone-auth's own (``TestAuthorizer`` and ``TestAuthorizerVersion2``
in pkg/identity/keystone/authorizer_test.go of kubernetes/cloud-provider-openstack, at
4205e04a), over its test policies (authorizer_test_policy.json at 92384600 and
authorizer_test_policy_version2.json at 25a502c0). Its "DecisionDeny" is "No policy
matched.", which its webhook sends as ``allowed: false`` alone: our no opinion.

The stored version-1 policy predates four of the test's cases; the rules they need are
written here as the test's own comments describe them ("expected to be tested with
policy where resources: [\"user_resource3/*\"]", "path: [\"/api/*\"]"). Its rule of an
unknown match type is refused here at load (see the last tests) and left out of it.
"""

from __future__ import annotations

import json
from typing import Any

import orjson
import pytest

from authn_gateway.authorization.keystone_policy import (
    PROJECT_ID,
    PROJECT_NAME,
    ROLES,
    PolicyError,
    parse_keystone_policy,
)
from authn_gateway.authorization.rules import ALLOWED, NO_OPINION, policy_of
from authn_gateway.authorization.sar import (
    V1,
    AccessReview,
    NonResourceAttributes,
    ResourceAttributes,
)


def rule(resource: dict[str, Any] | None = None, nonresource: dict[str, Any] | None = None,
         match: list[dict[str, Any]] | None = None, **more: Any) -> dict[str, Any]:  # fmt: skip
    out: dict[str, Any] = dict(more)
    if resource is not None:
        out["resource"] = {"version": "*", "namespace": "*", **resource}
    if nonresource is not None:
        out["nonresource"] = nonresource
    if match is not None:
        out["match"] = match
    return out


def m(kind: str, *values: str) -> dict[str, Any]:
    return {"type": kind, "values": list(values)}


USER1_ROLE1 = [m("user", "user1"), m("role", "role1")]

VERSION1 = [
    rule({"verbs": ["get", "list"], "resources": ["user_resource1", "user_resource2"]},
         match=USER1_ROLE1),
    rule({"verbs": ["get"], "resources": ["group_resource"]}, match=[m("group", "group1")]),
    rule({"verbs": ["get"], "resources": ["group_role_resource"]},
         match=[m("group", "group1"), m("role", "role3")]),
    rule({"verbs": ["get"], "resources": ["project_resource"]}, match=[m("project", "project1")]),
    rule({"verbs": ["get"], "resources": ["role_resource"]}, match=[m("role", "role1")]),
    rule(nonresource={"verbs": ["get"], "path": "/user"}, match=[m("user", "user1")]),
    rule(nonresource={"verbs": ["get"], "path": "/group"}, match=[m("group", "group1")]),
    rule(nonresource={"verbs": ["get"], "path": "/project"}, match=[m("project", "project1")]),
    rule(nonresource={"verbs": ["get"], "path": "/role"}, match=[m("role", "role1")]),
    rule({"verbs": ["get"], "resources": ["user_resource"]},
         nonresource={"verbs": ["get"], "path": "/user"}, match=[m("user", "user1")]),
    rule({"verbs": [""], "resources": ["user_resource"]}, match=[m("user", "user1")]),
    rule(nonresource={"verbs": [""], "path": "/user"}, match=[m("user", "user1")]),
    rule({"verbs": ["get"]}, match=[m("user", "user1")]),
    rule(nonresource={"verbs": ["get"]}, match=[m("user", "user1")]),
    # Written from the test's comments (see the module docstring).
    rule({"verbs": ["get"], "resources": ["core_resource"], "version": ""}, match=USER1_ROLE1),
    rule({"verbs": ["get"], "resources": ["user_resource1/subresource1", "user_resource3/*"]},
         match=USER1_ROLE1),
    rule(nonresource={"verbs": ["get"], "path": "/api"}, match=USER1_ROLE1),
    rule(nonresource={"verbs": ["get"], "path": "/api/*"}, match=USER1_ROLE1),
]  # fmt: skip

VERSION2 = [
    {
        "users": {"roles": ["developer"], "projects": ["demo"]},
        "resource_permissions": {
            "!kube-system/!['namespaces', 'clusterrolebindings', 'clusterroles', "
            "'podsecuritypolicies', 'rolebindings', 'roles', 'podSecurityPolicies']": ["*"],
            "!kube-system/['namespaces', 'clusterrolebindings', 'clusterroles', "
            "'podsecuritypolicies', 'rolebindings', 'roles', 'podSecurityPolicies']": [
                "get",
                "list",
            ],
        },
    },
    {
        "users": {"roles": ["viewer"], "projects": ["demo", "cd08a539b7c845ddb92c5d08752101d1"]},
        "resource_permissions": {"default/['*']": ["get", "list"]},
    },
    {
        "users": {"roles": ["clusteradmin"], "projects": ["demo"]},
        "resource_permissions": {"*/*": ["*"]},
        "nonresource_permissions": {"/healthz": ["get", "post"]},
    },
]


def user(name: str, groups: list[str], **extra: list[str]) -> dict[str, Any]:
    keys = {"project_name": PROJECT_NAME, "project_id": PROJECT_ID, "roles": ROLES}
    return {"user": name, "groups": tuple(groups),
            "extra": {keys[k]: tuple(v) for k, v in extra.items()}}  # fmt: skip


USER1 = user("user1", ["group1"], project_name=["project1"], roles=["role1"])
USER2 = user("user2", ["group2"], project_name=["project2"], roles=["role2"])
DEVELOPER = user("developer", ["group1"], project_name=["demo"], roles=["developer"])
VIEWER = user("viewer", ["group2"], project_name=["demo"],
              project_id=["ff9db8980cf24a74bc9dd796b6ce811f"], roles=["viewer"])  # fmt: skip
ANOTHERVIEWER = user("anotherviewer", ["group"], project_name=["alt_demo"],
                     project_id=["cd08a539b7c845ddb92c5d08752101d1"], roles=["viewer"])  # fmt: skip
CLUSTERADMIN = user("clusteradmin", ["group2"], project_name=["demo"], roles=["clusteradmin"])


def resource(who: dict[str, Any], verb: str, res: str, namespace: str = "", group: str = "",
             subresource: str = "") -> AccessReview:  # fmt: skip
    attrs = ResourceAttributes(namespace, verb, group, "", res, subresource, "")
    return AccessReview(V1, who["user"], "", who["groups"], who["extra"], attrs, None)


def path(who: dict[str, Any], verb: str, at: str) -> AccessReview:
    return AccessReview(
        V1, who["user"], "", who["groups"], who["extra"], None, NonResourceAttributes(at, verb)
    )


def decide(rules: list[dict[str, Any]], review: AccessReview) -> str:
    parsed = parse_keystone_policy(orjson.dumps(rules), "policy.json")
    return policy_of([("policy.json", parsed.rules)]).decide(review).kind


ALLOW, DENY = ALLOWED, NO_OPINION

VERSION1_CASES = [
    # Resource user match
    (resource(USER1, "get", "user_resource1"), ALLOW),
    (resource(USER1, "list", "user_resource2"), ALLOW),
    (resource(USER1, "patch", "user_resource1"), DENY),
    (resource(USER2, "get", "user_resource1"), DENY),
    # Resource group match
    (resource(USER1, "get", "group_resource"), ALLOW),
    (resource(USER1, "patch", "group_resource"), DENY),
    (resource(USER2, "get", "group_resource"), DENY),
    # Resource group and role match
    (resource(USER1, "get", "group_role_resource"), DENY),
    # Resource project match
    (resource(USER1, "get", "project_resource"), ALLOW),
    (resource(USER1, "patch", "project_resource"), DENY),
    (resource(USER2, "get", "project_resource"), DENY),
    # Resource role match
    (resource(USER1, "get", "role_resource"), ALLOW),
    (resource(USER1, "patch", "role_resource"), DENY),
    (resource(USER2, "get", "role_resource"), DENY),
    # Core api group resource match
    (resource(USER1, "get", "core_resource"), ALLOW),
    (resource(USER1, "get", "core_resource", group="NonCoreAPIGroup"), DENY),
    # Nonresource user, group, project, role match
    *(
        case
        for at in ("/user", "/group", "/project", "/role")
        for case in (
            (path(USER1, "get", at), ALLOW),
            (path(USER1, "patch", at), DENY),
            (path(USER2, "get", at), DENY),
        )
    ),
    # Subresources: listed exactly, not listed, and resource/*
    (resource(USER1, "get", "user_resource1", subresource="subresource1"), ALLOW),
    (resource(USER1, "get", "user_resource1", subresource="subresource2"), DENY),
    (resource(USER1, "get", "user_resource3", subresource="wildcard_resource"), ALLOW),
    # Non-resource paths: exact, absent, and a trailing *
    (path(USER1, "get", "/api"), ALLOW),
    (path(USER1, "get", "/imaginary_api/path/none"), DENY),
    (path(USER1, "get", "/api/represents/wildcard"), ALLOW),
]


@pytest.mark.parametrize(("review", "expected"), VERSION1_CASES)
def test_version1_decides_as_k8s_keystone_auths_own_table(review: AccessReview, expected: str):
    assert decide(VERSION1, review) == expected


VERSION2_CASES = [
    (resource(DEVELOPER, "get", "pods", "default"), ALLOW),
    (resource(DEVELOPER, "get", "clusterroles", "default"), ALLOW),
    (resource(DEVELOPER, "get", "clusterroles", ""), ALLOW),
    (resource(DEVELOPER, "create", "clusterrolebindings", ""), DENY),
    # "resource name should be case insensitive": the key is lowered, not the request.
    (resource(DEVELOPER, "get", "podsecuritypolicies", ""), ALLOW),
    (resource(VIEWER, "get", "deployments", "default"), ALLOW),
    (resource(VIEWER, "get", "services", "kube-system"), DENY),
    (resource(VIEWER, "create", "pods", "default"), DENY),
    (resource(ANOTHERVIEWER, "get", "deployments", "default"), ALLOW),
    (resource(ANOTHERVIEWER, "get", "services", "kube-system"), DENY),
    (resource(ANOTHERVIEWER, "create", "pods", "default"), DENY),
    (resource(CLUSTERADMIN, "create", "clusterroles", ""), ALLOW),
    (resource(CLUSTERADMIN, "get", "secrets", "kube-system"), ALLOW),
    (path(DEVELOPER, "get", "/healthz"), DENY),
    (path(VIEWER, "get", "/healthz"), DENY),
    (path(CLUSTERADMIN, "get", "/healthz"), ALLOW),
]


@pytest.mark.parametrize(("review", "expected"), VERSION2_CASES)
def test_version2_decides_as_k8s_keystone_auths_own_table(review: AccessReview, expected: str):
    assert decide(VERSION2, review) == expected


# --- getAllowed, each spelling of a resource_permissions key -----------------------


def v2(key: str, verbs: list[str]) -> list[dict[str, Any]]:
    return [{"users": {"projects": ["demo"]}, "resource_permissions": {key: verbs}}]


DEMO = user("u", [], project_name=["demo"])


@pytest.mark.parametrize(
    ("key", "namespace", "res", "expected"),
    [
        ("default/pods", "default", "pods", ALLOW),
        ("default/pods", "other", "pods", DENY),
        ("default/pods", "", "pods", ALLOW),  # an empty name is allowed by any definition
        ("Default/PODS", "default", "pods", ALLOW),  # keys are lowered
        ("default/pods", "default", "PODS", DENY),  # requests are not
        ("!kube-system/*", "default", "secrets", ALLOW),
        ("!kube-system/*", "kube-system", "secrets", DENY),
        ("!*/*", "default", "pods", DENY),
        ("!/*", "default", "pods", ALLOW),  # "!" excludes only the empty name
        ("default/['pods', 'secrets']", "default", "secrets", ALLOW),
        ("default/['pods', 'secrets']", "default", "nodes", DENY),
        ("default/['*']", "default", "nodes", ALLOW),
        ("default/!['secrets']", "default", "pods", ALLOW),
        ("default/!['secrets']", "default", "secrets", DENY),
        ("default/!['*']", "default", "pods", DENY),
        ("default/['pods'", "default", "pods", DENY),  # no closing bracket: nothing
        ("default/['pods', 3]", "default", "pods", DENY),  # not a string list: skipped
        ("default/pods/log", "default", "pods", DENY),  # not namespace/resource: skipped
        (" default / pods ", "default", "pods", ALLOW),  # sides are trimmed
    ],
)
def test_resource_permission_keys_read_as_get_allowed_reads_them(
    key: str, namespace: str, res: str, expected: str
) -> None:
    assert decide(v2(key, ["get"]), resource(DEMO, "get", res, namespace)) == expected


def test_resource_permissions_never_see_the_subresource() -> None:
    # resourcePermissionAllowed compares GetResource() alone: pods grants pods/log.
    review = resource(DEMO, "get", "pods", "default", subresource="log")
    assert decide(v2("default/pods", ["get"]), review) == ALLOW


def test_resource_permission_verbs_are_lowered_and_star_is_any() -> None:
    assert decide(v2("*/*", ["GET"]), resource(DEMO, "get", "pods", "a")) == ALLOW
    assert decide(v2("*/*", ["*"]), resource(DEMO, "delete", "pods", "a")) == ALLOW
    assert decide(v2("*/*", ["get"]), resource(DEMO, "delete", "pods", "a")) == DENY


def test_nonresource_permissions_match_the_path_exactly() -> None:
    rules = [{"users": {"projects": ["demo"]}, "nonresource_permissions": {"/api/*": ["get"]}}]
    assert decide(rules, path(DEMO, "get", "/api/*")) == ALLOW
    assert decide(rules, path(DEMO, "get", "/api/v1")) == DENY


# --- users, match, precedence ---------------------------------------------------------


def test_users_needs_every_role_and_one_project_by_name_or_id() -> None:
    rules = [{"users": {"roles": ["a", "b"], "projects": ["p", "pid"]},
              "resource_permissions": {"*/*": ["*"]}}]  # fmt: skip
    both = user("u", [], roles=["a", "b", "c"], project_id=["pid"])
    one = user("u", [], roles=["a"], project_name=["p"])
    elsewhere = user("u", [], roles=["a", "b"], project_name=["q"])
    assert decide(rules, resource(both, "get", "pods")) == ALLOW
    assert decide(rules, resource(one, "get", "pods")) == DENY
    assert decide(rules, resource(elsewhere, "get", "pods")) == DENY


def test_users_without_projects_never_matches_and_is_noted() -> None:
    rules = [{"users": {"roles": ["a"]}, "resource_permissions": {"*/*": ["*"]}}]
    parsed = parse_keystone_policy(orjson.dumps(rules), "policy.json")
    assert any("no projects listed" in note for note in parsed.notes), parsed.notes
    assert decide(rules, resource(user("u", [], roles=["a"]), "get", "pods")) == DENY


def test_permissions_take_precedence_over_the_version1_spec() -> None:
    # resource_permissions given: resource (and its match) is not read at all.
    everything = {"verbs": ["*"], "resources": ["*"], "version": "*", "namespace": "*"}
    rules = [{"users": {"projects": ["demo"]}, "resource_permissions": {"*/secrets": ["get"]},
              "resource": everything}]  # fmt: skip
    assert decide(rules, resource(DEMO, "get", "pods", "a")) == DENY
    assert decide(rules, resource(DEMO, "get", "secrets", "a")) == ALLOW


def test_match_entries_must_all_hold_and_star_holds_for_anyone() -> None:
    spec = {"verbs": ["get"], "resources": ["pods"]}
    nobody = user("nobody", [])
    get_pods = resource(nobody, "get", "pods")
    assert decide([rule(spec, match=[m("role", "*"), m("group", "*")])], get_pods) == ALLOW
    assert decide([rule(spec, match=[])], get_pods) == ALLOW
    assert decide([rule(spec)], get_pods) == ALLOW  # no match: anyone
    assert decide([rule(spec, match=[m("user", "nobody"), m("role", "x")])], get_pods) == DENY


def test_a_user_match_compares_the_name_never_the_uid() -> None:
    # k8s-keystone-auth's webhook builds the user from spec.user alone (keystone.go).
    spec = {"verbs": ["get"], "resources": ["pods"]}
    review = resource(user("alice", []), "get", "pods")
    with_uid = AccessReview(V1, "alice", "uid-1", (), {}, review.resource, None)
    assert decide([rule(spec, match=[m("user", "uid-1")])], with_uid) == DENY
    parsed = parse_keystone_policy(orjson.dumps([rule(spec, match=[m("user", "")])]), "p")
    assert any('"" matches every user' in note for note in parsed.notes)


def test_field_names_are_read_in_any_case_as_gos_decoder_reads_them() -> None:
    spec = {"Verbs": ["get"], "RESOURCES": ["pods"], "Version": "*", "Namespace": "*"}
    rules = [{"Resource": spec, "Match": [{"Type": "group", "Values": ["g"]}]}]
    assert decide(rules, resource(user("u", ["g"]), "get", "pods")) == ALLOW


def test_unknown_keys_are_ignored_and_noted() -> None:
    rules = [rule({"verbs": ["get"], "resources": ["pods"]}, description="read pods")]
    parsed = parse_keystone_policy(orjson.dumps(rules), "policy.json")
    assert parsed.notes == ("[0]: key 'description' is not part of the policy format (ignored)",)


def test_a_null_policy_is_no_rules() -> None:
    assert parse_keystone_policy(b"null", "p").rules == ()


# --- refused at load, with the rule's index ------------------------------------------


@pytest.mark.parametrize(
    ("policy", "message"),
    [
        # The rule of k8s-keystone-auth's own test policy that never matches there.
        ([rule({"verbs": ["*"], "resources": ["unknown_type_resource"]},
               match=[m("unknown_type", "*")])],
         "[0].match[0].type: unknown match type 'unknown_type' (role, project, group, user)"),
        ([{}, rule({"verbs": ["get"], "resources": ["pods"]}, match=[{"values": ["x"]}])],
         "[1].match[0].type: unknown match type missing (role, project, group, user)"),
        ([{"resource": {"verbs": ["get"], "resources": ["pods"], "namespace": "*"}}],
         '[0].resource.version: required (a string, "*" for any)'),
        ([{"resource": {"verbs": "get", "resources": ["pods"], "version": "*", "namespace": "*"}}],
         "[0].resource.verbs: must be a list of strings"),
        ([{"match": {"type": "user", "value": "user1"}}],
         "[0].match: must be a list of {type, values} (version 1's format)"),
        ([None], "[0]: must be an object (null is not a rule)"),
        ([{"users": {"roles": "admin"}}], "[0].users['roles']: must be a list of strings"),
        ([{"resource_permissions": ["*/*"]}],
         "[0].resource_permissions: must be an object of string lists"),
        ({"resource": {}}, "must be a JSON list of rules"),
    ],
)  # fmt: skip
def test_what_cannot_be_used_is_refused_naming_the_rule(policy: Any, message: str) -> None:
    with pytest.raises(PolicyError) as caught:
        parse_keystone_policy(json.dumps(policy).encode(), "policy.json")
    assert str(caught.value) == message


def test_a_resource_without_version_is_refused_even_where_no_request_would_reach_it() -> None:
    # There, resourceMatches dereferences version and namespace (authorizer.go L169,
    # L172) only for a resource request past the rule's users gate (L343-359): a rule
    # whose gate holds for no one, or that sits behind a rule allowing everything,
    # never fails there. Refused here all the same (docs/migrating.md warns of it).
    no_version = {"verbs": ["get"], "resources": ["pods"], "namespace": "*"}
    unreachable = [
        [{"users": {"roles": ["a"]}, "resource": no_version}],  # no projects: no one
        [{"resource_permissions": {"*/*": ["*"]}}, {"resource": no_version}],
    ]
    for policy in unreachable:
        with pytest.raises(PolicyError, match=r"\.resource\.version: required"):
            parse_keystone_policy(orjson.dumps(policy), "policy.json")
    # Beside resource_permissions it is never read (L364-369), there or here.
    beside = [{"resource_permissions": {"default/pods": ["get"]}, "resource": no_version}]
    assert decide(beside, resource(DEMO, "get", "pods", "default")) == ALLOW
    parsed = parse_keystone_policy(orjson.dumps(beside), "policy.json")
    assert parsed.notes == ("[0].resource: never read (resource_permissions takes precedence)",)


@pytest.mark.parametrize(
    ("rule", "message"),
    [
        ({"resource_permissions": {}, "resource": {"verbs": "get"}},
         "[0].resource.verbs: must be a list of strings"),
        ({"resource_permissions": {}, "resource": "pods"}, "[0].resource: must be an object"),
        ({"nonresource_permissions": {}, "nonresource": {"path": ["/healthz"]}},
         "[0].nonresource.path: must be a string"),
    ],
)  # fmt: skip
def test_a_field_of_the_wrong_type_is_refused_even_beside_the_map_that_shadows_it(
    rule: dict[str, Any], message: str
) -> None:
    # Go's decoder decodes every field before Authorize picks the map: the file fails.
    with pytest.raises(PolicyError) as caught:
        parse_keystone_policy(orjson.dumps([rule]), "policy.json")
    assert str(caught.value) == message


def test_a_null_rule_is_refused_where_it_would_fail_every_review_reaching_it() -> None:
    # policyList is []*policy (policy.go L82): null decodes as a nil rule, and
    # Authorize reads its p.Users (authorizer.go L343) for every review not yet allowed.
    policy = [{"resource_permissions": {"*/pods": ["get"]}}, None]
    with pytest.raises(PolicyError) as caught:
        parse_keystone_policy(orjson.dumps(policy), "policy.json")
    assert str(caught.value) == "[1]: must be an object (null is not a rule)"


def test_invalid_json_is_refused_with_its_line() -> None:
    with pytest.raises(PolicyError, match=r"^not valid JSON \(line 3\)$"):
        parse_keystone_policy(b'[\n {"match": []},\n {oops}\n]', "policy.json")


def test_an_allowed_answer_names_the_file_and_the_rule() -> None:
    parsed = parse_keystone_policy(orjson.dumps(VERSION1), "policy.json")
    policy = policy_of([("policy.json", parsed.rules)])
    answer = policy.decide(resource(USER1, "get", "core_resource"))
    status = orjson.loads(answer.bodies[V1])["status"]
    assert status == {"allowed": True, "reason": "allowed by policy.json [14]"}
