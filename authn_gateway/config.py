"""The gateway's configuration: one YAML file, one typed schema.

:func:`load_config` validates everything at start-up and raises :class:`ConfigError`
whose lines name the file and the field, e.g.
``gateway.yaml: backends[1].timeouts.total_seconds: Input should be greater than 0``.
"""

from __future__ import annotations

import ipaddress
from importlib import resources
from pathlib import Path
from typing import Annotated, Any, Literal

import yaml
from pydantic import Field, ValidationError, model_validator

from backends.static import StaticSettings
from backends.userinfo import UserinfoSettings

from .settings import CacheSettings, PositiveFloat, Rate, Secret, Strict

BackendConfig = Annotated[
    StaticSettings | UserinfoSettings,
    Field(discriminator="type"),
]
BACKEND_TYPES = ("static", "userinfo")

EMBEDDED_DEFAULT = "default.yaml"


class ConfigError(Exception):
    """Invalid configuration. ``str()`` is one line per problem, never a secret value."""

    def __init__(self, source: str, problems: list[str]) -> None:
        self.source = source
        self.problems = problems
        super().__init__("\n".join(f"{source}: {p}" for p in problems))


class ServerSettings(Strict):
    host: str = "127.0.0.1"
    port: int = Field(default=8080, ge=0, le=65535)
    # kube-apiserver calls this path with ?timeout=30s appended.
    review_path: str = Field(default="/authenticate", pattern=r"^/[^?#]*$")
    max_body_bytes: int = Field(default=64 * 1024, ge=1024, le=16 * 1024 * 1024)
    # Drain in-flight reviews this long on SIGTERM before closing connections.
    graceful_shutdown_seconds: PositiveFloat = 10.0

    @model_validator(mode="after")
    def _check_host(self) -> ServerSettings:
        if self.host not in ("localhost", "") and not _is_ip(self.host):
            raise ValueError(f"host: {self.host!r} is not an IP address or 'localhost'")
        return self


def _is_ip(value: str) -> bool:
    try:
        ipaddress.ip_address(value)
    except ValueError:
        return False
    return True


class LoggingSettings(Strict):
    level: Literal["debug", "info", "warning", "error"] = "info"
    format: Literal["text", "json"] = "text"
    # One line per review (outcome, backend, latency, token hash prefix).
    reviews: bool = True


class CacheDefaults(CacheSettings):
    """Gateway-wide cache defaults; a backend's own ``cache:`` replaces them."""

    max_entries: int = Field(default=100_000, ge=1)


class InboundLimitSettings(Strict):
    """Per-caller limit on reviews, so one noisy client cannot starve the rest."""

    enabled: bool = True
    # A caller is its client-certificate identity, or else its source address.
    rate: Rate = 2000.0
    burst: int = Field(default=4000, ge=1)


class AdminSettings(Strict):
    """Breaker overrides over HTTP (force open/closed, release). Off by default."""

    enabled: bool = False
    # Callers must send "Authorization: Bearer <token>".
    token: Secret | None = None

    @model_validator(mode="after")
    def _needs_token(self) -> AdminSettings:
        if self.enabled and self.token is None:
            raise ValueError("token: required when the admin endpoint is enabled")
        return self


class GatewayConfig(Strict):
    # HMAC key for cache keys and token hash prefixes. Random per process when unset.
    secret: Secret | None = None
    server: ServerSettings = Field(default_factory=ServerSettings)
    logging: LoggingSettings = Field(default_factory=LoggingSettings)
    # Audiences this gateway's tokens are valid for (a backend may override).
    audiences: list[str] = Field(default_factory=list)
    # Every review is answered within this, whatever the backends do.
    review_deadline_seconds: PositiveFloat = 5.0
    cache: CacheDefaults = Field(default_factory=CacheDefaults)
    inbound_limit: InboundLimitSettings = Field(default_factory=InboundLimitSettings)
    admin: AdminSettings = Field(default_factory=AdminSettings)
    # Rejects Kubernetes service-account JWTs locally; kube-apiserver checks those itself.
    reject_service_account_tokens: bool = True
    backends: list[BackendConfig] = Field(min_length=1)

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

    def cache_for(self, backend: Any) -> CacheSettings:
        return backend.cache if backend.cache is not None else self.cache


def _field_path(loc: tuple[int | str, ...]) -> str:
    parts: list[str] = []
    for i, item in enumerate(loc):
        if isinstance(item, int):
            if parts:
                parts[-1] += f"[{item}]"
            else:
                parts.append(f"[{item}]")
            continue
        # Discriminated unions add the type tag to the location; it is noise to a reader.
        if i > 0 and isinstance(loc[i - 1], int) and item in BACKEND_TYPES:
            continue
        parts.append(str(item))
    return ".".join(parts)


def _format_errors(exc: ValidationError) -> list[str]:
    problems = []
    for err in exc.errors(include_input=False, include_url=False):
        path = _field_path(tuple(err["loc"]))
        msg = err["msg"].removeprefix("Value error, ")
        problems.append(f"{path}: {msg}" if path else msg)
    return problems


def parse_config(text: str, source: str) -> GatewayConfig:
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f"line {mark.line + 1}: " if mark is not None else ""
        problem = getattr(exc, "problem", None) or "invalid YAML"
        raise ConfigError(source, [f"{where}{problem}"]) from None
    if not isinstance(data, dict):
        raise ConfigError(source, ["top level must be a mapping"])
    try:
        return GatewayConfig.model_validate(data)
    except ValidationError as exc:
        raise ConfigError(source, _format_errors(exc)) from None


def load_config(path: Path | None) -> GatewayConfig:
    """Load and validate ``path``, or the embedded default when ``path`` is None."""
    if path is None:
        text = resources.files("authn_gateway").joinpath(EMBEDDED_DEFAULT).read_text()
        return parse_config(text, f"<embedded {EMBEDDED_DEFAULT}>")
    try:
        text = path.read_text()
    except OSError as exc:
        raise ConfigError(str(path), [f"cannot read: {exc.strerror}"]) from None
    return parse_config(text, str(path))
