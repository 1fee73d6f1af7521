"""The jwt backend in process, against the fake issuer over real TLS sockets.

For tests of one decision at a time (a claim rule, a key, a Retry-After) that need
the real key fetch but not a gateway process: ``jwt_settings`` builds the entry,
``running`` starts the backend (its first key fetch included) and closes it after;
``InThread`` does the same on a loop of its own, for synchronous (hypothesis) tests.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import AsyncIterator, Coroutine
from typing import Any, TypeVar

from backends.base import Outcome
from backends.jwt import JWTBackend, JWTSettings
from tests.support.fakes.issuer import FakeIssuer

T = TypeVar("T")


def jwt_settings(
    issuer: FakeIssuer, issuer_fields: dict[str, Any] | None = None, **overrides: Any
) -> JWTSettings:
    """A kube ``jwt`` entry for ``issuer``: audience "gateway", username from ``sub``;
    ``issuer_fields`` go into its ``issuer:`` block, ``overrides`` at the top."""
    entry: dict[str, Any] = {
        "name": "oidc",
        "type": "jwt",
        "issuer": {
            "url": issuer.issuer,
            "certificateAuthority": issuer.ca_pem,
            "audiences": ["gateway"],
            **(issuer_fields or {}),
        },
        "claimMappings": {"username": {"claim": "sub", "prefix": ""}},
        "timeouts": {"connect_seconds": 0.5, "read_seconds": 1.0, "total_seconds": 1.0},
    }
    entry.update(overrides)
    return JWTSettings.model_validate(entry)


@contextlib.asynccontextmanager
async def running(settings: JWTSettings) -> AsyncIterator[JWTBackend]:
    backend = JWTBackend(settings)
    try:
        await backend.start()
        yield backend
    finally:
        await backend.close()


class InThread:
    """A started backend on an event loop of its own thread, for sync callers such as
    hypothesis tests: ``call(token)`` is one ``authenticate`` on that loop."""

    def __init__(self, settings: JWTSettings) -> None:
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True)
        self._thread.start()
        self.backend = JWTBackend(settings)
        self._run(self.backend.start())

    def _run(self, coro: Coroutine[Any, Any, T]) -> T:
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result(timeout=30)

    def call(self, token: str) -> Outcome:
        return self._run(self.backend.authenticate(token))

    def close(self) -> None:
        self._run(self.backend.close())
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=10)
        self._loop.close()
