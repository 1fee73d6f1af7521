"""A request body that must be one JSON object: read, or refused in one line.

The TokenReview, the SubjectAccessReview and the admin API's calls all start so; each
refuses with its own exception type, whose message the caller answers with a 400.
"""

from __future__ import annotations

from typing import Any

import orjson


def json_object(body: bytes, refusal: type[ValueError]) -> dict[str, Any]:
    """``body``'s JSON object, or ``refusal`` saying what is wrong (never quoting it)."""
    try:
        doc = orjson.loads(body)
    except orjson.JSONDecodeError:
        raise refusal("body is not valid JSON") from None
    if not isinstance(doc, dict):
        raise refusal("body must be a JSON object")
    return doc
