"""Who an operator action is about: a username, one token by its id, or one
credential by the id kube-apiserver gives it.

A token id is the keyed hash the review and audit logs show (``TokenHasher.token_id``),
never the token: an operator can cut a token off without ever holding it. A credential
id is kube's ``authentication.kubernetes.io/credential-id`` (``JTI=<jti>`` for a JWT):
what kube-apiserver's audit log shows for a request, so an operator who found a
request there can cut off the credential behind it.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Literal

Kind = Literal["user", "token", "credential"]

TOKEN_ID = re.compile(r"[0-9a-f]{12}")
MAX_USERNAME = 256
# kube's form: KIND=VALUE ("JTI=...", "X509SHA256=..."). A jti is the issuer's
# choice of string, so the value is any printable text, bounded.
CREDENTIAL_ID = re.compile(r"[A-Z][A-Z0-9]*=[^\x00-\x1f\x7f]{1,512}")
# The request body key for each kind, in the admin API, the CLI and the audit log.
FIELDS: dict[Kind, str] = {"user": "user", "token": "token_id", "credential": "credential_id"}


class BadSubject(ValueError):
    """The request names no valid subject; the message says which field is wrong."""


@dataclass(frozen=True, slots=True)
class Subject:
    kind: Kind
    value: str

    @property
    def key(self) -> str:
        """``user:NAME``, ``token:ID`` or ``credential:JTI=...``: the form used in
        stores, streams and logs."""
        return f"{self.kind}:{self.value}"

    @classmethod
    def from_key(cls, key: str) -> Subject:
        kind, _, value = key.partition(":")
        if kind == "user":
            return user(value)
        if kind == "token":
            return token_id(value)
        if kind == "credential":
            return credential_id(value)
        raise BadSubject(f"unknown subject kind in {key[:40]!r}")

    def matches(
        self, username: str | None, token: str | None, credentials: tuple[str, ...] = ()
    ) -> bool:
        """Whether an answer about ``username``, for the token whose id is ``token``,
        carrying the credential ids ``credentials``, is ours."""
        if self.kind == "credential":
            return self.value in credentials
        return (username if self.kind == "user" else token) == self.value

    def to_json(self) -> dict[str, str]:
        return {FIELDS[self.kind]: self.value}


def subjects_of(
    username: str | None, token: str | None, credentials: tuple[str, ...] = ()
) -> list[Subject]:
    """Every subject an answer is about: its user, its token, its credentials."""
    found = [Subject("credential", c) for c in credentials]
    if username is not None:
        found.append(Subject("user", username))
    if token is not None:
        found.append(Subject("token", token))
    return found


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


def credential_id(value: str) -> Subject:
    if not CREDENTIAL_ID.fullmatch(value):
        # Not echoed either: it is the issuer's jti, but a pasted token must not be.
        raise BadSubject(
            "credential_id: must be kube's credential id, as in its audit log "
            "(authentication.kubernetes.io/credential-id), e.g. JTI=..."
        )
    return Subject("credential", value)


_PARSERS = {"user": user, "token_id": token_id, "credential_id": credential_id}


def from_request(doc: Any) -> Subject:
    """The subject of an admin request body: exactly one of ``user``, ``token_id`` or
    ``credential_id``."""
    if not isinstance(doc, dict):
        raise BadSubject("body must be a JSON object")
    given = [k for k in _PARSERS if k in doc]
    if len(given) != 1:
        raise BadSubject('body must have exactly one of "user", "token_id" or "credential_id"')
    value = doc[given[0]]
    if not isinstance(value, str):
        raise BadSubject(f"{given[0]}: must be a string")
    return _PARSERS[given[0]](value)
