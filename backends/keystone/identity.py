"""Keystone's token body to a Kubernetes identity, as k8s-keystone-auth maps it."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from backends.base import Authenticated, Outcome, Rejected, Unavailable, UserInfo
from backends.keystone.settings import KeystoneSettings, Scope

EXTRA = "alpha.kubernetes.io/identity/"


@dataclass(frozen=True, slots=True)
class Group:
    """One of a user's Keystone groups (:mod:`.groups` looks them up)."""

    id: str
    name: str
    domain_id: str


def token_scope(token: Mapping[str, Any]) -> Scope:
    if token.get("project"):
        return "project"
    if token.get("domain"):
        return "domain"
    if token.get("system"):
        return "system"
    return "unscoped"


def map_identity(
    token: Mapping[str, Any], groups: tuple[Group, ...], settings: KeystoneSettings
) -> Outcome:
    """The k8s-keystone-auth mapping; see docs/backends/keystone.md for each scope."""
    scope = token_scope(token)
    if scope not in settings.accepted_scopes:
        return Rejected(f"{scope} tokens are not accepted by this backend")
    try:
        user = token["user"]
        domain = user.get("domain") or {}
        fields = {
            "user_name": str(user["name"]),
            "user_id": str(user["id"]),
            "user_domain_name": str(domain.get("name", "")),
            "user_domain_id": str(domain.get("id", "")),
        }
        expires_at = parse_keystone_time(token["expires_at"])
        roles = tuple(str(r["name"]) for r in token.get("roles") or ())
    except (KeyError, TypeError, ValueError, AttributeError):
        return Unavailable("Keystone sent an unreadable token body")
    username = settings.username_template.format_map(fields)
    if not username:
        # Keystone vouched for the token, so it is healthy: a refusal of this user (as
        # userinfo's nameless answer), never "unavailable", which the breaker counts.
        return Rejected("username_template gave an empty user name", "unmapped")

    names: list[str] = []
    extra: dict[str, tuple[str, ...]] = {
        EXTRA + "user/domain/id": (fields["user_domain_id"],),
        EXTRA + "user/domain/name": (fields["user_domain_name"],),
    }
    if roles:
        extra[EXTRA + "roles"] = roles
    project = token.get("project") if scope == "project" else None
    if isinstance(project, Mapping):
        pdomain = project.get("domain") or {}
        pfields = {
            "project_id": str(project.get("id", "")),
            "project_name": str(project.get("name", "")),
            "project_domain_id": str(pdomain.get("id", "")),
            "project_domain_name": str(pdomain.get("name", "")),
        }
        extra[EXTRA + "project/id"] = (pfields["project_id"],)
        extra[EXTRA + "project/name"] = (pfields["project_name"],)
        if settings.project_group_template:
            names.append(settings.project_group_template.format_map(pfields))
    for group in groups:
        names.append(
            settings.group_template.format_map(
                {"group_name": group.name, "group_id": group.id, "group_domain_id": group.domain_id}
            )
        )
    return Authenticated(
        UserInfo(
            username=username,
            uid=fields["user_id"],
            groups=tuple(dict.fromkeys(n for n in names if n)),
            extra=extra,
        ),
        expires_at=expires_at,
    )


def parse_keystone_time(value: Any) -> float:
    """Keystone's ``2026-11-30T15:16:33.000000Z`` (UTC) as Unix time."""
    if not isinstance(value, str):
        raise ValueError("not a time")
    when = datetime.fromisoformat(value)
    # Tokens capped by an application credential's expiry come without the "Z".
    return (when if when.tzinfo else when.replace(tzinfo=UTC)).timestamp()
