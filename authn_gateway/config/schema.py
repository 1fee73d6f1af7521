"""The whole file's schema: :class:`GatewayConfig`, its sections and the backends'
union, with the checks that span sections."""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Annotated, Union

from pydantic import Field, model_validator

from authn_gateway.config.authorization import AuthorizationSettings
from authn_gateway.config.clusters import MAX_CLUSTERS, ClusterSettings, cluster_problem
from authn_gateway.config.redis_settings import RedisSettings
from authn_gateway.config.sections import (
    AdminSettings,
    CacheDefaults,
    DenyListSettings,
    InboundLimitSettings,
    LoggingSettings,
    MarkerSettings,
    ReadinessSettings,
)
from authn_gateway.config.server import ServerSettings
from authn_gateway.secret_strength import StrongSecret, secret_weakness
from backends import load_builtin
from backends.durations import Timeout
from backends.registry import settings_types, type_names
from backends.settings import BackendSettings, CacheSettings, Strict

# Every backend type registers itself (backends.registry); the union follows.
load_builtin()
if TYPE_CHECKING:
    BackendConfig = BackendSettings
else:
    BackendConfig = Annotated[Union[settings_types()], Field(discriminator="type")]  # noqa: UP007
BACKEND_TYPES = type_names()

SECRET_ENV = "AUTHN_GATEWAY_SECRET"

# Each one costs a Redis read per shared-tier miss while it is set.
MAX_PREVIOUS_SECRETS = 3


class GatewayConfig(Strict):
    # HMAC key for cache keys and token hash prefixes. Random per process when unset.
    secret: StrongSecret | None = None
    # Secrets being rotated: accepted when reading shared entries, never written with
    # (docs/operations.md, "Rotate the gateway secret").
    previous_secrets: list[StrongSecret] = Field(
        default_factory=list, max_length=MAX_PREVIOUS_SECRETS
    )
    server: ServerSettings = Field(default_factory=ServerSettings)
    logging: LoggingSettings = Field(default_factory=LoggingSettings)
    # Audiences this gateway's tokens are valid for (a backend may override).
    audiences: list[str] = Field(default_factory=list)
    # Every review is answered within this, whatever the backends do.
    review_deadline_seconds: Timeout = 5.0
    cache: CacheDefaults = Field(default_factory=CacheDefaults)
    inbound_limit: InboundLimitSettings = Field(default_factory=InboundLimitSettings)
    admin: AdminSettings = Field(default_factory=AdminSettings)
    readiness: ReadinessSettings = Field(default_factory=ReadinessSettings)
    # Rejects Kubernetes service-account JWTs locally; kube-apiserver checks those itself.
    reject_service_account_tokens: bool = True
    markers: MarkerSettings = Field(default_factory=MarkerSettings)
    deny_list: DenyListSettings = Field(default_factory=DenyListSettings)
    # Fleet mode; in-memory state per process when unset.
    redis: RedisSettings | None = None
    backends: list[BackendConfig] = Field(min_length=1)
    # The kube-apiservers (clusters) this gateway serves, and each one's share of every
    # IdP (config/clusters.py). Empty: every caller is the cluster "default".
    clusters: list[ClusterSettings] = Field(default_factory=list, max_length=MAX_CLUSTERS)
    # The SubjectAccessReview webhook (docs/authorization.md); off when unset.
    authorization: AuthorizationSettings | None = None

    @model_validator(mode="after")
    def _secret_from_the_environment(self) -> GatewayConfig:
        # The secret itself, its previous secrets and every caller or admin token are
        # StrongSecret fields; this is the one that can also come from SECRET_ENV.
        if self.secret is None and SECRET_ENV in os.environ:
            weakness = secret_weakness(os.environ[SECRET_ENV])
            if weakness:
                # The secret keys the token ids in the logs (a weak one lets whoever reads
                # them test guessed LDAP passwords offline) and, with Redis, is all that
                # stops anyone who can write to Redis from planting identities.
                raise ValueError(f"secret (from {SECRET_ENV}): {weakness}")
        return self

    @model_validator(mode="after")
    def _previous_secrets_need_a_secret(self) -> GatewayConfig:
        if self.previous_secrets and self.secret is None and SECRET_ENV not in os.environ:
            raise ValueError(f"previous_secrets: needs secret (or {SECRET_ENV}) to be set")
        return self

    @model_validator(mode="after")
    def _fleet_needs_a_shared_secret(self) -> GatewayConfig:
        if self.redis is not None and self.secret is None and SECRET_ENV not in os.environ:
            raise ValueError(
                f"secret: required when redis is configured: every replica must use the "
                f"same secret for cache keys and entry signatures (or set {SECRET_ENV})"
            )
        return self

    @model_validator(mode="after")
    def _check_backends(self) -> GatewayConfig:
        names: set[str] = set()
        prefixes: set[str] = set()
        for i, backend in enumerate(self.backends):
            if backend.name in names:
                raise ValueError(f"backends[{i}].name: {backend.name!r} is used twice")
            names.add(backend.name)
            if backend.prefix is not None:
                if backend.prefix in prefixes:
                    raise ValueError(f"backends[{i}].prefix: {backend.prefix!r} is used twice")
                prefixes.add(backend.prefix)
            deadline = backend.timeouts.total_seconds
            if deadline >= self.review_deadline_seconds:
                raise ValueError(
                    f"backends[{i}].timeouts.total_seconds: must be below "
                    f"review_deadline_seconds ({self.review_deadline_seconds})"
                )
        return self

    @model_validator(mode="after")
    def _check_clusters(self) -> GatewayConfig:
        problem = cluster_problem(self.clusters, self.server, self.backends)
        if problem is not None:
            raise ValueError(problem)
        return self

    @model_validator(mode="after")
    def _one_path_each(self) -> GatewayConfig:
        if self.authorization is not None and self.authorization.path == self.server.review_path:
            raise ValueError("authorization.path: must differ from server.review_path")
        return self

    def cache_for(self, backend: BackendSettings) -> CacheSettings:
        return backend.cache if backend.cache is not None else self.cache
