"""Helpers shared by the tiers of test_wire."""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from tests.support.fakes.raw import Behaviour, RawIdP

Serve = Callable[[Behaviour], Awaitable[RawIdP]]
