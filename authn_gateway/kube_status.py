"""A refusal's body: a Kubernetes ``Status`` (metav1.Status) whose ``reason`` and ``code``
match the HTTP status. The review endpoint, the ops routes and the edge's own refusals
all answer with it; it lives apart from the TokenReview format (review/tokenreview.py)
so that the edge need not import the review path."""

from __future__ import annotations

import orjson

# metav1.StatusReason for each status the gateway refuses with.
STATUS_REASONS = {
    400: "BadRequest",
    401: "Unauthorized",
    403: "Forbidden",
    404: "NotFound",
    405: "MethodNotAllowed",
    408: "Timeout",
    413: "RequestEntityTooLarge",
    415: "UnsupportedMediaType",
    431: "RequestEntityTooLarge",
    503: "ServiceUnavailable",
}


def render_error(status: int, message: str) -> bytes:
    """Body of a refusal (400, 401, 404, 405, 408, 413, 431, 503)."""
    return orjson.dumps(
        {
            "apiVersion": "v1",
            "kind": "Status",
            "status": "Failure",
            "message": message,
            "reason": STATUS_REASONS.get(status, "BadRequest"),
            "code": status,
        }
    )
