"""Operator actions announced to every replica: evict, deny, lift.

The replica that takes an action applies it itself, then publishes it; the others
apply it when they receive it. The Redis version (:class:`.redis.RedisBus`) is a
stream, so a replica that lost Redis for a moment reads what it missed.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Literal, Protocol

from authn_gateway.revocation.subject import Subject

Op = Literal["evict", "deny", "lift"]
OPS: tuple[Op, ...] = ("evict", "deny", "lift")


@dataclass(frozen=True, slots=True)
class Event:
    op: Op
    subject: Subject
    # The replica that took the action (it does not apply its own event twice).
    origin: str


Handler = Callable[[Event], Awaitable[None]]


class Bus(Protocol):
    #: Whether events reach other replicas at all.
    fleet: bool

    def subscribe(self, handler: Handler) -> None: ...

    async def publish(self, event: Event) -> bool:
        """Announce ``event``; whether it reached the fleet."""
        ...

    async def start(self) -> None: ...

    async def close(self) -> None: ...
