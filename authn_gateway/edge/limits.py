"""One listener's bounds and counts: what the protocol enforces, and what it refused."""

from __future__ import annotations

import logging
import ssl
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from authn_gateway.edge.handshake import HANDSHAKE_REASONS
from authn_gateway.edge.ratelog import RateLimitedLog
from authn_gateway.observe.internal_errors import internal_error

# Handshake failures are logged under the edge's own name (authn_gateway.edge).
log = logging.getLogger(__package__)


class _Uncounted:
    def internal_error(self, where: str, error: str) -> None:
        pass


def _log_internal_error(exc: BaseException) -> None:
    internal_error("edge", exc, _Uncounted())


@dataclass
class EdgeStats:
    """Counters of what the edge refused or cut off; exported by :mod:`.metrics`."""

    open_connections: int = 0
    refused_connections: int = 0
    timeouts: dict[str, int] = field(default_factory=lambda: {"head": 0, "body": 0, "send": 0})
    handshake_failures: dict[str, int] = field(
        default_factory=lambda: dict.fromkeys(HANDSHAKE_REASONS, 0)
    )
    lingering_closes: int = 0


@dataclass
class EdgeLimits:
    """One listener's bounds; ``tls_context`` is read at each handshake (reloads)."""

    max_header_bytes: int = 16 * 1024
    max_headers: int = 64
    max_connections: int = 1000
    header_timeout: float = 10.0
    body_timeout: float = 10.0
    drain_idle_seconds: float = 2.0
    # A connection whose answers wait unsent (over the transport's high-water mark, or
    # behind a close) this long is cut off: a client that stops reading holds nothing.
    send_timeout: float = 10.0
    # Lingering close: read and discard at most this much, for at most this long.
    linger_seconds: float = 5.0
    linger_bytes: int = 1024 * 1024
    tls_context: Callable[[], ssl.SSLContext] | None = None
    #: ``(scope, body) -> answer body | None``: a 200 JSON answer made without awaiting
    #: anything (a cache hit), or None for the ASGI path. Side-effect free when None.
    answer_at_once: Callable[[dict[str, Any], bytes], bytes | None] | None = None
    #: An exception of ours while answering (logged once per kind, counted, never with
    #: its message); the server counts it in the current gateway's metrics.
    report_error: Callable[[BaseException], None] = _log_internal_error
    stats: EdgeStats = field(default_factory=EdgeStats)
    # Set by the first connection told to drain: later handshakes finish into a drain.
    draining: bool = False
    handshake_log: RateLimitedLog = field(default_factory=lambda: RateLimitedLog(log))
