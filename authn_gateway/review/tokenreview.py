"""The TokenReview wire format (authentication.k8s.io v1 and v1beta1).

Both versions have the same shape; the reply always carries the apiVersion the
request came in, because kube-apiserver rejects a reply in another version.
The request's ``spec`` is never echoed back: it holds the token.

:func:`render_verdict` is the one place a verdict becomes an answer: the review
endpoint and ``authn-gateway review`` both use it.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, NamedTuple

import orjson

from authn_gateway.json_body import json_object
from authn_gateway.kube_status import render_error
from authn_gateway.review.markers import NONE as NO_MARKERS
from authn_gateway.review.markers import Markers
from backends.base import Authenticated, Unavailable, UserInfo, Verdict
from backends.values import value

#: Short names (the CLI's --api-version) of the versions kube-apiserver may send.
API_VERSIONS = {"v1": "authentication.k8s.io/v1", "v1beta1": "authentication.k8s.io/v1beta1"}
_ACCEPTED = frozenset(API_VERSIONS.values())


class BadReview(ValueError):
    """A malformed TokenReview; the message names the problem, never the token."""


@value
class ReviewRequest:
    api_version: str
    token: str
    audiences: tuple[str, ...] = ()


def parse_review(body: bytes) -> ReviewRequest:
    """The review in ``body``; :class:`BadReview` (and nothing else) for any other body."""
    doc = json_object(body, BadReview)
    # Each field's type is checked before its value is used: a list or an object where
    # a string belongs is the same 400 naming the field, never a TypeError.
    api_version = doc.get("apiVersion")
    if not isinstance(api_version, str) or api_version not in _ACCEPTED:
        raise BadReview(
            "apiVersion must be authentication.k8s.io/v1 or authentication.k8s.io/v1beta1"
        )
    kind = doc.get("kind")
    if not isinstance(kind, str) or kind != "TokenReview":
        raise BadReview("kind must be TokenReview")
    spec = doc.get("spec")
    if not isinstance(spec, dict):
        raise BadReview("spec must be an object")
    token = spec.get("token")
    if not isinstance(token, str):
        raise BadReview("spec.token must be a string")
    if not token:
        raise BadReview("spec.token must not be empty")
    audiences = spec.get("audiences")
    if audiences is None:
        return ReviewRequest(api_version, token)  # the usual case: the API server's own
    if not isinstance(audiences, list) or not all(isinstance(a, str) for a in audiences):
        raise BadReview("spec.audiences must be a list of strings")
    return ReviewRequest(api_version, token, tuple(audiences))


def _user_json(user: UserInfo, extra: Mapping[str, tuple[str, ...]]) -> dict[str, Any]:
    out: dict[str, Any] = {"username": user.username}
    if user.uid:
        out["uid"] = user.uid
    if user.groups:
        out["groups"] = list(user.groups)
    if extra:
        out["extra"] = {k: list(v) for k, v in extra.items()}
    return out


def render_authenticated(
    api_version: str,
    user: UserInfo,
    audiences: tuple[str, ...] = (),
    extra: Mapping[str, tuple[str, ...]] | None = None,
) -> bytes:
    """``extra`` replaces ``user.extra`` (the gateway's markers added, see markers.py)."""
    status: dict[str, Any] = {
        "authenticated": True,
        "user": _user_json(user, user.extra if extra is None else extra),
    }
    if audiences:
        status["audiences"] = list(audiences)
    return orjson.dumps({"apiVersion": api_version, "kind": "TokenReview", "status": status})


def render_unauthenticated(api_version: str, error: str = "") -> bytes:
    """``error`` empty means "the token is invalid" and lets kube-apiserver cache it."""
    status: dict[str, Any] = {"authenticated": False}
    if error:
        status["error"] = error
    return orjson.dumps({"apiVersion": api_version, "kind": "TokenReview", "status": status})


def render_bad_request(message: str) -> bytes:
    """Body of a 400 (see :func:`authn_gateway.kube_status.render_error`)."""
    return render_error(400, message)


class Answer(NamedTuple):
    """A verdict as kube-apiserver receives it (a tuple: cheap on the hot path)."""

    body: bytes
    # "authenticated", "rejected" or "unavailable": the metric and log label.
    kind: str


def render_verdict(api_version: str, verdict: Verdict, markers: Markers = NO_MARKERS) -> Answer:
    outcome = verdict.outcome
    if isinstance(outcome, Authenticated):
        user = outcome.user
        extra = markers.user_extra(user, verdict.backend, verdict.stale)
        return Answer(
            render_authenticated(api_version, user, verdict.audiences, extra), "authenticated"
        )
    if isinstance(outcome, Unavailable):
        # Names the backend so operators can see who failed; carries no secrets.
        error = f"{verdict.backend}: {outcome.reason}"
        return Answer(render_unauthenticated(api_version, error), "unavailable")
    return Answer(render_unauthenticated(api_version), "rejected")


def describe(verdict: Verdict) -> str:
    """One line for a person (``authn-gateway review``'s stderr)."""
    outcome = verdict.outcome
    if isinstance(outcome, Authenticated):
        return f"authenticated by {verdict.backend}" + (" (stale)" if verdict.stale else "")
    if isinstance(outcome, Unavailable):
        return f"unavailable: {verdict.backend}: {outcome.reason}"
    return f"rejected by {verdict.backend}: {outcome.reason}"
