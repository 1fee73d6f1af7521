"""Helpers shared by the tiers of test_revocation."""

from __future__ import annotations

import time

from authn_gateway.layers.cache.policy import CacheEntry
from authn_gateway.revocation import subject as subjects
from authn_gateway.revocation.subject import Subject
from backends.base import CREDENTIAL_ID_KEY, Authenticated, Rejected, UserInfo

ALICE = subjects.user("alice")

TOKEN = subjects.token_id("0123456789ab")

LEAKED = subjects.credential_id("JTI=7f3c2a-leaked")


class Clock:
    def __init__(self) -> None:
        self.now = 1_000_000.0

    def __call__(self) -> float:
        return self.now


class Tier:
    """A tier holding (username, token id) answers, counting what it dropped."""

    def __init__(self, *answers: tuple[str, str]) -> None:
        self.answers = list(answers)
        self.shared_calls = 0

    async def evict_local(self, subject: Subject) -> int:
        kept = [a for a in self.answers if not subject.matches(*a)]
        dropped = len(self.answers) - len(kept)
        self.answers = kept
        return dropped

    async def evict_shared(self, subject: Subject) -> int | None:
        self.shared_calls += 1
        return None


def entry(username: str | None, token_id: str, credential: str | None = None) -> CacheEntry:
    now = time.time()
    extra = {CREDENTIAL_ID_KEY: (credential,)} if credential else {}
    outcome = Authenticated(UserInfo(username, extra=extra)) if username else Rejected("invalid")
    return CacheEntry(outcome, now + 60, now + 600, token_id)
