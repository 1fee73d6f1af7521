"""A backend that answers from a script, for tests of what is above the backends (the
pipeline, routing, clusters); it counts the tokens it saw."""

from __future__ import annotations

import asyncio

from backends.base import Backend, Outcome
from backends.context import WireTime


class Scripted(Backend):
    """Answers ``answer`` after ``delay`` seconds; ``seen`` holds every token asked."""

    kind = "scripted"

    def __init__(self, name: str, answer: Outcome, delay: float = 0.0) -> None:
        super().__init__(name)
        self.answer = answer
        self.delay = delay
        self.seen: list[str] = []

    async def authenticate(self, token: str, wire: WireTime | None = None) -> Outcome:
        self.seen.append(token)
        if self.delay:
            await asyncio.sleep(self.delay)
        return self.answer
