"""The SubjectAccessReview wire format (authorization.k8s.io v1 and v1beta1), as
kube-apiserver's webhook authorizer sends it and reads the answer.

kube-apiserver builds the review from the request's attributes and the user the
authenticators produced (``WebhookAuthorizer.Authorize`` in
staging/src/k8s.io/apiserver/plugin/pkg/authorizer/webhook/webhook.go): ``spec.user``,
``spec.uid``, the groups, ``spec.extra``, and exactly one of ``resourceAttributes``
(namespace, verb, group, version, resource, subresource, name) and
``nonResourceAttributes`` (path, verb). The two versions differ in one field: v1 spells
the groups ``spec.groups``, v1beta1 ``spec.group`` (``Groups []string
`json:"group,omitempty"``` in k8s.io/api/authorization/v1beta1/types.go).

It reads back ``status.allowed``, ``status.denied`` and ``status.reason`` (both true is
an error it treats as a denial; neither is "no opinion": the next authorizer decides).
The answer carries the request's apiVersion and never echoes its spec.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import orjson

from authn_gateway.json_body import json_object
from backends.values import value

V1 = "authorization.k8s.io/v1"
V1BETA1 = "authorization.k8s.io/v1beta1"
API_VERSIONS = (V1, V1BETA1)
#: Where each version keeps the user's groups.
GROUPS_FIELD = {V1: "groups", V1BETA1: "group"}

RESOURCE_FIELDS = ("namespace", "verb", "group", "version", "resource", "subresource", "name")
NON_RESOURCE_FIELDS = ("path", "verb")


class BadAccessReview(ValueError):
    """A malformed SubjectAccessReview; the message names the field."""


@value
class ResourceAttributes:
    namespace: str
    verb: str
    group: str
    version: str
    resource: str
    subresource: str
    name: str


@value
class NonResourceAttributes:
    path: str
    verb: str


@value
class AccessReview:
    """One SubjectAccessReview's spec: who asks to do what."""

    api_version: str
    user: str
    uid: str
    groups: tuple[str, ...]
    extra: Mapping[str, tuple[str, ...]]
    # Exactly one of the two is set.
    resource: ResourceAttributes | None
    non_resource: NonResourceAttributes | None

    @property
    def verb(self) -> str:
        attributes = self.resource or self.non_resource
        assert attributes is not None
        return attributes.verb


def parse_access_review(body: bytes) -> AccessReview:
    """The review in ``body``; :class:`BadAccessReview` (and nothing else) for any other.

    Fields kube-apiserver's decoder would ignore (metadata, status, fieldSelector,
    labelSelector, fields it does not know) are ignored; a known field of the wrong type
    is refused, naming it, never guessed at."""
    doc = json_object(body, BadAccessReview)
    api_version = doc.get("apiVersion")
    if api_version not in API_VERSIONS:
        raise BadAccessReview(f"apiVersion must be {V1} or {V1BETA1}")
    if doc.get("kind") != "SubjectAccessReview":
        raise BadAccessReview("kind must be SubjectAccessReview")
    spec = doc.get("spec")
    if not isinstance(spec, dict):
        raise BadAccessReview("spec must be an object")
    groups_field = GROUPS_FIELD[api_version]
    other = GROUPS_FIELD[V1BETA1 if api_version == V1 else V1]
    if other in spec and groups_field not in spec:
        # Silently dropping the groups could skip a rule that names one.
        raise BadAccessReview(f"spec.{other}: {api_version} spells the groups spec.{groups_field}")
    resource = _resource_attributes(spec.get("resourceAttributes"))
    non_resource = _non_resource_attributes(spec.get("nonResourceAttributes"))
    if (resource is None) == (non_resource is None):
        raise BadAccessReview(
            "spec: exactly one of resourceAttributes and nonResourceAttributes must be set"
        )
    return AccessReview(
        api_version,
        _string(spec, "user", "spec.user"),
        _string(spec, "uid", "spec.uid"),
        _strings(spec.get(groups_field), f"spec.{groups_field}"),
        _extra(spec.get("extra")),
        resource,
        non_resource,
    )


def _string(doc: dict[str, Any], key: str, where: str) -> str:
    found = doc.get(key)
    if found is None:
        return ""
    if not isinstance(found, str):
        raise BadAccessReview(f"{where} must be a string")
    return found


def _strings(found: Any, where: str) -> tuple[str, ...]:
    if found is None:
        return ()
    if not isinstance(found, list) or not all(isinstance(s, str) for s in found):
        raise BadAccessReview(f"{where} must be a list of strings")
    return tuple(found)


def _extra(found: Any) -> dict[str, tuple[str, ...]]:
    if found is None:
        return {}
    if not isinstance(found, dict):
        raise BadAccessReview("spec.extra must be an object of string lists")
    # The key is not quoted: it is the requester's, and the message goes to logs.
    return {key: _strings(values, "spec.extra values") for key, values in found.items()}


def _resource_attributes(found: Any) -> ResourceAttributes | None:
    fields = _attributes(found, "resourceAttributes", RESOURCE_FIELDS)
    return None if fields is None else ResourceAttributes(*fields)


def _non_resource_attributes(found: Any) -> NonResourceAttributes | None:
    fields = _attributes(found, "nonResourceAttributes", NON_RESOURCE_FIELDS)
    return None if fields is None else NonResourceAttributes(*fields)


def _attributes(found: Any, name: str, fields: tuple[str, ...]) -> list[str] | None:
    if found is None:
        return None
    if not isinstance(found, dict):
        raise BadAccessReview(f"spec.{name} must be an object")
    return [_string(found, f, f"spec.{name}.{f}") for f in fields]


def render_status(
    api_version: str, allowed: bool, denied: bool = False, reason: str = "", error: str = ""
) -> bytes:
    """A SubjectAccessReview answer; ``allowed`` and ``denied`` are never both true."""
    assert not (allowed and denied)
    status: dict[str, Any] = {"allowed": allowed}
    if denied:
        status["denied"] = True
    if reason:
        status["reason"] = reason
    if error:
        status["evaluationError"] = error
    return orjson.dumps(
        {"apiVersion": api_version, "kind": "SubjectAccessReview", "status": status}
    )
