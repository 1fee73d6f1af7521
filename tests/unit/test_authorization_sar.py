"""The SubjectAccessReview wire format, as kube-apiserver's webhook authorizer writes
it and reads the answer (staging/src/k8s.io/apiserver/plugin/pkg/authorizer/webhook/
webhook.go; the types in k8s.io/api/authorization/v1 and v1beta1)."""

from __future__ import annotations

import contextlib
from typing import Any

import orjson
import pytest
from hypothesis import given
from hypothesis import strategies as st

from authn_gateway.authorization.sar import (
    V1,
    V1BETA1,
    BadAccessReview,
    NonResourceAttributes,
    ResourceAttributes,
    parse_access_review,
    render_status,
)

# What kube-apiserver sends (json.Marshal of authorizationv1.SubjectAccessReview: the
# empty metadata and status are serialized too).
V1_BODY = {
    "kind": "SubjectAccessReview",
    "apiVersion": V1,
    "metadata": {"creationTimestamp": None},
    "spec": {
        "resourceAttributes": {"namespace": "demo", "verb": "get", "version": "v1",
                               "resource": "pods", "subresource": "log", "name": "web-0"},
        "user": "alice",
        "groups": ["developers", "system:authenticated"],
        "extra": {"alpha.kubernetes.io/identity/roles": ["member", "reader"]},
        "uid": "4f1c",
    },
    "status": {"allowed": False},
}  # fmt: skip

# webhook.go's own example of a v1beta1 request: the groups are spec.group.
V1BETA1_BODY = {
    "apiVersion": V1BETA1,
    "kind": "SubjectAccessReview",
    "spec": {
        "resourceAttributes": {"namespace": "kittensandponies", "verb": "GET",
                               "group": "group3", "resource": "pods"},
        "user": "jane",
        "group": ["group1", "group2"],
    },
}  # fmt: skip


def body(doc: dict[str, Any]) -> bytes:
    return orjson.dumps(doc)


def test_a_v1_review_is_read_whole() -> None:
    review = parse_access_review(body(V1_BODY))
    assert review.api_version == V1
    assert (review.user, review.uid) == ("alice", "4f1c")
    assert review.groups == ("developers", "system:authenticated")
    assert review.extra == {"alpha.kubernetes.io/identity/roles": ("member", "reader")}
    assert review.resource == ResourceAttributes("demo", "get", "", "v1", "pods", "log", "web-0")
    assert review.non_resource is None


def test_v1beta1_spells_the_groups_spec_group() -> None:
    review = parse_access_review(body(V1BETA1_BODY))
    assert review.api_version == V1BETA1
    assert review.groups == ("group1", "group2")
    assert review.resource is not None and review.resource.group == "group3"


def test_a_non_resource_review() -> None:
    spec = {"nonResourceAttributes": {"path": "/healthz", "verb": "get"}, "user": "bob"}
    doc = {"apiVersion": V1, "kind": "SubjectAccessReview", "spec": spec}
    review = parse_access_review(body(doc))
    assert review.non_resource == NonResourceAttributes("/healthz", "get")
    assert review.resource is None and review.groups == () and review.extra == {}


def with_spec(**spec: Any) -> bytes:
    doc = {"apiVersion": V1, "kind": "SubjectAccessReview",
           "spec": {"resourceAttributes": {"verb": "get"}, **spec}}  # fmt: skip
    return body({k: v for k, v in doc.items()})


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        (b"{", "body is not valid JSON"),
        (b"[]", "body must be a JSON object"),
        (body({**V1_BODY, "apiVersion": "authentication.k8s.io/v1"}),
         f"apiVersion must be {V1} or {V1BETA1}"),
        (body({**V1_BODY, "kind": "TokenReview"}), "kind must be SubjectAccessReview"),
        (body({**V1_BODY, "spec": []}), "spec must be an object"),
        (with_spec(user=["alice"]), "spec.user must be a string"),
        (with_spec(groups="admins"), "spec.groups must be a list of strings"),
        (with_spec(group=["admins"]), f"spec.group: {V1} spells the groups spec.groups"),
        (with_spec(extra={"k": "v"}), "spec.extra values must be a list of strings"),
        (with_spec(extra=["k"]), "spec.extra must be an object of string lists"),
        (with_spec(resourceAttributes={"verb": 1}),
         "spec.resourceAttributes.verb must be a string"),
        (with_spec(resourceAttributes="pods"), "spec.resourceAttributes must be an object"),
        (with_spec(nonResourceAttributes={"path": "/"}),
         "spec: exactly one of resourceAttributes and nonResourceAttributes must be set"),
        (with_spec(resourceAttributes=None),
         "spec: exactly one of resourceAttributes and nonResourceAttributes must be set"),
    ],
)  # fmt: skip
def test_a_malformed_review_is_refused_naming_the_field(raw: bytes, message: str) -> None:
    with pytest.raises(BadAccessReview) as caught:
        parse_access_review(raw)
    assert str(caught.value) == message


def test_fields_kube_would_ignore_are_ignored() -> None:
    selector = {"rawSelector": "a=b", "requirements": [{"key": "a", "operator": "In"}]}
    raw = with_spec(
        resourceAttributes={"verb": "list", "labelSelector": selector, "fieldSelector": {}},
        future={"x": 1},
    )
    assert parse_access_review(raw).resource is not None


JSON = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**63), 2**63 - 1) | st.text(max_size=8),
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=12), inner, max_size=4)
    ),
    max_leaves=12,
)
FIELDS = st.sampled_from(["user", "uid", "groups", "group", "extra", "resourceAttributes",
                          "nonResourceAttributes"])  # fmt: skip


@given(st.dictionaries(FIELDS, JSON, max_size=5), st.sampled_from([V1, V1BETA1]))
def test_any_spec_is_read_or_refused_never_raises_anything_else(
    spec: dict[str, Any], api_version: str
) -> None:
    raw = body({"apiVersion": api_version, "kind": "SubjectAccessReview", "spec": spec})
    with contextlib.suppress(BadAccessReview):
        parse_access_review(raw)


@given(st.binary(max_size=200))
def test_any_bytes_are_read_or_refused(raw: bytes) -> None:
    with contextlib.suppress(BadAccessReview):
        parse_access_review(raw)


def test_answers_are_what_webhook_go_reads() -> None:
    # Authorize: Denied -> DecisionDeny, Allowed -> DecisionAllow, neither -> NoOpinion.
    allowed = orjson.loads(render_status(V1, True, reason="by rule 1"))
    assert allowed == {"apiVersion": V1, "kind": "SubjectAccessReview",
                       "status": {"allowed": True, "reason": "by rule 1"}}  # fmt: skip
    denied = orjson.loads(render_status(V1BETA1, False, denied=True))["status"]
    assert denied == {"allowed": False, "denied": True}
    no_opinion = orjson.loads(render_status(V1, False, error="no policy"))["status"]
    assert no_opinion == {"allowed": False, "evaluationError": "no policy"}
    with pytest.raises(AssertionError):
        render_status(V1, True, denied=True)  # both: kube reads it as an error
