"""The base of every resilience layer: it wraps one authenticator and is one."""

from __future__ import annotations

from collections.abc import Callable

from backends.base import Authenticator


class Layer:
    name: str
    could_accept: Callable[[str], bool]

    def __init__(self, inner: Authenticator) -> None:
        self.inner = inner
        self.name = inner.name
        # The cheap pre-check passes straight through: one lookup, not a call per layer.
        self.could_accept = inner.could_accept
