"""Optional audit log: one JSON line per decision, to a file or stdout.

It answers "who asked about which token, and what were they told" after the fact:
time, caller, backend, outcome, username, groups, the keyed-hash prefix of the
token (never the token) and whether a stale identity was served. Every decision gets
its line (no summaries), through a queue of its own (:mod:`authn_gateway.observe.logsink`),
with its own bound: a slow reader costs dropped, counted lines, never a waiting review.
Each operator action through the admin API is a line too (``"msg": "admin"``).
"""

from __future__ import annotations

import time
from typing import Any

import orjson

from authn_gateway.observe.logsink import sink_for
from backends.base import Authenticated, Outcome, Rejected
from backends.files import shown

DEFAULT_QUEUE_LINES = 100_000


class AuditLog:
    def __init__(self, destination: str, queue_lines: int = DEFAULT_QUEUE_LINES) -> None:
        """``destination``: a file path, or "-" for stdout. A file that cannot be
        opened (a FIFO no one reads, a directory) raises OSError naming the field."""
        self.destination = destination
        try:
            self.sink = sink_for(destination, queue_lines)
        except OSError as exc:
            why = f"cannot open {shown(destination)}: {exc.strerror or type(exc).__name__}"
            raise OSError(exc.errno, f"server.audit_log: {why}") from None

    def write(
        self,
        *,
        caller: str,
        backend: str,
        answer: str,
        outcome: Outcome,
        token_id: str,
        stale: bool,
        cluster: str | None = None,
    ) -> None:
        """One decision. ``cluster``: the caller's, when clusters are configured."""
        user = outcome.user if isinstance(outcome, Authenticated) else None
        # A refused user is named when a backend named them (the deny list's refusals).
        refused = outcome.username if isinstance(outcome, Rejected) else None
        doc = {
            "time": round(time.time(), 3),
            "msg": "audit",
            "caller": caller,
            "backend": backend,
            "outcome": answer,
            "username": user.username if user else refused,
            "groups": list(user.groups) if user else None,
            "token": token_id,
            "stale": stale,
        }
        if cluster is not None:
            doc["cluster"] = cluster
        self.sink.put(orjson.dumps(doc).decode(), "audit")

    def action(
        self,
        *,
        caller: str,
        operator: str | None,
        action: str,
        subject: dict[str, str] | None,
        result: dict[str, Any],
    ) -> None:
        """An operator's admin action (evict, deny, lift): who, from where, on whom, and
        what the gateway did. ``operator`` is the name the caller gave, not verified: the
        admin token is one shared secret."""
        doc = {
            "time": round(time.time(), 3),
            "msg": "admin",
            "caller": caller,
            "operator": operator,
            "action": action,
            "subject": subject,
            "result": result,
        }
        self.sink.put(orjson.dumps(doc).decode(), "audit")

    def close(self) -> None:
        """Wake the writer; the sink itself lives on (a reload reuses it)."""
        self.sink.wake()
