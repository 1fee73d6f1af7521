"""Who an operator action is about: a username, or one token by its id.

A token id is the keyed hash the review and audit logs show (``TokenHasher.token_id``),
never the token: an operator can cut a token off without ever holding it.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Literal

Kind = Literal["user", "token"]

TOKEN_ID = re.compile(r"[0-9a-f]{12}")
MAX_USERNAME = 256


class BadSubject(ValueError):
    """The request names no valid subject; the message says which field is wrong."""


@dataclass(frozen=True, slots=True)
class Subject:
    kind: Kind
    value: str

    @property
    def key(self) -> str:
        """``user:NAME`` or ``token:ID``: the form used in stores, streams and logs."""
        return f"{self.kind}:{self.value}"

    @classmethod
    def from_key(cls, key: str) -> Subject:
        kind, _, value = key.partition(":")
        if kind == "user":
            return user(value)
        if kind == "token":
            return token_id(value)
        raise BadSubject(f"unknown subject kind in {key[:40]!r}")

    def matches(self, username: str | None, token: str | None) -> bool:
        """Whether an answer about ``username``, for the token whose id is ``token``, is ours."""
        return (username if self.kind == "user" else token) == self.value

    def to_json(self) -> dict[str, str]:
        return {"user" if self.kind == "user" else "token_id": self.value}


def user(name: str) -> Subject:
    if not name or len(name) > MAX_USERNAME or any(ord(c) < 0x20 or ord(c) == 0x7F for c in name):
        raise BadSubject(f"user: must be 1 to {MAX_USERNAME} characters, no control characters")
    return Subject("user", name)


def token_id(value: str) -> Subject:
    # fullmatch: re.match's "$" also matches before a final newline ("01cab284ec36\n").
    if not TOKEN_ID.fullmatch(value):
        # Never echo the value: an operator may paste a real token here by mistake.
        raise BadSubject("token_id: must be the 12 hex digits the review log shows, not a token")
    return Subject("token", value)


def from_request(doc: Any) -> Subject:
    """The subject of an admin request body: exactly one of ``user`` or ``token_id``."""
    if not isinstance(doc, dict):
        raise BadSubject("body must be a JSON object")
    given = [k for k in ("user", "token_id") if k in doc]
    if len(given) != 1:
        raise BadSubject('body must have exactly one of "user" or "token_id"')
    value = doc[given[0]]
    if not isinstance(value, str):
        raise BadSubject(f"{given[0]}: must be a string")
    return user(value) if given[0] == "user" else token_id(value)
