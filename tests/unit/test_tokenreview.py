"""The TokenReview wire format: parsing every malformed shape, rendering both versions."""

from __future__ import annotations

import json

import orjson
import pytest
from hypothesis import given
from hypothesis import strategies as st

from authn_gateway.review.tokenreview import (
    BadReview,
    parse_review,
    render_authenticated,
    render_unauthenticated,
)
from backends.base import UserInfo
from tests.support.fuzz import JSON, REVIEWS

V1 = "authentication.k8s.io/v1"

V1BETA1 = "authentication.k8s.io/v1beta1"


def body(**overrides: object) -> bytes:
    doc: dict[str, object] = {"apiVersion": V1, "kind": "TokenReview", "spec": {"token": "t"}}
    doc.update(overrides)
    return orjson.dumps(doc)


@pytest.mark.parametrize("version", [V1, V1BETA1])
def test_parses_both_api_versions(version: str) -> None:
    review = parse_review(body(apiVersion=version, spec={"token": "abc", "audiences": ["x"]}))
    assert review.api_version == version
    assert review.token == "abc"
    assert review.audiences == ("x",)


def test_missing_audiences_means_none() -> None:
    assert parse_review(body()).audiences == ()


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        (b"not json", "body is not valid JSON"),
        (b"[1, 2]", "body must be a JSON object"),
        (body(apiVersion="authentication.k8s.io/v2"), "apiVersion must be"),
        (body(apiVersion=None), "apiVersion must be"),
        (body(kind="SubjectAccessReview"), "kind must be TokenReview"),
        (body(spec="x"), "spec must be an object"),
        (body(spec={}), "spec.token must be a string"),
        (body(spec={"token": 42}), "spec.token must be a string"),
        (body(spec={"token": ""}), "spec.token must not be empty"),
        (body(spec={"token": "t", "audiences": "a"}), "spec.audiences must be a list"),
        (body(spec={"token": "t", "audiences": [1]}), "spec.audiences must be a list"),
    ],
)
def test_malformed_reviews_are_named(raw: bytes, message: str) -> None:
    with pytest.raises(BadReview, match=message):
        parse_review(raw)


def test_errors_never_echo_the_token() -> None:
    with pytest.raises(BadReview) as err:
        parse_review(body(spec={"token": "s3cret", "audiences": "s3cret"}))
    assert "s3cret" not in str(err.value)


def test_authenticated_reply_keeps_version_and_fills_user() -> None:
    user = UserInfo("alice", "42", ("devs",), {"scopes": ("a", "b")})
    doc = orjson.loads(render_authenticated(V1BETA1, user, ("api",)))
    assert doc["apiVersion"] == V1BETA1
    assert doc["kind"] == "TokenReview"
    assert doc["status"] == {
        "authenticated": True,
        "user": {
            "username": "alice",
            "uid": "42",
            "groups": ["devs"],
            "extra": {"scopes": ["a", "b"]},
        },
        "audiences": ["api"],
    }
    assert "spec" not in doc


def test_rejection_has_no_error_so_kube_apiserver_caches_it() -> None:
    doc = orjson.loads(render_unauthenticated(V1))
    assert doc["status"] == {"authenticated": False}


def test_unavailable_carries_an_error() -> None:
    doc = orjson.loads(render_unauthenticated(V1, "idp: timed out"))
    assert doc["status"] == {"authenticated": False, "error": "idp: timed out"}


def test_empty_username_cannot_be_built() -> None:
    with pytest.raises(ValueError, match="username"):
        UserInfo("")


FIELDS = ("apiVersion", "kind", "spec", "token", "audiences")


def parsed_or_refused(raw: bytes) -> None:
    try:
        review = parse_review(raw)
    except BadReview as exc:
        # The documented 400: it names what is wrong, and never echoes the body.
        message = str(exc)
        assert message.startswith(("body ", *FIELDS, "spec.")), message
        return
    assert review.api_version in (V1, V1BETA1)
    assert isinstance(review.token, str) and review.token
    assert all(isinstance(a, str) for a in review.audiences)


@given(REVIEWS | JSON)
def test_any_json_is_a_review_or_the_documented_400(doc: object) -> None:
    # The stdlib writes what orjson would refuse to (integers past 64 bits): both kinds.
    parsed_or_refused(json.dumps(doc).encode())


@given(st.binary(max_size=200))
def test_any_bytes_are_a_review_or_the_documented_400(raw: bytes) -> None:
    parsed_or_refused(raw)
