"""Keystone backend settings: endpoint, service credentials, token lifecycle, groups,
identity templates."""

from __future__ import annotations

import re
import string
from typing import Annotated, Any, Literal

from pydantic import Field, model_validator

from backends.base import Backend
from backends.budget import UNLIMITED, CallBudget
from backends.durations import AGE_MAX, Age, Interval, count, finite
from backends.http import PoolSettings, TLSClientSettings
from backends.registry import build_registered, register
from backends.settings import MAX_TOKEN_BYTES, BackendSettings, Secret, Strict

Scope = Literal["project", "domain", "system", "unscoped"]
ALL_SCOPES: tuple[Scope, ...] = ("project", "domain", "system", "unscoped")

# A fernet token is url-safe base64 (padding stripped by Keystone) of
# 0x80 | 8-byte timestamp | 16-byte IV | ciphertext (>= 16 bytes) | 32-byte HMAC.
# The version byte and a timestamp below 2**32 (until 2106) always encode as "gAAAAA".
FERNET = re.compile(r"gAAAAA[A-Za-z0-9_-]+={0,2}")
FERNET_MIN_LENGTH = 119  # 89 bytes, the smallest possible fernet token, in base64

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
    refresh_before_expiry_seconds: Interval = 300.0
    # After a failed login, or a 401 on a fresh token, wait this long before the next
    # login; doubled on every further failure up to the maximum, with +/-20% jitter.
    reauth_backoff_initial_seconds: Interval = 1.0
    reauth_backoff_max_seconds: Interval = 30.0

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
    cache_ttl_seconds: Annotated[float, finite(gt=0, le=AGE_MAX)] = 300.0
    # Last known groups are served this long past their TTL while Keystone cannot list them.
    max_stale_seconds: Age = 3600.0
    max_entries: Annotated[int, count()] = 10_000
    max_pages: Annotated[int, count(le=10_000)] = 20


@register
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
    fernet_max_length: Annotated[int, count(ge=FERNET_MIN_LENGTH, le=MAX_TOKEN_BYTES)] = 2048
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

    def build(self, budget: CallBudget = UNLIMITED) -> Backend:
        # KeystoneBackend registers itself (@builds): it imports this module, so this
        # module does not import it. The package imports both.
        return build_registered(self, budget)


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
