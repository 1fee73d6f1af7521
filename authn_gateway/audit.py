"""Optional audit log: one JSON line per decision, to a file or stdout.

It answers "who asked about which token, and what were they told" after the fact:
time, caller, backend, outcome, username, groups, the keyed-hash prefix of the
token (never the token) and whether a stale identity was served; and each operator
action through the admin API (``"msg": "admin"``). Lines are written
in batches by the event loop, like the review log.
"""

from __future__ import annotations

import sys
import time
from typing import IO, Any

import orjson

from backends.base import Authenticated, Outcome

from .reviewlog import BatchedWriter


class AuditLog:
    def __init__(self, destination: str) -> None:
        self.destination = destination
        self._file: IO[str] | None = None
        if destination == "-":
            stream: IO[str] = sys.stdout
        else:
            # Line-buffering is not needed: ReviewLog flushes each batch.
            self._file = stream = open(destination, "a", encoding="utf-8")  # noqa: SIM115
        self._log = BatchedWriter(stream)

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
        self._log.append(orjson.dumps(doc).decode())

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
        self._log.append(orjson.dumps(doc).decode())

    def close(self) -> None:
        self._log.flush()
        if self._file is not None:
            self._file.close()
