"""GitLab (gitlab.com or self-managed): OAuth access tokens and personal, project and
group access tokens.

One review makes, in order, and stops at the first refusal:

1. ``GET /api/v4/user``: who the token belongs to. 401 is a rejection; a user whose
   ``state`` is not ``active`` is rejected (GitLab itself answers 403 for blocked and
   deactivated users, which is a rejection too);
2. only with ``required_scopes`` or ``check_token_expiry``:
   ``GET /api/v4/personal_access_tokens/self`` (access tokens) or
   ``GET /oauth/token/info`` (OAuth tokens), for the scopes and the expiry;
3. unless the user's groups are cached: ``GET /api/v4/groups?min_access_level=N``,
   every page. Without ``min_access_level`` an administrator's token would list every
   group on the instance.

Access tokens (``glpat-``) go in ``PRIVATE-TOKEN``, OAuth tokens in
``Authorization: Bearer``. Every GitLab answer maps to one outcome in
:meth:`GitLabBackend._refusal`; transport failures map in :mod:`backends.http`.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Annotated, Any, Literal

import httpx
from cachetools import TTLCache
from pydantic import Field, model_validator

from backends.base import Authenticated, Backend, Outcome, Rejected, Unavailable, UserInfo
from backends.budget import PAID_BY_REVIEW, UNLIMITED, CallBudget
from backends.context import WireTime
from backends.durations import Age, count
from backends.http import (
    PoolSettings,
    TLSClientSettings,
    header_safe,
    make_client,
    server_failure,
    transport_failure,
    unsendable,
)
from backends.registry import register
from backends.settings import BackendSettings, Strict
from backends.transports import on_the_wire

log = logging.getLogger(__name__)

TokenKind = Literal["oauth", "personal"]

# Prefixes of GitLab tokens that can never call the REST API as a user (doc/security/
# tokens/index.md, "Token prefixes"): an OAuth application secret, deploy, runner,
# CI/CD job, pipeline trigger, feed, incoming mail, agent, SCIM and feature-flag
# tokens, and the legacy runner registration token. They are refused locally.
NOT_API_TOKEN_PREFIXES = (
    "gloas-",
    "gldt-",
    "glrt-",
    "glrtr-",
    "glcbt-",
    "glptt-",
    "glft-",
    "glimt-",
    "glagent-",
    "glsoat-",
    "glffct-",
    "GR1348941",
)

# GitLab's roles (doc/api/members.md, "Roles"): minimal access, guest, planner,
# reporter, developer, maintainer, owner.
AccessLevel = Literal[5, 10, 15, 20, 30, 40, 50]

PER_PAGE = 100  # GitLab's maximum page size (doc/api/rest/index.md, "Pagination")


class GitLabGroupSettings(Strict):
    enabled: bool = True
    # Only groups where the user has at least this role (10 = Guest).
    min_access_level: AccessLevel = 10
    # What kube-apiserver sees for a group: its full path ("platform/sre") or its id,
    # which survives renames and moves.
    name: Literal["full_path", "id"] = "full_path"
    # Keep only groups under these top-level groups ([] keeps all).
    top_level: list[str] = Field(default_factory=list)
    prefix: str = ""
    # Groups are cached per user, apart from the token cache: they change rarely and
    # cost one call per 100 groups.
    cache_ttl_seconds: Age = 300.0
    cache_max_users: Annotated[int, count()] = 10_000
    # A user with more pages than this is rejected rather than given half their groups.
    max_pages: Annotated[int, count(ge=1, le=100)] = 10


@register
class GitLabSettings(BackendSettings):
    type: Literal["gitlab"]
    # Where GitLab is served, including a relative URL root ("https://host/gitlab").
    base_url: str = Field(default="https://gitlab.com", pattern=r"^https?://[^/?#]+(/[^?#]*)?$")
    tls: TLSClientSettings = Field(default_factory=TLSClientSettings)
    pool: PoolSettings = Field(default_factory=PoolSettings)
    # Tokens with these prefixes are access tokens (personal, project, group), sent as
    # PRIVATE-TOKEN. Add an instance-wide custom prefix here ("acme-glpat-").
    personal_token_prefixes: list[str] = Field(default_factory=lambda: ["glpat-"])
    # The type of a token whose prefix says nothing (OAuth access tokens have none).
    default_token_type: TokenKind = "oauth"
    # Refused without a call: token types that never authenticate the REST API.
    not_api_token_prefixes: list[str] = Field(default_factory=lambda: list(NOT_API_TOKEN_PREFIXES))
    # Scopes the token must carry (e.g. [read_api]), matched literally.
    required_scopes: list[str] = Field(default_factory=list)
    # "all": every required scope; "any": at least one of them.
    scope_match: Literal["all", "any"] = "all"
    # Ask GitLab for the token's expiry even without required_scopes (one more call),
    # so no cache keeps the identity past it.
    check_token_expiry: bool = False
    username_prefix: str = ""
    groups: GitLabGroupSettings = Field(default_factory=GitLabGroupSettings)

    @model_validator(mode="after")
    def _check_prefixes(self) -> GitLabSettings:
        if any(not p for p in self.personal_token_prefixes):
            raise ValueError("personal_token_prefixes: entries must not be empty")
        if any(not p for p in self.not_api_token_prefixes):
            raise ValueError("not_api_token_prefixes: entries must not be empty")
        return self

    def build(self, budget: CallBudget = UNLIMITED) -> Backend:
        return GitLabBackend(self, budget=budget)


class GitLabBackend(Backend):
    kind = "gitlab"

    def __init__(
        self,
        settings: GitLabSettings,
        client: httpx.AsyncClient | None = None,
        budget: CallBudget = UNLIMITED,
    ) -> None:
        super().__init__(settings.name)
        self._s = settings
        # The review's first call (/api/v4/user) is paid by the gateway; token info and
        # group pages take from ``budget`` in the client's transport.
        self._client = client or make_client(
            settings.base_url, settings.timeouts, settings.tls, settings.pool, budget=budget
        )
        # The fixed paths' URLs, built once: httpx would parse and merge them on every
        # call. Keys are this module's constant paths, never anything a client sends.
        self._urls = {
            path: self._client.build_request("GET", path).url
            for path in ("/api/v4/user", "/api/v4/personal_access_tokens/self", "/oauth/token/info")
        }
        self._pat_prefixes = tuple(settings.personal_token_prefixes)
        self._foreign_prefixes = tuple(settings.not_api_token_prefixes)
        self._top_level = frozenset(settings.groups.top_level)
        self._groups: TTLCache[int, tuple[str, ...]] = TTLCache(
            settings.groups.cache_max_users, settings.groups.cache_ttl_seconds
        )

    async def close(self) -> None:
        await self._client.aclose()

    def could_accept(self, token: str) -> bool:
        # GitLab tokens are printable ASCII without spaces; anything else is never
        # valid, and would not survive an HTTP header anyway.
        return header_safe(token) and not token.startswith(self._foreign_prefixes)

    def token_kind(self, token: str) -> TokenKind:
        if token.startswith(self._pat_prefixes):
            return "personal"
        return self._s.default_token_type

    async def authenticate(self, token: str, wire: WireTime | None = None) -> Outcome:
        refusal = unsendable(token)
        if refusal is not None:
            return refusal
        kind = self.token_kind(token)
        auth = (
            {"PRIVATE-TOKEN": token} if kind == "personal" else {"Authorization": f"Bearer {token}"}
        )
        answer = await self._answer("/api/v4/user", auth, wire, first=True)
        if not isinstance(answer, tuple):
            return answer
        user = map_user(answer[0], self._s.username_prefix)
        if not isinstance(user, UserInfo):
            return user

        expires_at: float | None = None
        if self._s.required_scopes or self._s.check_token_expiry:
            info = await self._token_info(kind, auth, int(user.uid), wire)
            if not isinstance(info, tuple):
                return info
            scopes, expires_at = info
            missing = missing_scopes(scopes, self._s.required_scopes, self._s.scope_match)
            if missing:
                return Rejected(f"token lacks required scope(s): {' '.join(missing)}")

        groups: tuple[str, ...] = ()
        if self._s.groups.enabled:
            found = await self._user_groups(int(user.uid), auth, wire)
            if not isinstance(found, tuple):
                return found
            groups = found
        return Authenticated(UserInfo(user.username, user.uid, groups), expires_at=expires_at)

    # ---- calls --------------------------------------------------------------

    async def _get(
        self,
        path: str,
        auth: Mapping[str, str],
        wire: WireTime | None,
        params: Mapping[str, str | int] | None = None,
        first: bool = False,
    ) -> httpx.Response | Unavailable:
        try:
            return await self._client.get(
                self._urls.get(path, path) if params is None else path,
                headers=auth,
                params=params,
                extensions=on_the_wire(wire, PAID_BY_REVIEW if first else None),
            )
        except httpx.HTTPError as exc:
            return transport_failure(exc)

    async def _answer(
        self,
        path: str,
        auth: Mapping[str, str],
        wire: WireTime | None,
        params: Mapping[str, str | int] | None = None,
        first: bool = False,
    ) -> tuple[Any, httpx.Response] | Outcome:
        """The decoded body of a 200 and the response, or the outcome GitLab's answer maps to."""
        response = await self._get(path, auth, wire, params, first)
        if isinstance(response, Unavailable):
            return response
        refusal = self._refusal(response, path)
        if refusal is not None:
            return refusal
        try:
            return response.json(), response
        except ValueError:
            return Unavailable(f"GitLab sent a body that is not JSON on {path}")

    def _refusal(self, response: httpx.Response, path: str) -> Outcome | None:
        status = response.status_code
        if status == 200:
            return None
        if status == 401:
            return Rejected(f"GitLab: {_why_unauthorized(response)} (401 on {path})")
        if status == 403:
            reason = _why_forbidden(response)
            # Worth a line of its own: an operator may have to widen required scopes.
            log.info("backend %s: GitLab refused %s: %s", self.name, path, reason)
            return Rejected(f"GitLab: {reason} (403 on {path})")
        if status == 429 or status >= 500:
            return server_failure(self.kind, response, self._s.breaker.max_retry_after_seconds)
        # 3xx, 404 and the like: the gateway is not talking to GitLab's API.
        return Unavailable(
            f"GitLab answered {status} on {path}; check base_url", misconfigured=True
        )

    async def _token_info(
        self, kind: TokenKind, auth: Mapping[str, str], user_id: int, wire: WireTime | None
    ) -> tuple[list[str], float | None] | Outcome:
        """The token's scopes and expiry (Unix time), from the endpoint for its type."""
        path = "/api/v4/personal_access_tokens/self" if kind == "personal" else "/oauth/token/info"
        answer = await self._answer(path, auth, wire)
        if not isinstance(answer, tuple):
            return answer
        doc = answer[0]
        if not isinstance(doc, dict):
            return Unavailable(f"GitLab sent an unexpected body on {path}")
        if kind == "personal":
            if doc.get("revoked") is True or doc.get("active") is False:
                return Rejected("GitLab: access token revoked or inactive")
            owner = doc.get("user_id")
            expires_at = parse_expiry_date(doc.get("expires_at"))
        else:
            owner = doc.get("resource_owner_id")
            # Seconds left; null for a token that does not expire.
            seconds = doc.get("expires_in_seconds", doc.get("expires_in"))
            expires_at = time.time() + seconds if isinstance(seconds, int | float) else None
        if owner is not None and owner != user_id:
            # Both answers are about the same token; a mismatch is never a login.
            return Rejected("GitLab: token info names another user")
        if expires_at is not None and expires_at <= time.time():
            return Rejected("GitLab: token expired")
        scopes = doc.get("scopes", doc.get("scope"))
        if isinstance(scopes, str):
            scopes = scopes.split()
        if not isinstance(scopes, list):
            scopes = []
        return [str(s) for s in scopes], expires_at

    async def _user_groups(
        self, user_id: int, auth: Mapping[str, str], wire: WireTime | None
    ) -> tuple[str, ...] | Outcome:
        cached = self._groups.get(user_id)
        if cached is not None:
            return cached
        gs = self._s.groups
        path = "/api/v4/groups"
        params: dict[str, str | int] = {
            "min_access_level": gs.min_access_level,
            "per_page": PER_PAGE,
        }
        names: dict[str, None] = {}  # an ordered set
        for _ in range(gs.max_pages):
            answer = await self._answer(path, auth, wire, params)
            if not isinstance(answer, tuple):
                return answer
            page, response = answer
            if not isinstance(page, list):
                return Unavailable(f"GitLab sent an unexpected body on {path}")
            for group in page:
                name = self._group_name(group)
                if name is not None:
                    names[gs.prefix + name] = None
            following = next_page_params(response, params)
            if following is None:
                break
            params = following
        else:
            log.warning(
                "backend %s: user %d has more than %d pages of groups; raise groups.max_pages",
                self.name,
                user_id,
                gs.max_pages,
            )
            return Rejected(f"user has more than {gs.max_pages * PER_PAGE} groups", "unmapped")
        groups = tuple(names)
        self._groups[user_id] = groups  # a TTL of 0 keeps nothing
        return groups

    def _group_name(self, group: Any) -> str | None:
        if not isinstance(group, dict):
            return None
        full_path = group.get("full_path")
        if not isinstance(full_path, str) or not full_path:
            return None
        if self._top_level and full_path.split("/", 1)[0] not in self._top_level:
            return None
        if self._s.groups.name == "id":
            group_id = group.get("id")
            return str(group_id) if isinstance(group_id, int) else None
        return full_path


def map_user(doc: Any, username_prefix: str = "") -> UserInfo | Outcome:
    """``GET /api/v4/user``'s body to an identity, or why it is not one."""
    if not isinstance(doc, dict):
        return Unavailable("GitLab sent an unexpected body on /api/v4/user")
    username, user_id = doc.get("username"), doc.get("id")
    if not isinstance(username, str) or not username or not isinstance(user_id, int):
        return Unavailable("GitLab's user has no username or id")
    state = doc.get("state")
    if state != "active":
        return Rejected(f"GitLab user is {state if isinstance(state, str) else 'not active'}")
    return UserInfo(username=username_prefix + username, uid=str(user_id))


def missing_scopes(have: list[str], required: list[str], match: str) -> list[str]:
    """Required scopes the token lacks ([] when it qualifies). Matched literally."""
    missing = [s for s in required if s not in have]
    if match == "any" and len(missing) < len(required):
        return []
    return missing


def parse_expiry_date(value: Any) -> float | None:
    """An access token's ``expires_at``: a date ("2025-01-31", expiring at 00:00 UTC
    that day, doc/user/profile/personal_access_tokens.md) or a timestamp."""
    if not isinstance(value, str) or not value:
        return None
    try:
        when = datetime.fromisoformat(value)
    except ValueError:
        return None
    if when.tzinfo is None:
        when = when.replace(tzinfo=UTC)
    return when.timestamp()


def next_page_params(
    response: httpx.Response, params: Mapping[str, str | int]
) -> dict[str, str | int] | None:
    """Query parameters of the next page, or None on the last page.

    ``X-Next-Page`` first (empty on the last page); else the ``Link`` header's
    ``rel="next"``, whose query is reused against our own base URL: GitLab writes its
    external URL there, which may not be the address the gateway uses, and the token
    must not travel anywhere else.
    """
    following = response.headers.get("x-next-page", "").strip()
    if following.isdigit():
        return {**params, "page": int(following)}
    link = response.links.get("next", {}).get("url")
    if link:
        query = httpx.URL(link).params
        if query:
            return {**params, **dict(query.multi_items())}
    return None


def _body_field(response: httpx.Response, name: str) -> str:
    try:
        doc = response.json()
    except ValueError:
        return ""
    value = doc.get(name) if isinstance(doc, dict) else None
    return value if isinstance(value, str) else ""


def _why_unauthorized(response: httpx.Response) -> str:
    # lib/api/api_guard.rb: expired and revoked tokens say so; unknown ones do not.
    description = _body_field(response, "error_description").lower()
    if "expired" in description:
        return "token expired"
    if "revoked" in description:
        return "token revoked"
    return "token unknown, expired or revoked"


def _why_forbidden(response: httpx.Response) -> str:
    if _body_field(response, "error") == "insufficient_scope":
        needs = _body_field(response, "scope")
        return f"insufficient_scope (needs one of: {needs or 'unknown'})"
    # Blocked, deactivated, banned users (lib/gitlab/auth/user_access_denied_reason.rb).
    message = _body_field(response, "message")[:120]
    return message or "forbidden"
