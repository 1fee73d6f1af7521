"""Keystone v3, a drop-in for k8s-keystone-auth's authentication webhook.

A user's token is checked with ``GET /v3/auth/tokens?nocatalog``: the gateway's own
service token in ``X-Auth-Token``, the user's in ``X-Subject-Token``. Never HEAD (the
``identity:check_token`` policy refuses service-role tokens) and never
``allow_expired`` (Keystone would call an expired token valid).

=======================  ==========================================================
Keystone answers         outcome
=======================  ==========================================================
200                      authenticated (mapped as k8s-keystone-auth does)
404                      rejected: unknown, tampered, expired, revoked, user disabled
401                      the gateway's *own* token is bad: one coalesced re-login
403                      unavailable, misconfigured: the service user may not validate
5xx, 429, transport      unavailable
=======================  ==========================================================

The incident this backend exists for: Keystone faltered, its 401s were read as "the
user's token expired", every client logged in again and retried, and the storm kept
Keystone down. Here a 401 can only ever cost one shared re-login, then exponential
backoff during which reviews are answered "unavailable" without calling Keystone.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import random
import re
import string
import time
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Coroutine, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Annotated, Any, Literal
from urllib.parse import quote, urlsplit

import httpx
from pydantic import Field, model_validator

from authn_gateway.settings import (
    BackendSettings,
    NonNegativeFloat,
    PositiveFloat,
    Secret,
    Strict,
    TimeoutSettings,
)

from .base import Authenticated, Backend, Outcome, Rejected, Unavailable, UserInfo
from .http import PoolSettings, TLSClientSettings, make_client, server_failure, transport_failure

log = logging.getLogger(__name__)

EXTRA = "alpha.kubernetes.io/identity/"
Scope = Literal["project", "domain", "system", "unscoped"]
ALL_SCOPES: tuple[Scope, ...] = ("project", "domain", "system", "unscoped")

# A fernet token is url-safe base64 (padding stripped by Keystone) of
# 0x80 | 8-byte timestamp | 16-byte IV | ciphertext (>= 16 bytes) | 32-byte HMAC.
# The version byte and a timestamp below 2**32 (until 2106) always encode as "gAAAAA".
_FERNET = re.compile(r"gAAAAA[A-Za-z0-9_-]+={0,2}")
FERNET_MIN_LENGTH = 119  # 89 bytes, the smallest possible fernet token, in base64
# Keystone tokens (fernet, JWS) are printable ASCII; anything else cannot be sent in a
# header and cannot be a token.
_HEADER_SAFE = re.compile(r"[\x21-\x7e]+")

_TEMPLATE_FIELDS = {
    "username_template": {"user_name", "user_id", "user_domain_name", "user_domain_id"},
    "group_template": {"group_name", "group_id", "group_domain_id"},
    "project_group_template": {
        "project_id",
        "project_name",
        "project_domain_id",
        "project_domain_name",
    },
}


class ServiceCredentials(Strict):
    """The gateway's own Keystone identity: a password user, or an application credential.

    A password user is scoped to the system (``system_scope: all``, with the ``reader``
    role on the system: needed to list users' groups) or to a project (with the
    ``service`` role: enough to validate tokens, not to list groups).
    """

    username: str | None = None
    password: Secret | None = None
    user_domain_name: str = "Default"
    system_scope: Literal["all"] | None = None
    project_name: str | None = None
    project_domain_name: str = "Default"
    application_credential_id: str | None = None
    application_credential_secret: Secret | None = None

    @model_validator(mode="after")
    def _one_method(self) -> ServiceCredentials:
        password = self.username is not None or self.password is not None
        appcred = (
            self.application_credential_id is not None
            or self.application_credential_secret is not None
        )
        if password and appcred:
            raise ValueError("give username/password or an application credential, not both")
        if appcred:
            if self.application_credential_id is None:
                raise ValueError("application_credential_id: required with a secret")
            if self.application_credential_secret is None:
                raise ValueError("application_credential_secret: required with an id")
            if self.system_scope is not None or self.project_name is not None:
                raise ValueError("an application credential carries its own scope; drop the scope")
            return self
        if not password:
            raise ValueError(
                "needs username and password, or application_credential_id and "
                "application_credential_secret"
            )
        if self.username is None:
            raise ValueError("username: required with a password")
        if self.password is None:
            raise ValueError("password: required with a username")
        if (self.system_scope is None) == (self.project_name is None):
            raise ValueError("password login needs exactly one of system_scope or project_name")
        return self

    @property
    def system_scoped(self) -> bool:
        return self.system_scope is not None

    def auth_request(self) -> dict[str, Any]:
        """The body of ``POST /v3/auth/tokens``. Holds the secret: never log it."""
        if self.application_credential_id is not None:
            assert self.application_credential_secret is not None
            identity: dict[str, Any] = {
                "methods": ["application_credential"],
                "application_credential": {
                    "id": self.application_credential_id,
                    "secret": self.application_credential_secret.get_secret_value(),
                },
            }
            return {"auth": {"identity": identity}}
        assert self.password is not None
        identity = {
            "methods": ["password"],
            "password": {
                "user": {
                    "name": self.username,
                    "domain": {"name": self.user_domain_name},
                    "password": self.password.get_secret_value(),
                }
            },
        }
        scope: dict[str, Any] = {"system": {"all": True}}
        if not self.system_scoped:
            project = {"name": self.project_name, "domain": {"name": self.project_domain_name}}
            scope = {"project": project}
        return {"auth": {"identity": identity, "scope": scope}}


class ServiceTokenSettings(Strict):
    # Refresh this long before the token's expires_at (at most half its lifetime).
    refresh_before_expiry_seconds: PositiveFloat = 300.0
    # After a failed login, or a 401 on a fresh token, wait this long before the next
    # login; doubled on every further failure up to the maximum, with +/-20% jitter.
    reauth_backoff_initial_seconds: PositiveFloat = 1.0
    reauth_backoff_max_seconds: PositiveFloat = 30.0

    @model_validator(mode="after")
    def _check_backoff(self) -> ServiceTokenSettings:
        if self.reauth_backoff_initial_seconds > self.reauth_backoff_max_seconds:
            raise ValueError(
                "reauth_backoff_initial_seconds: must be <= reauth_backoff_max_seconds"
            )
        return self


class GroupLookupSettings(Strict):
    """``GET /v3/users/{id}/groups``: needs a system-scoped service token."""

    enabled: bool = True
    cache_ttl_seconds: PositiveFloat = 300.0
    # Last known groups are served this long past their TTL while Keystone cannot list them.
    max_stale_seconds: NonNegativeFloat = 3600.0
    max_entries: Annotated[int, Field(ge=1)] = 10_000
    max_pages: Annotated[int, Field(ge=1)] = 20


class KeystoneSettings(BackendSettings):
    type: Literal["keystone"]
    # Keystone's v3 endpoint, e.g. https://keystone.example:5000/v3 ("/v3" is added if missing).
    auth_url: str = Field(pattern=r"^https?://[^/?#]+(/[^?#]*)?$")
    service: ServiceCredentials
    service_token: ServiceTokenSettings = Field(default_factory=ServiceTokenSettings)
    groups: GroupLookupSettings = Field(default_factory=GroupLookupSettings)
    # Python format strings; see _TEMPLATE_FIELDS for the names each may use.
    username_template: str = "{user_name}"
    group_template: str = "{group_name}"
    # The project group k8s-keystone-auth adds; "" leaves it out.
    project_group_template: str = "{project_id}"
    # Token scopes that may log in; others are rejected.
    accepted_scopes: list[Scope] = Field(default_factory=lambda: list(ALL_SCOPES), min_length=1)
    # Refuse, without asking Keystone, strings that cannot be fernet tokens. Only for
    # deployments whose token provider is fernet (not JWS).
    fernet_precheck: bool = False
    fernet_max_length: Annotated[int, Field(ge=FERNET_MIN_LENGTH)] = 2048
    tls: TLSClientSettings = Field(default_factory=TLSClientSettings)
    pool: PoolSettings = Field(default_factory=PoolSettings)

    @model_validator(mode="after")
    def _check_keystone(self) -> KeystoneSettings:
        for name, allowed in _TEMPLATE_FIELDS.items():
            problem = _template_problem(getattr(self, name), allowed)
            if problem:
                raise ValueError(f"{name}: {problem}")
        if not self.username_template:
            raise ValueError("username_template: must not be empty")
        if self.groups.enabled and not self.service.system_scoped:
            raise ValueError(
                "groups.enabled: listing a user's groups needs a system-scoped service "
                "token (service.system_scope: all, reader role on the system); set "
                "groups.enabled: false for a project-scoped service user"
            )
        return self

    @property
    def v3_url(self) -> str:
        url = self.auth_url.rstrip("/")
        return url if url.endswith("/v3") else url + "/v3"

    def build(self) -> Backend:
        return KeystoneBackend(self)


def _template_problem(template: str, allowed: set[str]) -> str | None:
    try:
        parts = list(string.Formatter().parse(template))
    except ValueError as exc:
        return str(exc)
    for _literal, field, spec, conversion in parts:
        if field is None:
            continue
        if field not in allowed:
            return f"unknown field {{{field}}}; use one of " + ", ".join(
                f"{{{a}}}" for a in sorted(allowed)
            )
        if spec or conversion:
            return "format specs and conversions are not supported"
    return None


# --- the service token ---------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class _Held:
    value: str
    # Monotonic times, from Keystone's own issued_at -> expires_at lifetime so that
    # clock skew between us and Keystone does not matter.
    refresh_at: float
    usable_until: float


class ServiceToken:
    """The gateway's own token: one login, one refresher, one re-login per 401.

    Every login goes through one shared task (``_flight``), whatever triggered it: the
    start, the refresher, or any number of concurrent reviews that saw a 401. After a
    failed login, or a 401 on a token we just got, the next login waits out an
    exponential backoff; meanwhile :meth:`get` answers :class:`Unavailable` at once.
    The backoff resets only when Keystone accepts our token on a validation.
    """

    def __init__(
        self,
        backend_name: str,
        client: httpx.AsyncClient,
        credentials: ServiceCredentials,
        settings: ServiceTokenSettings,
        timeouts: TimeoutSettings,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._name = backend_name
        self._client = client
        self._credentials = credentials
        self._settings = settings
        self._deadline = timeouts.total_seconds
        self._clock = clock
        self._held: _Held | None = None
        self._flight: asyncio.Task[_Held | Unavailable] | None = None
        self._refresher: asyncio.Task[None] | None = None
        self._strikes = 0
        self._not_before = 0.0
        self._last_failure = Unavailable("no service token yet")
        #: Logins attempted (for logs and tests).
        self.logins = 0

    async def start(self) -> None:
        # In the background: a Keystone outage must neither fail nor hold up the gateway's
        # start (it would rather answer from its cache); early reviews join this login.
        self._flight = asyncio.create_task(self._authenticate())
        self._refresher = asyncio.create_task(self._refresh_loop(), name=f"keystone-{self._name}")

    async def close(self) -> None:
        tasks = [t for t in (self._refresher, self._flight) if t is not None]
        for task in tasks:
            task.cancel()
        # Let them unwind before the HTTP client they use is closed.
        await asyncio.gather(*tasks, return_exceptions=True)

    async def get(self) -> str | Unavailable:
        held = self._held
        if held is not None and self._clock() < held.usable_until:
            return held.value
        return await self._login()

    def refused(self, token: str) -> None:
        """Keystone answered 401 to ``token``: drop it; the next :meth:`get` logs in again."""
        held = self._held
        if held is not None and held.value == token:
            self._held = None
            self._trouble(Unavailable("Keystone refused the gateway's service token (401)"))

    def confirmed(self) -> None:
        """Keystone accepted our token on a validation: the trouble is over."""
        self._strikes = 0

    async def _login(self) -> str | Unavailable:
        flight = self._flight
        if flight is None or flight.done():
            wait = self._not_before - self._clock()
            if wait > 0:
                return Unavailable(
                    f"{self._last_failure.reason}; next service login in {wait:.1f}s"
                )
            flight = self._flight = asyncio.create_task(self._authenticate())
        # shield: a review that gives up must not cancel the login the others wait on.
        result = await asyncio.shield(flight)
        return result.value if isinstance(result, _Held) else result

    def _trouble(self, failure: Unavailable) -> None:
        """Schedule the next login: at once after the first trouble, then backing off."""
        s = self._settings
        delay = 0.0
        if self._strikes > 0:
            delay = min(
                s.reauth_backoff_initial_seconds * 2 ** (self._strikes - 1),
                s.reauth_backoff_max_seconds,
            ) * random.uniform(0.8, 1.2)
        self._strikes += 1
        self._not_before = self._clock() + delay
        self._last_failure = failure

    async def _authenticate(self) -> _Held | Unavailable:
        self.logins += 1
        started = self._clock()
        try:
            async with asyncio.timeout(self._deadline):
                response = await self._client.post(
                    "auth/tokens",
                    params={"nocatalog": "1"},
                    json=self._credentials.auth_request(),
                )
        except TimeoutError:
            return self._failed(Unavailable("service login: no answer in time"))
        except httpx.HTTPError as exc:
            return self._failed(Unavailable(f"service login: {transport_failure(exc).reason}"))
        if response.status_code == 201:
            held = self._parse(response, started)
            if isinstance(held, _Held):
                self._held = held
                log.info("backend %s: logged in to Keystone as the service user", self._name)
            else:
                self._failed(held)
            return held
        if response.status_code in (400, 401, 403, 404):
            # Wrong password, disabled user, unknown project: someone has to fix the config.
            return self._failed(
                Unavailable(
                    f"Keystone refused the service credentials ({response.status_code})",
                    misconfigured=True,
                )
            )
        failure = server_failure("keystone", response)
        return self._failed(
            Unavailable(f"service login: {failure.reason}", retry_after=failure.retry_after)
        )

    def _failed(self, failure: Unavailable) -> Unavailable:
        self._trouble(failure)
        log.warning("backend %s: service login failed: %s", self._name, failure.reason)
        return failure

    def _parse(self, response: httpx.Response, started: float) -> _Held | Unavailable:
        value = response.headers.get("x-subject-token", "")
        try:
            body = response.json()["token"]
            issued = parse_keystone_time(body["issued_at"])
            expires = parse_keystone_time(body["expires_at"])
        except (ValueError, KeyError, TypeError):
            return Unavailable("service login: Keystone sent an unreadable token body")
        lifetime = expires - issued
        if not value or lifetime <= 0:
            return Unavailable("service login: Keystone sent no usable token")
        margin = min(self._settings.refresh_before_expiry_seconds, lifetime / 2)
        # Stop using it a little before Keystone would, so a validation never races expiry.
        return _Held(value, started + lifetime - margin, started + lifetime - min(30.0, margin / 2))

    async def _refresh_loop(self) -> None:
        """Log in again shortly before expiry, or when there is no token (backing off)."""
        while True:
            held = self._held
            due = held.refresh_at if held is not None else self._not_before
            # Wake at least every few seconds: state changes under us (401s, logins).
            await asyncio.sleep(min(max(due - self._clock(), 0.05), 5.0))
            held = self._held
            now = self._clock()
            if held is not None and now < held.refresh_at:
                continue
            if now < self._not_before:
                continue
            try:
                await self._login()
            except asyncio.CancelledError:
                raise
            except Exception:
                # The refresher must outlive any bug in one attempt.
                log.exception("backend %s: refreshing the service login failed", self._name)


# --- groups ----------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class _Group:
    id: str
    name: str
    domain_id: str


class GroupCache:
    """A user's groups by user id, apart from the review cache; one lookup per user at a time."""

    def __init__(
        self, settings: GroupLookupSettings, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self._settings = settings
        self._clock = clock
        self._entries: OrderedDict[str, tuple[tuple[_Group, ...], float]] = OrderedDict()
        self._flights: dict[str, asyncio.Task[tuple[_Group, ...] | Rejected | Unavailable]] = {}

    async def get(
        self,
        user_id: str,
        fetch: Callable[[str], Coroutine[Any, Any, tuple[_Group, ...] | Rejected | Unavailable]],
    ) -> tuple[_Group, ...] | Rejected | Unavailable:
        known = self._entries.get(user_id)
        now = self._clock()
        if known is not None and now < known[1] + self._settings.cache_ttl_seconds:
            return known[0]
        task = self._flights.get(user_id)
        if task is None:
            task = asyncio.create_task(fetch(user_id))
            self._flights[user_id] = task
            task.add_done_callback(lambda _t: self._flights.pop(user_id, None))
        result = await asyncio.shield(task)
        if isinstance(result, tuple):
            self._entries[user_id] = (result, self._clock())
            self._entries.move_to_end(user_id)
            while len(self._entries) > self._settings.max_entries:
                self._entries.popitem(last=False)
            return result
        if isinstance(result, Rejected):
            self._entries.pop(user_id, None)
            return result
        stale_limit = self._settings.cache_ttl_seconds + self._settings.max_stale_seconds
        if known is not None and now < known[1] + stale_limit:
            return known[0]
        return result


# --- the backend -----------------------------------------------------------------------


class KeystoneBackend(Backend):
    kind = "keystone"

    def __init__(self, settings: KeystoneSettings, client: httpx.AsyncClient | None = None) -> None:
        super().__init__(settings.name)
        self._s = settings
        self._base = settings.v3_url + "/"
        # Keystone is usually served by uWSGI, which closes idle connections unannounced:
        # the one case a request is resent (once, paid from the outbound budget).
        self._client = client or make_client(
            self._base,
            settings.timeouts,
            settings.tls,
            settings.pool,
            resend_budget=lambda: self.call_budget,
        )
        self.service = ServiceToken(
            settings.name, self._client, settings.service, settings.service_token, settings.timeouts
        )
        self._groups = GroupCache(settings.groups)

    async def start(self) -> None:
        if not self._s.tls.verify:
            log.warning("backend %s: TLS verification is OFF", self.name)
        await self.service.start()

    async def close(self) -> None:
        await self.service.close()
        await self._client.aclose()

    def could_accept(self, token: str) -> bool:
        if not self._s.fernet_precheck:
            return True
        return FERNET_MIN_LENGTH <= len(token) <= self._s.fernet_max_length and bool(
            _FERNET.fullmatch(token)
        )

    async def authenticate(self, token: str) -> Outcome:
        if not _HEADER_SAFE.fullmatch(token):
            return Rejected("not a Keystone token (characters no token has)")
        answer = await self._with_service_token(
            lambda service: self._client.get(
                "auth/tokens",
                params={"nocatalog": "1"},
                headers={"X-Auth-Token": service, "X-Subject-Token": token},
            )
        )
        if isinstance(answer, Unavailable):
            return answer
        status = answer.status_code
        if status == 404:
            return Rejected("Keystone does not know the token (404)")
        if status == 403:
            return Unavailable(
                "the service user may not validate tokens (Keystone 403): give it the "
                "service role on its project or the reader role on the system",
                misconfigured=True,
            )
        if status != 200:
            return server_failure(self.kind, answer)
        try:
            body = answer.json()["token"]
            user_id = body["user"]["id"]
        except (ValueError, KeyError, TypeError):
            return Unavailable("Keystone sent an unreadable token body")
        groups: tuple[_Group, ...] = ()
        if self._s.groups.enabled:
            found = await self._groups.get(str(user_id), self._fetch_groups)
            if not isinstance(found, tuple):
                return found
            groups = found
        return map_identity(body, groups, self._s)

    async def _with_service_token(
        self, send: Callable[[str], Awaitable[httpx.Response]]
    ) -> httpx.Response | Unavailable:
        """Send with our token; after a 401, once more with a fresh one, never more."""
        for attempt in (1, 2):
            service = await self.service.get()
            if isinstance(service, Unavailable):
                return service
            try:
                response = await send(service)
            except httpx.HTTPError as exc:
                return transport_failure(exc)
            if response.status_code != 401:
                if response.status_code in (200, 404):
                    self.service.confirmed()
                return response
            await response.aclose()
            self.service.refused(service)
            if attempt == 2:
                break
        return Unavailable("Keystone refused the gateway's service token (401)")

    async def _fetch_groups(self, user_id: str) -> tuple[_Group, ...] | Rejected | Unavailable:
        url: str = f"users/{quote(user_id, safe='')}/groups"
        groups: list[_Group] = []
        for _page in range(self._s.groups.max_pages):
            answer = await self._with_service_token(functools.partial(self._list_page, url))
            if isinstance(answer, Unavailable):
                return answer
            if answer.status_code == 404:
                return Rejected("the token's user no longer exists (404 on its groups)")
            if answer.status_code == 403:
                return Unavailable(
                    "the service user may not list groups (Keystone 403): it needs the "
                    "reader role on the system and a system-scoped login",
                    misconfigured=True,
                )
            if answer.status_code != 200:
                return server_failure(self.kind, answer)
            try:
                body = answer.json()
                groups += [
                    _Group(str(g["id"]), str(g["name"]), str(g.get("domain_id", "")))
                    for g in body["groups"]
                ]
                following = (body.get("links") or {}).get("next")
            except (ValueError, KeyError, TypeError, AttributeError):
                return Unavailable("Keystone sent an unreadable group list")
            if not following:
                return tuple(groups)
            if not self._same_keystone(str(following)):
                # Our service token must never go to a host the config does not name.
                return Unavailable("Keystone's next-page link points elsewhere")
            url = str(following)
        return Unavailable(f"user has more than {self._s.groups.max_pages} pages of groups")

    def _list_page(self, url: str, service: str) -> Awaitable[httpx.Response]:
        return self._client.get(url, headers={"X-Auth-Token": service})

    def _same_keystone(self, link: str) -> bool:
        ours, theirs = urlsplit(self._base), urlsplit(link)
        return (ours.scheme, ours.netloc) == (theirs.scheme, theirs.netloc) and (
            theirs.path.startswith(ours.path)
        )


# --- identity mapping ------------------------------------------------------------------


def token_scope(token: Mapping[str, Any]) -> Scope:
    if token.get("project"):
        return "project"
    if token.get("domain"):
        return "domain"
    if token.get("system"):
        return "system"
    return "unscoped"


def map_identity(
    token: Mapping[str, Any], groups: tuple[_Group, ...], settings: KeystoneSettings
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
        return Unavailable("username_template gave an empty user name")

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
