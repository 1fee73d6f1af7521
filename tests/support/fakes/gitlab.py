"""A fake GitLab that follows GitLab's documented REST API, for tests and load rehearsals.

GitLab cannot run here. This serves, over real HTTP on loopback (starlette on uvicorn),
the four endpoints the ``gitlab`` backend calls, with GitLab's status codes, headers
and bodies. Each shape names the documentation page it comes from; the sample
answers are in ``/work/shared/reference/gitlab/``.

* ``GET /api/v4/user``                        - doc/api/users.md ("List current user")
* ``GET /api/v4/groups``                      - doc/api/groups.md ("List groups"),
  paginated as doc/api/rest/index.md ("Pagination")
* ``GET /api/v4/personal_access_tokens/self`` - doc/api/personal_access_tokens.md
* ``GET /oauth/token/info``                   - doc/api/oauth2.md (Doorkeeper's token info)

Users, tokens and groups come from a seed: a JSON file (``--seed``), ``POST
/_fake/seed`` or :meth:`FakeGitLab.load_seed`::

    {"users":  [{"id": 1, "username": "alice", "state": "active", "is_admin": false}],
     "tokens": [{"token": "glpat-...", "user_id": 1, "kind": "personal",
                 "scopes": ["read_api"], "expires_at": "2030-01-01", "revoked": false},
                {"token": "<64 hex>", "user_id": 1, "kind": "oauth",
                 "scopes": ["read_api"], "expires_in": 7200}],
     "groups": [{"id": 10, "path": "platform", "parent_id": null,
                 "members": {"1": 30}}]}

Faults (``POST /_fake/faults``, or :meth:`FakeGitLab.configure`), applied to API paths
starting with ``path_prefix`` (default: all of them):

* ``status``        - answer every call with this status (429, 500, 502, 401...);
* ``fail_fraction`` - share of calls answered with ``fail_status`` (default 500);
* ``retry_after``   - seconds sent in ``Retry-After`` (and ``RateLimit-Reset``) on 429s;
  without it a 429 comes bare, as some of GitLab's do;
* ``latency``       - seconds added before every answer;
* ``hang``          - read the request and answer nothing until the fault is cleared;
* ``drop_headers``  - header names removed from every answer (a proxy that strips them);
* ``throttle_limit``/``throttle_period`` - GitLab's own authenticated API rate limit
  (per user, per IP for unauthenticated calls), with ``RateLimit-*`` on every answer.

``GET /_fake/stats`` counts API calls by path and status, with their arrival times;
``POST /_fake/reset`` clears faults and counters. Control paths are never faulted.

Run standalone: ``python -m tests.support.fakes.gitlab --port N [--seed seed.json]``, or
``--synthetic-users N`` for load tests (see :func:`synthetic_seed`).
"""

from __future__ import annotations

import argparse
import asyncio
import email.utils
import hashlib
import json
import random
import threading
import time
from dataclasses import asdict, dataclass, field
from datetime import UTC, date, datetime
from pathlib import Path
from typing import Any
from urllib.parse import urlencode

import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

# ---- data ---------------------------------------------------------------------


@dataclass
class User:
    id: int
    username: str
    name: str = ""
    # active, blocked, deactivated, blocked_pending_approval, banned, ldap_blocked
    state: str = "active"
    is_admin: bool = False
    bot: bool = False


@dataclass
class Token:
    token: str
    user_id: int
    # "personal" (personal, project or group access token) or "oauth".
    kind: str = "personal"
    scopes: list[str] = field(default_factory=lambda: ["api"])
    # Access tokens: an ISO date; the token stops working at 00:00 UTC that day.
    expires_at: str | None = None
    # OAuth tokens: lifetime in seconds from created_at (GitLab's default is 7200).
    expires_in: int | None = None
    created_at: float = field(default_factory=time.time)
    revoked: bool = False
    name: str = "fake token"
    id: int = 0


@dataclass
class Group:
    id: int
    path: str
    name: str = ""
    parent_id: int | None = None
    visibility: str = "private"
    # user id -> access level (10 guest, 20 reporter, 30 developer, 40 maintainer, 50 owner)
    members: dict[int, int] = field(default_factory=dict)


@dataclass
class Faults:
    status: int | None = None
    fail_fraction: float = 0.0
    fail_status: int = 500
    retry_after: float | None = None
    latency: float = 0.0
    hang: bool = False
    drop_headers: list[str] = field(default_factory=list)
    path_prefix: str = "/"
    # GitLab.com's authenticated API limit is 2,000 calls a minute per user.
    throttle_limit: int | None = 2000
    throttle_period: int = 60


@dataclass
class Stats:
    calls: int = 0
    by_path: dict[str, int] = field(default_factory=dict)
    by_status: dict[int, int] = field(default_factory=dict)
    # How callers sent their token: "private-token", "bearer" or "none".
    by_credential: dict[str, int] = field(default_factory=dict)
    in_flight: int = 0
    max_in_flight: int = 0
    # (arrival wall-clock time, path, status) of the most recent calls.
    log: list[tuple[float, str, int]] = field(default_factory=list)


def _full_paths(groups: dict[int, Group]) -> dict[int, tuple[str, str]]:
    """group id -> (full_path, full_name), walking up parent_id."""
    out: dict[int, tuple[str, str]] = {}
    for gid, group in groups.items():
        paths, names, seen = [], [], set()
        current: Group | None = group
        while current is not None and current.id not in seen:
            seen.add(current.id)
            paths.append(current.path)
            names.append(current.name or current.path)
            current = groups.get(current.parent_id) if current.parent_id is not None else None
        out[gid] = ("/".join(reversed(paths)), " / ".join(reversed(names)))
    return out


def synthetic_seed(
    users: int, groups_per_user: int = 3, top_level_groups: int = 50
) -> dict[str, Any]:
    """A seed for load tests: users ``load-<i>`` with two tokens each.

    User ``i`` (1-based) owns access token ``glpat-load-<i:08d>-fake`` and OAuth token
    ``sha256("oauth-<i>")`` (64 hex digits, like GitLab's), both with ``read_api``,
    and is a developer in ``groups_per_user`` of ``top_level_groups`` groups.
    """
    seed: dict[str, Any] = {"users": [], "tokens": [], "groups": []}
    members: list[dict[str, int]] = [{} for _ in range(top_level_groups)]
    for i in range(1, users + 1):
        seed["users"].append({"id": i, "username": f"load-{i}"})
        seed["tokens"].append(
            {"token": f"glpat-load-{i:08d}-fake", "user_id": i, "scopes": ["read_api"]}
        )
        seed["tokens"].append(
            {
                "token": hashlib.sha256(f"oauth-{i}".encode()).hexdigest(),
                "user_id": i,
                "kind": "oauth",
                "scopes": ["read_api"],
                "expires_in": 7200,
            }
        )
        for k in range(groups_per_user):
            members[(i + k) % top_level_groups][str(i)] = 30
    seed["groups"] = [
        {"id": 100_000 + j, "path": f"load-g{j}", "members": m} for j, m in enumerate(members)
    ]
    return seed


# ---- GitLab's answers ---------------------------------------------------------

# Scopes GitLab accepts per endpoint: GET endpoints take read_api as well as api
# (doc/user/profile/personal_access_tokens.md, "Personal access token scopes"); /user
# also takes read_user. The token-information endpoint accepts every scope, as any
# token may inspect itself (lib/api/personal_access_tokens/self_information.rb).
USER_SCOPES = ("api", "read_api", "read_user")
GROUP_SCOPES = ("api", "read_api")

# lib/gitlab/auth/user_access_denied_reason.rb: why a user's own token is refused.
ACCESS_DENIED = {
    "blocked": "Your account has been blocked.",
    "ldap_blocked": "Your account has been blocked.",
    "banned": "Your account has been blocked.",
    "deactivated": (
        "Your account has been deactivated by your administrator. "
        "Please log back in to reactivate your account."
    ),
    "blocked_pending_approval": (
        "Your account is pending approval from your administrator and hence blocked."
    ),
}

# lib/api/api_guard.rb answers invalid and under-scoped tokens through rack-oauth2's
# Bearer errors; its default realm is this.
REALM = "Protected by OAuth 2.0"
EXPIRED = "Token is expired. You can either do re-authorization or token refresh."
REVOKED = "Token was revoked. You have to re-authorize from the user."
INSUFFICIENT = "The request requires higher privileges than provided by the access token."


def _api_error(status: int, message: str) -> Response:
    # lib/api/helpers.rb render_api_error!: {"message": "401 Unauthorized"}.
    return JSONResponse({"message": message}, status_code=status)


def _invalid_token(description: str) -> Response:
    # doc/api/rest/authentication.md; bodies as in error-401-expired/-revoked.json.
    return JSONResponse(
        {"error": "invalid_token", "error_description": description},
        status_code=401,
        headers={
            "WWW-Authenticate": (
                f'Bearer realm="{REALM}", error="invalid_token", error_description="{description}"'
            )
        },
    )


def _insufficient_scope(scopes: tuple[str, ...]) -> Response:
    # lib/api/api_guard.rb (error-403-insufficient-scope.json); a 403 carries no challenge.
    return JSONResponse(
        {
            "error": "insufficient_scope",
            "error_description": INSUFFICIENT,
            "scope": " ".join(scopes),
        },
        status_code=403,
    )


def _doorkeeper_invalid(description: str) -> Response:
    # doc/api/oauth2.md "Retrieve the token information"; oauth-token-info-invalid.json.
    return JSONResponse(
        {"error": "invalid_token", "error_description": description},
        status_code=401,
        headers={
            "Cache-Control": "no-store",
            "Pragma": "no-cache",
            "WWW-Authenticate": (
                f'Bearer realm="Doorkeeper", error="invalid_token", '
                f'error_description="{description}"'
            ),
        },
    )


def _http_date(when: float) -> str:
    return email.utils.formatdate(when, usegmt=True)


class FakeGitLab:
    def __init__(
        self,
        host: str = "127.0.0.1",
        port: int = 0,
        seed: dict[str, Any] | None = None,
        external_url: str | None = None,
    ) -> None:
        self.host = host
        self.port = port
        # GitLab writes its external_url into Link headers, whatever address was called.
        self.external_url = external_url
        self.faults = Faults()
        self._stats = Stats()
        self._lock = threading.Lock()
        self._users: dict[int, User] = {}
        self._tokens: dict[str, Token] = {}
        self._groups: dict[int, Group] = {}
        self._paths: dict[int, tuple[str, str]] = {}
        self._windows: dict[str, tuple[float, int]] = {}
        self._server: uvicorn.Server | None = None
        self._thread: threading.Thread | None = None
        if seed is not None:
            self.load_seed(seed)
        self.app = Starlette(
            routes=[
                Route("/api/v4/user", self._user),
                Route("/api/v4/groups", self._list_groups),
                Route("/api/v4/personal_access_tokens/self", self._pat_self),
                Route("/oauth/token/info", self._token_info),
                Route("/_fake/faults", self._control_faults, methods=["GET", "POST"]),
                Route("/_fake/seed", self._control_seed, methods=["POST"]),
                Route("/_fake/stats", self._control_stats),
                Route("/_fake/reset", self._control_reset, methods=["POST"]),
            ],
        )
        self.app.add_middleware(_FaultMiddleware, fake=self)

    # ---- seed ---------------------------------------------------------------

    def load_seed(self, seed: dict[str, Any], replace: bool = True) -> None:
        """Add (or, with ``replace``, set) users, tokens and groups from a seed document."""
        with self._lock:
            if replace:
                self._users, self._tokens, self._groups = {}, {}, {}
            for u in seed.get("users", []):
                self._users[int(u["id"])] = User(**u)
            for n, t in enumerate(seed.get("tokens", []), start=len(self._tokens) + 1):
                token = Token(**{"id": n, **t})
                self._tokens[token.token] = token
            for g in seed.get("groups", []):
                members = {int(k): int(v) for k, v in g.get("members", {}).items()}
                self._groups[int(g["id"])] = Group(**{**g, "members": members})
            self._paths = _full_paths(self._groups)

    # ---- endpoints ------------------------------------------------------------

    def _find_token(self, request: Request, private_token_ok: bool = True) -> Token | None:
        """lib/gitlab/auth/auth_finders.rb: PRIVATE-TOKEN (or ?private_token=) carries
        access tokens only; ``Authorization: Bearer`` carries OAuth or access tokens."""
        if private_token_ok:
            value = request.headers.get("private-token") or request.query_params.get(
                "private_token"
            )
            if value:
                token = self._tokens.get(value)
                return token if token is not None and token.kind == "personal" else None
        auth = request.headers.get("authorization", "")
        if auth[:7].lower() == "bearer ":
            return self._tokens.get(auth[7:].strip())
        value = request.query_params.get("access_token")
        return self._tokens.get(value) if value else None

    def _authenticate(
        self, request: Request, scopes: tuple[str, ...]
    ) -> tuple[User, Token] | Response:
        """The API guard (lib/api/api_guard.rb), in its order: find, expiry,
        revocation, scope, then the user's own access (blocked, deactivated...)."""
        token = self._find_token(request)
        if token is None:
            return _api_error(401, "401 Unauthorized")
        if _expired(token):
            return _invalid_token(EXPIRED)
        if token.revoked:
            return _invalid_token(REVOKED)
        if scopes and not set(token.scopes) & set(scopes):
            return _insufficient_scope(scopes)
        user = self._users.get(token.user_id)
        if user is None:
            return _api_error(401, "401 Unauthorized")
        if user.state in ACCESS_DENIED:
            return _api_error(403, f"403 Forbidden - {ACCESS_DENIED[user.state]}")
        return user, token

    async def _user(self, request: Request) -> Response:
        found = self._authenticate(request, USER_SCOPES)
        if isinstance(found, Response):
            return found
        user, _ = found
        # doc/api/users.md, "List current user": user.json; administrators also get
        # user-admin-extra-fields.json.
        body: dict[str, Any] = {
            "id": user.id,
            "username": user.username,
            "email": f"{user.username}@example.com",
            "name": user.name or user.username,
            "state": user.state,
            "locked": False,
            "avatar_url": None,
            "web_url": f"{self._external(request)}/{user.username}",
            "created_at": "2012-05-23T08:00:58Z",
            "bio": "",
            "location": None,
            "public_email": None,
            "bot": user.bot,
            "identities": [],
            "can_create_group": True,
            "can_create_project": True,
            "two_factor_enabled": False,
            "external": False,
            "private_profile": False,
        }
        if user.is_admin:
            body.update({"is_admin": True, "namespace_id": user.id, "note": None})
        return JSONResponse(body)

    async def _pat_self(self, request: Request) -> Response:
        found = self._authenticate(request, ())
        if isinstance(found, Response):
            return found
        _, token = found
        if token.kind != "personal":
            return _api_error(404, "404 Not Found")
        # doc/api/personal_access_tokens.md (pat-self.json).
        return JSONResponse(
            {
                "id": token.id,
                "name": token.name,
                "revoked": token.revoked,
                "created_at": _iso(token.created_at),
                "description": "",
                "scopes": token.scopes,
                "user_id": token.user_id,
                "last_used_at": _iso(time.time()),
                "active": not token.revoked and not _expired(token),
                "expires_at": token.expires_at,
            }
        )

    async def _token_info(self, request: Request) -> Response:
        # Doorkeeper reads Authorization: Bearer (or ?access_token=), OAuth tokens only.
        token = self._find_token(request, private_token_ok=False)
        if token is None or token.kind != "oauth":
            return _doorkeeper_invalid("The access token is invalid")
        if token.revoked:
            return _doorkeeper_invalid("The access token was revoked")
        if _expired(token):
            return _doorkeeper_invalid("The access token expired")
        left = None
        if token.expires_in is not None:
            left = max(0, int(token.created_at + token.expires_in - time.time()))
        # oauth-token-info.json: "scope"/"expires_in" are Doorkeeper's, "scopes" and
        # "expires_in_seconds" GitLab's own duplicates (Oauth::TokenInfoController).
        return JSONResponse(
            {
                "resource_owner_id": token.user_id,
                "scope": token.scopes,
                "expires_in": left,
                "application": {"uid": hashlib.sha256(b"fake-app").hexdigest()},
                "created_at": int(token.created_at),
                "scopes": token.scopes,
                "expires_in_seconds": left,
            },
            headers={"Cache-Control": "no-store", "Pragma": "no-cache"},
        )

    async def _list_groups(self, request: Request) -> Response:
        found = self._authenticate(request, GROUP_SCOPES)
        if isinstance(found, Response):
            return found
        user, _ = found
        q = request.query_params
        min_level = _int(q.get("min_access_level"), 0)
        all_available = q.get("all_available", "true" if user.is_admin else "false") == "true"
        levels = self._access_levels(user.id)
        # doc/api/groups.md, "List groups": members see their groups; administrators
        # (all_available defaults to true for them) see every group on the instance.
        if min_level:
            ids = [gid for gid, level in levels.items() if level >= min_level]
        elif all_available:
            ids = [
                gid
                for gid, g in self._groups.items()
                if user.is_admin or gid in levels or g.visibility != "private"
            ]
        else:
            ids = list(levels)
        order = q.get("order_by", "name")
        key = {"id": lambda g: g.id, "path": lambda g: self._paths[g.id][0]}.get(
            order, lambda g: self._paths[g.id][1].lower()
        )
        rows = sorted((self._groups[i] for i in ids), key=key)
        if q.get("sort") == "desc":
            rows.reverse()
        per_page = min(max(_int(q.get("per_page"), 20), 1), 100)
        page = max(_int(q.get("page"), 1), 1)
        total = len(rows)
        chunk = rows[(page - 1) * per_page : page * per_page]
        body = [self._group_json(g, request) for g in chunk]
        return JSONResponse(body, headers=self._page_headers(request, page, per_page, total))

    def _access_levels(self, user_id: int) -> dict[int, int]:
        """Effective role per group: membership is inherited by subgroups."""
        levels: dict[int, int] = {}
        for gid in self._groups:
            best, current, seen = 0, self._groups.get(gid), set()
            while current is not None and current.id not in seen:
                seen.add(current.id)
                best = max(best, current.members.get(user_id, 0))
                parent = current.parent_id
                current = self._groups.get(parent) if parent is not None else None
            if best:
                levels[gid] = best
        return levels

    def _group_json(self, g: Group, request: Request) -> dict[str, Any]:
        full_path, full_name = self._paths[g.id]
        base = self._external(request)
        # doc/api/groups.md (groups.json).
        return {
            "id": g.id,
            "name": g.name or g.path,
            "path": g.path,
            "description": "",
            "visibility": g.visibility,
            "lfs_enabled": True,
            "avatar_url": None,
            "web_url": f"{base}/groups/{full_path}",
            "request_access_enabled": False,
            "full_name": full_name,
            "full_path": full_path,
            "parent_id": g.parent_id,
        }

    def _page_headers(
        self, request: Request, page: int, per_page: int, total: int
    ) -> dict[str, str]:
        """doc/api/rest/index.md, "Pagination Link header" and "Other pagination headers".

        Past 10,000 rows GitLab leaves out x-total, x-total-pages and rel="last".
        """
        pages = max(1, -(-total // per_page))
        nxt = str(page + 1) if page < pages else ""
        prev = str(page - 1) if page > 1 else ""
        headers = {
            "x-page": str(page),
            "x-per-page": str(per_page),
            "x-next-page": nxt,
            "x-prev-page": prev,
        }
        counted = total <= 10_000
        if counted:
            headers["x-total"] = str(total)
            headers["x-total-pages"] = str(pages)
        query = dict(request.query_params)
        base = f"{self._external(request)}{request.url.path}"

        def link(n: int, rel: str) -> str:
            return f'<{base}?{urlencode({**query, "page": n, "per_page": per_page})}>; rel="{rel}"'

        links = []
        if prev:
            links.append(link(page - 1, "prev"))
        if nxt:
            links.append(link(page + 1, "next"))
        links.append(link(1, "first"))
        if counted:
            links.append(link(pages, "last"))
        headers["link"] = ", ".join(links)
        return headers

    def _external(self, request: Request) -> str:
        return self.external_url or f"{request.url.scheme}://{request.url.netloc}"

    # ---- throttling (doc/administration/settings/user_and_ip_rate_limits.md) ----

    def throttle(self, key: str, now: float) -> tuple[bool, dict[str, str]]:
        """Count one call against ``key``'s window; (allowed, RateLimit-* headers)."""
        f = self.faults
        if f.throttle_limit is None:
            return True, {}
        with self._lock:
            start, count = self._windows.get(key, (0.0, 0))
            if now >= start + f.throttle_period:
                start, count = now - now % f.throttle_period, 0
            count += 1
            self._windows[key] = (start, count)
        reset = start + f.throttle_period
        name = (
            "throttle_authenticated_api"
            if key.startswith("user:")
            else "throttle_unauthenticated_api"
        )
        headers = {
            "RateLimit-Name": name,
            "RateLimit-Limit": str(f.throttle_limit),
            "RateLimit-Observed": str(count),
            "RateLimit-Remaining": str(max(0, f.throttle_limit - count)),
            "RateLimit-Reset": str(int(reset)),
            "RateLimit-ResetTime": _http_date(reset),
        }
        return count <= f.throttle_limit, headers

    # ---- control --------------------------------------------------------------

    def configure(self, **changes: Any) -> None:
        """Change faults (thread-safe enough: one attribute store each)."""
        for key, value in changes.items():
            if not hasattr(self.faults, key):
                raise ValueError(f"unknown fault {key!r}")
            setattr(self.faults, key, value)

    def reset(self) -> None:
        # In place: requests already hanging watch this very object.
        self.configure(**asdict(Faults()))
        with self._lock:
            self._stats = Stats()
            self._windows = {}

    def stats(self) -> Stats:
        with self._lock:
            s = self._stats
            return Stats(
                s.calls,
                dict(s.by_path),
                dict(s.by_status),
                dict(s.by_credential),
                s.in_flight,
                s.max_in_flight,
                list(s.log),
            )

    def record_start(self, credential: str) -> None:
        with self._lock:
            s = self._stats
            s.calls += 1
            s.by_credential[credential] = s.by_credential.get(credential, 0) + 1
            s.in_flight += 1
            s.max_in_flight = max(s.max_in_flight, s.in_flight)

    def record_end(self, arrived: float, path: str, status: int) -> None:
        with self._lock:
            s = self._stats
            s.in_flight -= 1
            s.by_path[path] = s.by_path.get(path, 0) + 1
            s.by_status[status] = s.by_status.get(status, 0) + 1
            s.log.append((arrived, path, status))
            del s.log[:-100_000]

    async def _control_faults(self, request: Request) -> Response:
        if request.method == "POST":
            try:
                self.configure(**json.loads(await request.body() or b"{}"))
            except (ValueError, TypeError) as exc:
                return JSONResponse({"error": str(exc)}, status_code=400)
        return JSONResponse(asdict(self.faults))

    async def _control_seed(self, request: Request) -> Response:
        replace = request.query_params.get("replace", "true") == "true"
        try:
            self.load_seed(json.loads(await request.body()), replace=replace)
        except (ValueError, TypeError, KeyError) as exc:
            return JSONResponse({"error": f"bad seed: {exc}"}, status_code=400)
        return JSONResponse(
            {"users": len(self._users), "tokens": len(self._tokens), "groups": len(self._groups)}
        )

    async def _control_stats(self, request: Request) -> Response:
        s = self.stats()
        return JSONResponse(
            {
                "calls": s.calls,
                "by_path": s.by_path,
                "by_status": {str(k): v for k, v in s.by_status.items()},
                "by_credential": s.by_credential,
                "in_flight": s.in_flight,
                "max_in_flight": s.max_in_flight,
                "log": s.log[-1000:],
            }
        )

    async def _control_reset(self, request: Request) -> Response:
        self.reset()
        return JSONResponse(asdict(self.faults))

    # ---- lifecycle ------------------------------------------------------------

    def _config(self) -> uvicorn.Config:
        return uvicorn.Config(
            self.app,
            host=self.host,
            port=self.port,
            log_level="warning",
            access_log=False,
            lifespan="off",
            # Hung requests must not hold shutdown for long.
            timeout_graceful_shutdown=1,
        )

    def start_in_thread(self) -> FakeGitLab:
        import socket

        # Bind here so the port is known (and taken) before the thread runs.
        sock = socket.socket()
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((self.host, self.port))
        self.port = sock.getsockname()[1]
        self._server = uvicorn.Server(self._config())
        server = self._server
        self._thread = threading.Thread(
            target=lambda: server.run(sockets=[sock]), name="fake-gitlab", daemon=True
        )
        self._thread.start()
        deadline = time.monotonic() + 10
        while not server.started:
            if time.monotonic() > deadline or not self._thread.is_alive():
                raise RuntimeError("fake GitLab did not start")
            time.sleep(0.01)
        return self

    def stop(self) -> None:
        self.faults.hang = False
        if self._server is not None:
            self._server.should_exit = True
        if self._thread is not None:
            self._thread.join(timeout=10)

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"


class _FaultMiddleware:
    """Counts API calls and applies faults and throttling before GitLab answers."""

    def __init__(self, app: Any, fake: FakeGitLab) -> None:
        self.app = app
        self.fake = fake

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        path = scope.get("path", "")
        if scope["type"] != "http" or path.startswith("/_fake/"):
            await self.app(scope, receive, send)
            return
        fake, f = self.fake, self.fake.faults
        arrived = time.time()
        headers = dict(scope.get("headers") or [])
        credential = (
            "private-token"
            if b"private-token" in headers
            else "bearer"
            if headers.get(b"authorization", b"")[:7].lower() == b"bearer "
            else "none"
        )
        fake.record_start(credential)
        status_seen = 0
        extra: dict[str, str] = {}

        async def send_with_headers(message: Any) -> None:
            nonlocal status_seen
            if message["type"] == "http.response.start":
                status_seen = message["status"]
                drop = {h.lower().encode() for h in f.drop_headers}
                headers = [(k, v) for k, v in message["headers"] if k.lower() not in drop]
                headers += [
                    (k.lower().encode(), v.encode())
                    for k, v in extra.items()
                    if k.lower().encode() not in drop
                ]
                message = {**message, "headers": headers}
            await send(message)

        try:
            faulted = path.startswith(f.path_prefix)
            if faulted and f.hang:
                # Until the fault is cleared (bounded, so a forgotten fake still stops).
                for _ in range(1200):
                    if not f.hang:
                        break
                    await asyncio.sleep(0.05)
            if faulted and f.latency:
                await asyncio.sleep(f.latency)
            status = f.status if faulted else None
            if status is None and faulted and f.fail_fraction and random.random() < f.fail_fraction:
                status = f.fail_status
            if status is not None and status != 200:
                await _fault_response(status, f.retry_after)(scope, receive, send_with_headers)
                return
            # Rack::Attack runs before the API: per user for a valid token, else per IP.
            token = fake._find_token(Request(scope))
            client = scope.get("client") or ("?", 0)
            key = f"user:{token.user_id}" if token is not None else f"ip:{client[0]}"
            allowed, extra = fake.throttle(key, arrived)
            if not allowed:
                retry = int(float(extra["RateLimit-Reset"]) - arrived) + 1
                extra["Retry-After"] = str(retry)
                await Response("Retry later\n", status_code=429, media_type="text/plain")(
                    scope, receive, send_with_headers
                )
                return
            await self.app(scope, receive, send_with_headers)
        finally:
            fake.record_end(arrived, path, status_seen)


def _fault_response(status: int, retry_after: float | None) -> Response:
    if status == 429:
        if retry_after is None:
            # Some 429s come bare (README of the reference shapes).
            return Response("Retry later\n", status_code=429, media_type="text/plain")
        return _throttled(retry_after)
    if status in (502, 503, 504):
        # What the reverse proxy in front of Puma/Workhorse answers: HTML, not JSON.
        return Response(
            f"<html><body><h1>{status}</h1></body></html>\n",
            status_code=status,
            media_type="text/html",
        )
    messages = {401: "401 Unauthorized", 403: "403 Forbidden", 404: "404 Not Found"}
    return _api_error(status, messages.get(status, f"{status} Internal Server Error"))


def _throttled(retry_after: float) -> Response:
    # doc/administration/settings/user_and_ip_rate_limits.md, "Response headers"
    # (error-429.txt): plain-text body, Retry-After and RateLimit-*.
    now = time.time()
    reset = int(now + retry_after)
    return Response(
        "Retry later\n",
        status_code=429,
        media_type="text/plain",
        headers={
            "Retry-After": str(int(retry_after)),
            "RateLimit-Name": "throttle_authenticated_api",
            "RateLimit-Limit": "60",
            "RateLimit-Observed": "67",
            "RateLimit-Remaining": "0",
            "RateLimit-Reset": str(reset),
            "RateLimit-ResetTime": _http_date(reset),
        },
    )


def _expired(token: Token) -> bool:
    if token.kind == "oauth":
        return token.expires_in is not None and time.time() >= token.created_at + token.expires_in
    if token.expires_at is None:
        return False
    return datetime.now(UTC).date() >= date.fromisoformat(token.expires_at)


def _iso(when: float) -> str:
    return (
        datetime.fromtimestamp(when, UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")
    )


def _int(value: str | None, default: int) -> int:
    return int(value) if value is not None and value.lstrip("-").isdigit() else default


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8929)
    parser.add_argument("--seed", type=Path, help="JSON seed of users, tokens and groups")
    parser.add_argument("--synthetic-users", type=int, default=0, help="generate a load seed")
    parser.add_argument("--groups-per-user", type=int, default=3)
    parser.add_argument(
        "--throttle-limit",
        type=int,
        default=2000,
        help="GitLab's per-user API limit per minute (0: unlimited)",
    )
    args = parser.parse_args()
    seed = json.loads(args.seed.read_text()) if args.seed else None
    if args.synthetic_users:
        seed = synthetic_seed(args.synthetic_users, args.groups_per_user)
    fake = FakeGitLab(args.host, args.port, seed)
    fake.configure(throttle_limit=args.throttle_limit or None)
    print(f"fake GitLab on http://{args.host}:{args.port}", flush=True)
    uvicorn.Server(fake._config()).run()


if __name__ == "__main__":
    main()
