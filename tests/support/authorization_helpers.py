"""SubjectAccessReviews as kube-apiserver's webhook authorizer sends them, for the
tests of the authorization webhook (process tier, the Keystone test, the benchmark)."""

from __future__ import annotations

from typing import Any

import httpx

V1 = "authorization.k8s.io/v1"
V1BETA1 = "authorization.k8s.io/v1beta1"


def sar_body(
    user: dict[str, Any],
    *,
    verb: str = "get",
    resource: str = "pods",
    namespace: str = "default",
    subresource: str = "",
    path: str | None = None,
    api_version: str = V1,
) -> dict[str, Any]:
    """A review of ``user`` (a TokenReview's ``status.user``: username, uid, groups,
    extra) asking to ``verb`` a resource, or the non-resource ``path``, as
    WebhookAuthorizer.Authorize builds it."""
    spec: dict[str, Any] = {
        "user": user["username"],
        "uid": user.get("uid", ""),
        "groups" if api_version == V1 else "group": list(user.get("groups", [])),
        "extra": {k: list(v) for k, v in user.get("extra", {}).items()},
    }
    if path is not None:
        spec["nonResourceAttributes"] = {"path": path, "verb": verb}
    else:
        attributes = {"namespace": namespace, "verb": verb, "version": "v1", "resource": resource}
        if subresource:
            attributes["subresource"] = subresource
        spec["resourceAttributes"] = attributes
    return {
        "apiVersion": api_version,
        "kind": "SubjectAccessReview",
        "metadata": {"creationTimestamp": None},
        "spec": spec,
        "status": {"allowed": False},
    }


def authorize(
    url: str, body: Any, token: str | None = None, path: str = "/authorize", **kwargs: Any
) -> httpx.Response:
    """POST a review (a dict as JSON, or raw bytes) to the gateway at ``url``."""
    headers = {"content-type": "application/json"}
    if token is not None:
        headers["authorization"] = f"Bearer {token}"
    headers.update(kwargs.pop("headers", {}))
    content = body if isinstance(body, bytes) else httpx.Request("POST", url, json=body).content
    return httpx.post(f"{url}{path}", content=content, headers=headers, timeout=10, **kwargs)
