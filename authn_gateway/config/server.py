"""The ``server:`` section: listeners, TLS, caller tokens, connection limits."""

from __future__ import annotations

import ipaddress
from pathlib import Path
from typing import Annotated, Literal

from pydantic import Field, field_validator, model_validator

from authn_gateway.secret_strength import StrongSecret
from backends.durations import HOUR, Interval, Timeout, count, finite
from backends.settings import FilePath, Strict, usable_path


class TLSSettings(Strict):
    """HTTPS for the review port. The files are re-read when they change (cert-manager)."""

    cert_file: FilePath
    key_file: FilePath
    # kube-apiserver speaks TLS 1.3; 1.2 stays allowed for older callers.
    min_version: Literal["1.2", "1.3"] = "1.2"
    # Mutual TLS: callers must present a certificate signed by this CA (PEM bundle).
    client_ca_file: FilePath | None = None
    # How often the files' modification times are checked.
    reload_interval_seconds: Interval = 10.0


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
    port: Annotated[int, count(ge=0, le=65535)]


class ServerSettings(Strict):
    host: str = "127.0.0.1"
    port: Annotated[int, count(ge=0, le=65535)] = 8080
    # kube-apiserver calls this path with ?timeout=30s appended.
    review_path: str = Field(default="/authenticate", pattern=r"^/[^?#]*$")
    max_body_bytes: Annotated[int, count(ge=1024, le=16 * 1024 * 1024)] = 64 * 1024
    # Request line plus headers; larger gets 431 and the connection is closed.
    max_header_bytes: Annotated[int, count(ge=1024, le=1024 * 1024)] = 16 * 1024
    max_headers: Annotated[int, count(ge=8, le=1024)] = 64
    # A connection must deliver a complete request head within this (from connecting,
    # or from the first byte of a later request on a kept-alive connection), and
    # finish a TLS handshake within it; else it is closed (408 when a head was begun).
    header_timeout_seconds: Timeout = 10.0
    # The body must be complete within this after its head.
    body_timeout_seconds: Timeout = 10.0
    # Answers that wait unsent this long (a client that stopped reading them) end the
    # connection; until they are sent nothing more is read from it (docs/operations.md).
    send_timeout_seconds: Timeout = 10.0
    # Open connections per process; beyond it new ones are closed at once and counted
    # (authn_gateway_connections_refused_total) while established ones keep working.
    # A connection holds under 200 KiB of RSS whatever it sends, 300 over TLS
    # (docs/operations.md, "What one connection can cost"): 500 fit the pod's 512 MiB
    # beside a full cache; kube-apiserver needs a handful.
    max_connections: Annotated[int, count(ge=1, le=100_000)] = 500
    # Drain in-flight reviews this long on SIGTERM before closing connections.
    graceful_shutdown_seconds: Annotated[float, finite(gt=0, le=HOUR)] = 10.0
    # On SIGTERM an idle kept-alive connection waits this long for one more request,
    # answered with "Connection: close", before it is closed (see docs/operations.md).
    drain_idle_seconds: Annotated[float, finite(gt=0, le=HOUR)] = 2.0
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
    workers: Annotated[int, count(ge=1, le=64)] = 1
    # JSON-lines audit log of every decision: a file path, or "-" for stdout.
    audit_log: str | None = None

    @field_validator("audit_log")
    @classmethod
    def _audit_log_is_a_file_name(cls, value: str | None) -> str | None:
        if value is not None and value != "-":
            usable_path(Path(value))
        return value

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
        # One token, one caller: two names for one secret would make the caller (and its
        # cluster, clusters:) whichever entry is compared first.
        secrets = [t.token.get_secret_value() for t in self.caller_tokens]
        for i, secret in enumerate(secrets):
            if secrets.index(secret) != i:
                raise ValueError(
                    f"caller_tokens[{i}].token: the same token as "
                    f"caller_tokens[{secrets.index(secret)}]'s; each caller needs its own"
                )
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
