"""Coalescing: concurrent misses of one cache key make one backend call.

The cache layer owns the flight (as kube-apiserver's cached token authenticator does):
a :class:`Coalescer` runs the call once per key and, while another process holds the
key (Redis lease), waits for that process's answer through ``recheck``.
"""

from __future__ import annotations

from typing import Protocol

from authn_gateway.layers.coalesce.memory import Call, LocalCoalescer, Recheck
from backends.base import Verdict
from backends.flight import SingleFlight

__all__ = ["Call", "Coalescer", "LocalCoalescer", "Recheck", "SingleFlight"]


class Coalescer(Protocol):
    async def do(self, key: bytes, call: Call, recheck: Recheck) -> Verdict:
        """``call()``'s answer, shared by every concurrent caller of ``key``;
        ``recheck()`` reads what another process answered for ``key`` meanwhile."""
        ...
