"""Optional audit log: one JSON line per decision, to a file or stdout.

It answers "who asked about which token, and what were they told" after the fact:
time, caller, backend, outcome, username, groups, the keyed-hash prefix of the
token (never the token) and whether a stale identity was served. Every decision gets
its line (no summaries), through a queue of its own (:mod:`authn_gateway.logsink`),
with its own bound: a slow reader costs dropped, counted lines, never a waiting review.
"""

from __future__ import annotations

import time

import orjson

from backends.base import Authenticated, Outcome

from .logsink import sink_for

DEFAULT_QUEUE_LINES = 100_000


class AuditLog:
    def __init__(self, destination: str, queue_lines: int = DEFAULT_QUEUE_LINES) -> None:
        """``destination``: a file path, or "-" for stdout. A file that cannot be
        opened raises OSError."""
        self.destination = destination
        self.sink = sink_for(destination, queue_lines)

    def write(
        self,
        *,
        caller: str,
        backend: str,
        answer: str,
        outcome: Outcome,
        token_id: str,
        stale: bool,
    ) -> None:
        user = outcome.user if isinstance(outcome, Authenticated) else None
        doc = {
            "time": round(time.time(), 3),
            "msg": "audit",
            "caller": caller,
            "backend": backend,
            "outcome": answer,
            "username": user.username if user else None,
            "groups": list(user.groups) if user else None,
            "token": token_id,
            "stale": stale,
        }
        self.sink.put(orjson.dumps(doc).decode(), "audit")

    def close(self) -> None:
        """Wake the writer; the sink itself lives on (a reload reuses it)."""
        self.sink.wake()
