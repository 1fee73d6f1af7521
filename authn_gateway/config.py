"""The gateway's configuration: one YAML file, one typed schema.

:func:`load_config` validates everything at start-up and raises :class:`ConfigError`
whose lines name the file and the field, e.g.
``gateway.yaml: backends[1].timeouts.total_seconds: Input should be greater than 0``.
"""

from __future__ import annotations

import ipaddress
import os
from importlib import resources
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, Literal, Union

import yaml
from pydantic import Field, ValidationError, model_validator
from redis.connection import parse_url

from authn_gateway.secret_strength import StrongSecret, secret_weakness
from backends import load_builtin
from backends.registry import settings_types, type_names
from backends.settings import BackendSettings, CacheSettings, PositiveFloat, Rate, Secret, Strict

# Every backend type registers itself (backends.registry); the union follows.
load_builtin()
if TYPE_CHECKING:
    BackendConfig = BackendSettings
else:
    BackendConfig = Annotated[Union[settings_types()], Field(discriminator="type")]  # noqa: UP007
BACKEND_TYPES = type_names()

EMBEDDED_DEFAULT = "default.yaml"
SECRET_ENV = "AUTHN_GATEWAY_SECRET"


# Each one costs a Redis read per shared-tier miss while it is set.
MAX_PREVIOUS_SECRETS = 3


class ConfigError(Exception):
    """Invalid configuration. ``str()`` is one line per problem, never a secret value."""

    def __init__(self, source: str, problems: list[str]) -> None:
        self.source = source
        self.problems = problems
        super().__init__("\n".join(f"{source}: {p}" for p in problems))


class TLSSettings(Strict):
    """HTTPS for the review port. The files are re-read when they change (cert-manager)."""

    cert_file: Path
    key_file: Path
    # kube-apiserver speaks TLS 1.3; 1.2 stays allowed for older callers.
    min_version: Literal["1.2", "1.3"] = "1.2"
    # Mutual TLS: callers must present a certificate signed by this CA (PEM bundle).
    client_ca_file: Path | None = None
    # How often the files' modification times are checked.
    reload_interval_seconds: PositiveFloat = 10.0


class CallerToken(Strict):
    """A bearer token a caller may send (``users[].user.token`` in the webhook kubeconfig)."""

    # Names the caller in logs, the audit log and the per-caller limit.
    name: Annotated[str, Field(min_length=1, max_length=63, pattern=r"^[A-Za-z0-9][\w.:-]*$")]
    # Generated, like the gateway secret: 32 random bytes (secret_strength.py).
    token: StrongSecret


class OpsListenerSettings(Strict):
    """A second, plain-HTTP listener for /healthz, /readyz, /metrics and /admin."""

    # Empty: the review port's host.
    host: str = ""
    port: int = Field(ge=0, le=65535)


class ServerSettings(Strict):
    host: str = "127.0.0.1"
    port: int = Field(default=8080, ge=0, le=65535)
    # kube-apiserver calls this path with ?timeout=30s appended.
    review_path: str = Field(default="/authenticate", pattern=r"^/[^?#]*$")
    max_body_bytes: int = Field(default=64 * 1024, ge=1024, le=16 * 1024 * 1024)
    # Request line plus headers; larger gets 431 and the connection is closed.
    max_header_bytes: int = Field(default=16 * 1024, ge=1024, le=1024 * 1024)
    max_headers: int = Field(default=64, ge=8, le=1024)
    # A connection must deliver a complete request head within this (from connecting,
    # or from the first byte of a later request on a kept-alive connection), and
    # finish a TLS handshake within it; else it is closed (408 when a head was begun).
    header_timeout_seconds: PositiveFloat = 10.0
    # The body must be complete within this after its head.
    body_timeout_seconds: PositiveFloat = 10.0
    # Answers that wait unsent this long (a client that stopped reading them) end the
    # connection; until they are sent nothing more is read from it (docs/operations.md).
    send_timeout_seconds: PositiveFloat = 10.0
    # Open connections per process; beyond it new ones are closed at once and counted
    # (authn_gateway_connections_refused_total) while established ones keep working.
    # A connection holds under 200 KiB of RSS whatever it sends, 300 over TLS
    # (docs/operations.md, "What one connection can cost"): 500 fit the pod's 512 MiB
    # beside a full cache; kube-apiserver needs a handful.
    max_connections: int = Field(default=500, ge=1, le=100_000)
    # Drain in-flight reviews this long on SIGTERM before closing connections.
    graceful_shutdown_seconds: PositiveFloat = 10.0
    # On SIGTERM an idle kept-alive connection waits this long for one more request,
    # answered with "Connection: close", before it is closed (see docs/operations.md).
    drain_idle_seconds: PositiveFloat = 2.0
    # Unset: plain HTTP (the embedded demo default; never for production).
    tls: TLSSettings | None = None
    # Client-certificate identities (Common Name or DNS/URI SAN) that may call.
    # Empty: any certificate the client CA signed.
    allowed_subjects: list[str] = Field(default_factory=list)
    # Callers may authenticate with one of these instead of a client certificate.
    caller_tokens: list[CallerToken] = Field(default_factory=list)
    # Serve health, metrics and admin on their own port; the review port then serves
    # only the review path.
    ops: OpsListenerSettings | None = None
    # Processes sharing the review port (SO_REUSEPORT). In-memory state is per process;
    # see docs/operations.md. Worker i serves its metrics on ops.port + i.
    workers: int = Field(default=1, ge=1, le=64)
    # JSON-lines audit log of every decision: a file path, or "-" for stdout.
    audit_log: str | None = None

    @model_validator(mode="after")
    def _check_server(self) -> ServerSettings:
        for field, host in (("host", self.host), ("ops.host", self.ops.host if self.ops else "")):
            if host not in ("localhost", "") and not _is_ip(host):
                raise ValueError(f"{field}: {host!r} is not an IP address or 'localhost'")
        if self.allowed_subjects and (self.tls is None or self.tls.client_ca_file is None):
            raise ValueError("allowed_subjects: needs tls.client_ca_file (mutual TLS)")
        names = [t.name for t in self.caller_tokens]
        for name in names:
            if names.count(name) > 1:
                raise ValueError(f"caller_tokens: name {name!r} is used twice")
        if self.drain_idle_seconds >= self.graceful_shutdown_seconds:
            raise ValueError("drain_idle_seconds: must be below graceful_shutdown_seconds")
        if self.workers > 1 and self.ops is None:
            raise ValueError("workers: more than 1 needs ops (each worker has its own metrics)")
        if self.ops is not None and self.ops.port != 0:
            ops_ports = range(self.ops.port, self.ops.port + self.workers)
            if self.port in ops_ports:
                raise ValueError(f"ops.port: {self.ops.port} collides with port {self.port}")
        return self

    @property
    def callers_must_authenticate(self) -> bool:
        return bool(self.caller_tokens) or (
            self.tls is not None and self.tls.client_ca_file is not None
        )


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
    # Lines (review and process logs) waiting for stderr's reader. When it falls
    # behind and this fills, new lines are dropped and counted, never waited for.
    queue_lines: int = Field(default=10_000, ge=100, le=10_000_000)
    # Unavailable answers with the same backend and reason: the first in each window
    # is logged, the rest become one review_summary line with a count. 0: every line.
    outage_summary_seconds: float = Field(default=1.0, ge=0, le=3600)
    # The audit log's own queue (server.audit_log); every decision gets a line there.
    audit_queue_lines: int = Field(default=100_000, ge=100, le=10_000_000)


class ReadinessSettings(Strict):
    """/readyz of a cold pod: see authn_gateway/observe/readiness.py and docs/operations.md."""

    # Until every backend has answered once (a probe of a token no IdP knows), the pod
    # is not ready; after this long it is ready anyway. 0: ready at once.
    cold_start_grace_seconds: float = Field(default=120.0, ge=0, le=3600)


class CacheDefaults(CacheSettings):
    """Gateway-wide cache defaults; a backend's own ``cache:`` replaces them."""

    # Identities kept in each process (LRU among identities only).
    max_entries: int = Field(default=100_000, ge=1)
    # Refusals, in an LRU of their own: a flood of invalid tokens evicts only older
    # refusals, never an identity. With Redis, at most this many are shared per minute.
    max_negative_entries: int = Field(default=50_000, ge=1)
    # Identities of one user, in each process: past this, the user's own oldest goes.
    # One account minting token after token cannot push the other users out.
    max_entries_per_user: int = Field(default=1000, ge=1)


class InboundLimitSettings(Strict):
    """Per-caller limit on reviews, so one noisy client cannot starve the rest."""

    enabled: bool = True
    # A caller is its client-certificate identity, or else its source address.
    rate: Rate = 2000.0
    burst: int = Field(default=4000, ge=1)


class AdminSettings(Strict):
    """The admin API: breaker overrides, evictions and the deny list. Off by default."""

    enabled: bool = False
    # Callers must send "Authorization: Bearer <token>". Not read while disabled.
    # Generated, like the gateway secret: 32 random bytes (secret_strength.py).
    token: StrongSecret | None = None
    # A breaker override (force-open / force-closed) lasts this long unless the call
    # says otherwise ("seconds"); repeating the call renews it. At most max seconds.
    override_default_seconds: int = Field(default=3600, ge=1)
    override_max_seconds: int = Field(default=86400, ge=1)

    @model_validator(mode="before")
    @classmethod
    def _token_only_when_enabled(cls, data: object) -> object:
        # A disabled endpoint needs no token: its env:/file: reference is never resolved,
        # so the reference config checks on a laptop without the variable set.
        if isinstance(data, dict) and data.get("enabled") is not True and "token" in data:
            return {k: v for k, v in data.items() if k != "token"}
        return data

    @model_validator(mode="after")
    def _needs_token(self) -> AdminSettings:
        if self.enabled and self.token is None:
            raise ValueError("token: required when the admin endpoint is enabled")
        if self.override_default_seconds > self.override_max_seconds:
            raise ValueError("override_default_seconds: must not exceed override_max_seconds")
        return self


class MarkerSettings(Strict):
    """``user.extra`` keys on authenticated answers, for authorizers and admission.

    ``<prefix>backend``: the backend that decided; ``<prefix>stale``: ["true"] when the
    identity was served from cache because its IdP could not answer. Keys a backend
    returned under the prefix are dropped. Both off: extra is passed through as is.
    """

    prefix: str = Field(
        default="authn-gateway.io/", pattern=r"^[a-z0-9]([a-z0-9.-]*[a-z0-9])?(/[a-z0-9.-]*)?/$"
    )
    stale: bool = True
    backend: bool = True


class DenyListSettings(Strict):
    """Where the deny list lives without Redis (with Redis it is in Redis)."""

    # A JSON file written atomically, mode 0600. Unset and no Redis: memory only, and
    # a denial ends with the process (the admin answers say "stored_in": "memory").
    file: Path | None = None
    # How often each replica (or worker) reads the list again; changes made through
    # another replica's admin API arrive at once over Redis, and by then without it.
    sync_seconds: PositiveFloat = 1.0
    # The longest denial one request may set.
    max_seconds: int = Field(default=30 * 86400, ge=1)


class RedisSettings(Strict):
    """Fleet mode: replicas share cache, breaker state, buckets and coalescing leases."""

    # redis://, rediss:// (TLS) or unix:// URL. Credentials may be in the URL.
    url: str | None = Field(default=None, pattern=r"^(redis|rediss|unix)://")
    # Sentinel instead of url: "host:port" of each sentinel, and the master's name.
    sentinels: list[str] = Field(default_factory=list)
    sentinel_master: str = "mymaster"
    # Redis Cluster: url names one node; the client discovers the rest.
    cluster: bool = False
    password: Secret | None = None
    key_prefix: str = Field(default="authn-gw", pattern=r"^[A-Za-z0-9:_-]+$")
    # Every Redis call's deadline. Past it that call uses local state. Measured from the
    # gateway under load on a shared 2-core host: p99 5-50 ms at load average ~4, with a
    # few calls per run past 0.1 s (docs/benchmarks.md, "Fleet guarantees"); one late
    # answer is a busy host or Redis, not a dead one.
    timeout_seconds: PositiveFloat = 0.25
    # Late answers in a row that switch the replica to local mode (a refused or reset
    # connection switches it at once).
    slow_calls_to_local: int = Field(default=3, ge=1)
    # While Redis is unreachable, how often to try it again.
    retry_seconds: PositiveFloat = 1.0
    # Breaker transitions are published (pub/sub) and adopted within milliseconds; this
    # poll is only the safety net for a message lost while the subscriber reconnects.
    breaker_sync_seconds: PositiveFloat = 1.0
    # While Redis is down each replica runs on 1/n of the fleet's bucket, failures to open
    # and in-flight ceiling: n is the larger of this and the replicas seen heartbeating
    # in Redis in the last 15 s (a replica that never reached Redis knows only this).
    expected_replicas: int = Field(default=3, ge=1)
    # Longest a replica waits for another replica's call on the same cold token.
    coalesce_wait_seconds: PositiveFloat = 3.0
    # When Redis answers again (it may have come back empty), each replica writes its
    # live local identities back, at most this many per second, most recently used
    # first, never over an entry Redis holds. 500/s: 100 000 identities in 200 s, for
    # about half the client CPU of 500 cache writes a second (docs/decisions.md).
    write_back_per_second: int = Field(default=500, ge=1, le=100_000)
    # How often each replica counts the identities in Redis
    # (authn_gateway_shared_cache_identities). An emptied Redis is noticed apart from
    # this, every second (cache/repair.py).
    count_shared_seconds: PositiveFloat = 15.0

    @model_validator(mode="after")
    def _one_target(self) -> RedisSettings:
        if (self.url is None) == (not self.sentinels):
            raise ValueError("set exactly one of url or sentinels")
        if self.url is not None:
            try:
                parse_url(self.url)  # type: ignore[no-untyped-call]
            except ValueError:
                # redis' own parser, as serve uses it; its message may quote a password.
                raise ValueError(
                    "url: not a valid Redis URL (check the port and database)"
                ) from None
        for i, sentinel in enumerate(self.sentinels):
            host, _, port = sentinel.rpartition(":")
            if not host or not port.isdigit() or not 0 < int(port) < 65536:
                raise ValueError(f"sentinels[{i}]: must be host:port")
        if self.cluster and self.sentinels:
            raise ValueError("cluster: cannot be combined with sentinels")
        return self


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
    review_deadline_seconds: PositiveFloat = 5.0
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

    def cache_for(self, backend: BackendSettings) -> CacheSettings:
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


class DuplicateKey(yaml.YAMLError):
    def __init__(self, message: str, mark: yaml.Mark) -> None:
        super().__init__(message)
        self.problem = message
        self.problem_mark = mark


class _UniqueKeyLoader(yaml.SafeLoader):
    """safe_load, except that a key given twice in one mapping is an error."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        first: dict[Any, int] = {}
        for key_node, _ in node.value:
            if key_node.tag == "tag:yaml.org,2002:merge":
                continue
            key = self.construct_object(key_node, deep=deep)  # type: ignore[no-untyped-call]
            line = key_node.start_mark.line + 1
            if isinstance(key, str | int | float | bool) and key in first:
                raise DuplicateKey(
                    f"key {key!r} given twice: at line {first[key]} and line {line}",
                    key_node.start_mark,
                )
            first[key] = line
        return super().construct_mapping(node, deep)  # type: ignore[no-untyped-call,no-any-return]


def _yaml_problem(exc: yaml.YAMLError) -> str:
    """The YAML error without the text it stumbled on (that may be a secret)."""
    mark = getattr(exc, "problem_mark", None)
    where = f"line {mark.line + 1}, column {mark.column + 1}: " if mark is not None else ""
    if isinstance(exc, DuplicateKey):
        return f"{where.split(',')[0]}: {exc.problem}" if where else str(exc.problem)
    problem = str(getattr(exc, "problem", None) or "invalid YAML")
    if "alias" in problem:
        problem = "undefined alias: quote a value that starts with '*'"
    elif "tag" in problem:
        problem = "unknown tag: quote a value that starts with '!'"
    elif "'" in problem or '"' in problem:
        # PyYAML quotes the offending text; it may be part of a secret.
        problem = "invalid YAML here (check the quoting)"
    return f"{where}{problem}"


def parse_config(text: str, source: str) -> GatewayConfig:
    try:
        data = yaml.load(text, Loader=_UniqueKeyLoader)  # noqa: S506 - a SafeLoader
    except yaml.YAMLError as exc:
        raise ConfigError(source, [_yaml_problem(exc)]) from None
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
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise ConfigError(str(path), [f"cannot read: {exc.strerror}"]) from None
    except UnicodeDecodeError as exc:
        raise ConfigError(str(path), [f"not UTF-8 text (byte {exc.start})"]) from None
    return parse_config(text, str(path))
