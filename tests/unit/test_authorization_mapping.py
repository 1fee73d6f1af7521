"""The documented mapping of k8s-keystone-auth's rules onto the own rules decides alike.

docs/authorization.md ("From a k8s-keystone-auth rule to an own rule") has a table: a
k8s-keystone-auth rule (JSON, as in its policy file) and the own rule that decides the
same (YAML, as in ``authorization.rules``). This test reads the table from the docs, so
the docs cannot drift from what is tested, and runs both rules of each row over the same
generated SubjectAccessReviews: users with and without roles, projects and groups, a uid
or none (drawn from the names the rules use, so that a name and an id can collide),
namespaced and cluster-scoped requests, subresources, non-resource paths around each
rule's path, verbs in either case, both apiVersions. The k8s-keystone-auth side is its
policy read as it is (authn_gateway/authorization/keystone_policy.py, checked on
k8s-keystone-auth's own test tables in test_authorization_keystone_policy.py).

The audit's three cases (k8s-keystone-auth's authorizer.go at aeecb0ce) are pinned by
name below as well: ``!['pods']`` shuts out pods/exec (resourcePermissionAllowed reads
the resource alone, L103); a match value ``*`` holds for a user with no role (``match``,
L242); ``/api**`` is the prefix ``/api`` (nonResourceMatches' TrimRight, L218).
"""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson
import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from authn_gateway.authorization.keystone_policy import (
    PROJECT_ID,
    PROJECT_NAME,
    ROLES,
    parse_keystone_policy,
)
from authn_gateway.authorization.own_rules import compile_rules
from authn_gateway.authorization.rules import ALLOWED, NO_OPINION, Policy, policy_of
from authn_gateway.authorization.sar import GROUPS_FIELD, V1, V1BETA1, parse_access_review
from authn_gateway.config.authorization import AuthorizationSettings

DOC = Path(__file__).resolve().parents[2] / "docs" / "authorization.md"
HEADER = (
    "| rule kind | k8s-keystone-auth (policy file) | the own rule that decides the same "
    "| what to know |"
)


@dataclass(frozen=True)
class Row:
    kind: str
    keystone: str  # one rule of a k8s-keystone-auth policy file, JSON
    own: str  # one rule of authorization.rules, YAML flow

    @functools.cache  # noqa: B019 (a handful of rows, kept for the module's life)
    def policies(self) -> tuple[Policy, Policy]:
        theirs = parse_keystone_policy(b"[" + self.keystone.encode() + b"]", "policy.json")
        assert theirs.notes == (), theirs.notes  # a row's rule matches as written
        settings = AuthorizationSettings.model_validate({"rules": [yaml.safe_load(self.own)]})
        ours = compile_rules(settings.rules)
        return policy_of([("policy.json", theirs.rules)]), policy_of([("rules", ours)])


def _code(cell: str) -> str:
    cell = cell.strip()
    assert cell.startswith("`") and cell.endswith("`") and cell.count("`") == 2, cell
    return cell[1:-1]


def mapping_rows() -> list[Row]:
    lines = DOC.read_text().splitlines()
    start = lines.index(HEADER)
    assert set(lines[start + 1]) <= {"|", "-"}
    rows = []
    for line in lines[start + 2 :]:
        if not line.startswith("|"):
            break
        kind, keystone, own, _ = line.strip().strip("|").split(" | ")
        rows.append(Row(kind.strip(), _code(keystone), _code(own)))
    return rows


ROWS = mapping_rows()


def _words(text: str) -> set[str]:
    return set(re.findall(r"[a-z][a-z0-9-]*", text))


def _paths(text: str) -> set[str]:
    """Each path a rule names, and paths around it: itself without its stars, one
    character more and one less, and the star itself."""
    found = {""}
    for path in re.findall(r"/[a-z0-9/*]*", text):
        bare = path.rstrip("*")
        found |= {path, bare, bare + "x", bare + "/v1", bare[:-1], bare + "*"}
    return found


TEXT = " ".join(f"{r.keystone} {r.own}" for r in ROWS)
#: Every name the table's rules use, and names none uses: users, groups, roles,
#: projects, namespaces, resources, API groups, verbs are all drawn from these.
NAMES = sorted(_words(TEXT) | {"", "*", "other", "x"})
PATHS = sorted(_paths(TEXT) | {"*", "/", "/api", "/apis", "/healthz/etcd"})
VERBS = sorted({"get", "list", "watch", "create", "delete", "GET", "*", ""} | _words(TEXT))

names = st.sampled_from(NAMES)
some = st.lists(names, max_size=3, unique=True)


@st.composite
def access_reviews(draw: st.DrawFn) -> bytes:
    api_version = draw(st.sampled_from((V1, V1BETA1)))
    extra: dict[str, list[str]] = {}
    for key in (ROLES, PROJECT_ID, PROJECT_NAME):
        if draw(st.booleans()):  # absent, or a list (maybe empty)
            extra[key] = draw(some)
    if draw(st.booleans()):
        extra["authn-gateway.io/backend"] = ["keystone"]
    spec: dict[str, Any] = {
        "user": draw(names),
        "uid": draw(names),
        GROUPS_FIELD[api_version]: draw(some),
        "extra": extra,
    }
    if draw(st.booleans()):
        resource = draw(names)
        attributes = {
            "namespace": draw(names),
            "verb": draw(st.sampled_from(VERBS)),
            "group": draw(names),
            "version": "v1",
            "resource": resource,
            "name": draw(names),
        }
        # A subresource comes with a resource, as kube-apiserver's requests have it.
        if resource and draw(st.booleans()):
            attributes["subresource"] = draw(names.filter(bool))
        spec["resourceAttributes"] = attributes
    else:
        spec["nonResourceAttributes"] = {
            "path": draw(st.sampled_from(PATHS)),
            "verb": draw(st.sampled_from(VERBS)),
        }
    return orjson.dumps({"apiVersion": api_version, "kind": "SubjectAccessReview", "spec": spec})


def test_the_table_has_a_row_for_each_rule_kind() -> None:
    kinds = [row.kind for row in ROWS]
    assert len(kinds) == len(set(kinds)), kinds
    text = " ".join(row.keystone for row in ROWS)
    for field in ('"users"', '"match"', '"resource_permissions"', '"nonresource_permissions"',
                  '"resource"', '"nonresource"', '"!', "['", '"*"]'):  # fmt: skip
        assert field in text, field
    for kind in ("role", "project", "group", "user"):
        assert f'"type": "{kind}"' in text, kind


@pytest.mark.parametrize("row", ROWS, ids=[row.kind for row in ROWS])
@settings(max_examples=400, deadline=None)
@given(body=access_reviews())
def test_each_documented_own_rule_decides_as_its_k8s_keystone_auth_rule(
    row: Row, body: bytes
) -> None:
    theirs, ours = row.policies()
    review = parse_access_review(body)
    expected = theirs.decide(review).kind
    assert ours.decide(review).kind == expected, (row.kind, orjson.loads(body)["spec"])


def _row(kind: str) -> Row:
    (found,) = [row for row in ROWS if row.kind == kind]
    return found


def _review(resource: dict[str, str] | None = None, path: str = "", **spec: Any) -> bytes:
    body: dict[str, Any] = {"user": "nobody", **spec}
    if resource is not None:
        body["resourceAttributes"] = resource
    else:
        body["nonResourceAttributes"] = {"path": path, "verb": "get"}
    return orjson.dumps({"apiVersion": V1, "kind": "SubjectAccessReview", "spec": body})


@pytest.mark.parametrize(
    ("kind", "body", "answer"),
    [
        # !['pods'] shuts out pods/exec: the subresource is never compared.
        ("`resource_permissions`, `!` sides",
         _review({"namespace": "default", "verb": "create", "resource": "pods",
                  "subresource": "exec"}), NO_OPINION),
        ("`resource_permissions`, `!` sides",
         _review({"namespace": "default", "verb": "create", "resource": "services",
                  "subresource": "proxy"}), ALLOWED),
        # "*" in a match entry's values holds for a user with no role at all.
        ("`match` value `*`", _review({"verb": "list", "resource": "namespaces"}), ALLOWED),
        # Every trailing "*" is stripped: "/api**" is the prefix "/api".
        ("`nonresource`, stars", _review(path="/apis/apps/v1"), ALLOWED),
        ("`nonresource`, stars", _review(path="/ap"), NO_OPINION),
        # The user match compares the name, never the uid.
        ("`match` `user`", _review(path="/healthz", user="bob", uid="alice"), NO_OPINION),
    ],
)  # fmt: skip
def test_the_audits_cases_decide_alike(kind: str, body: bytes, answer: str) -> None:
    theirs, ours = _row(kind).policies()
    review = parse_access_review(body)
    assert theirs.decide(review).kind == answer
    assert ours.decide(review).kind == answer
