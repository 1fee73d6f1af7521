"""The fake IdP (tests/support/fakes/idp.py), keeping a record of every call it received.

The invariants about the IdP are checked on these records, never on the gateways'
metrics: when a call arrived, when it was answered (None while it hangs), its status,
and whose token it carried (the name in ``good-<name>~...``; never the token).
"""

from __future__ import annotations

import asyncio
import threading
import time
from dataclasses import dataclass

from tests.support.fakes.idp import FakeIdP

# The readiness probe's token shape (authn_gateway/observe/readiness.py): a Fernet-like string.
PROBE_PREFIX = "gAAAAA"


@dataclass
class Call:
    arrived: float  # time.monotonic()
    ended: float | None
    status: int | None
    user: str | None  # None: junk (or a probe)
    probe: bool


class RecordingIdP(FakeIdP):
    def __init__(self) -> None:
        super().__init__()
        self.calls_seen: list[Call] = []
        self._records = threading.Lock()
        # Calls in service, held: a hung call waits on an event nothing else refers to,
        # and once its connection is gone the collector would destroy it mid-wait
        # ("Task was destroyed but it is pending"); stop() cancels them.
        self._serving: set[asyncio.Task[object]] = set()

    async def _answer_served(
        self, method: str, target: str, headers: dict[str, str], body: bytes
    ) -> tuple[int, dict[str, str], bytes, bool]:
        auth = headers.get("authorization", "")
        token = auth[7:] if auth.startswith("Bearer ") else ""
        user = token[5:].split("~", 1)[0] if token.startswith("good-") else None
        call = Call(time.monotonic(), None, None, user, token.startswith(PROBE_PREFIX))
        with self._records:
            self.calls_seen.append(call)
        status: int | None = None
        task = asyncio.current_task()
        if task is not None:
            self._serving.add(task)
        try:
            status, hdrs, out, served = await super()._answer_served(method, target, headers, body)
            return status, hdrs, out, served
        finally:
            call.ended, call.status = time.monotonic(), status
            self._serving.discard(task)

    def records(self) -> list[Call]:
        with self._records:
            return list(self.calls_seen)
