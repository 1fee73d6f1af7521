"""The deny list: usernames, token ids and credential ids an operator refuses for a while.

The break-glass for a compromised account during an IdP outage: a denied subject is
refused whatever the IdP or the cache says. Every replica checks a local copy on
each review (a dict lookup, nothing when the list is empty); the copy is refreshed
from the store every ``sync_seconds`` and at once when another replica announces a
change. Where the entries live is a :class:`DenyStore`: Redis for a fleet
(:mod:`.redis`), a file or memory for one replica (:mod:`.memory`).

Times are Unix wall-clock seconds: entries outlive processes and move between them.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

from authn_gateway.revocation.subject import BadSubject, Subject
from backends.base import UserInfo

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class DenyEntry:
    subject: Subject
    # Refused until then (wall clock).
    until: float
    # Who set it (the admin caller) and when.
    by: str
    since: float

    def to_json(self) -> dict[str, Any]:
        return {
            "subject": self.subject.key,
            "until": self.until,
            "by": self.by,
            "since": self.since,
        }

    @classmethod
    def from_json(cls, doc: Any) -> DenyEntry:
        """Raises ValueError (or BadSubject) for a malformed document."""
        if not isinstance(doc, dict):
            raise ValueError("entry is not an object")
        return cls(
            Subject.from_key(str(doc["subject"])),
            float(doc["until"]),
            str(doc["by"]),
            float(doc["since"]),
        )

    def public(self, now: float) -> dict[str, Any]:
        """The entry as the admin API shows it."""
        return {
            **self.subject.to_json(),
            "until": round(self.until, 3),
            "seconds_left": max(0, round(self.until - now)),
            "by": self.by,
        }


class DenyStore(Protocol):
    #: "redis", "file" or "memory": where entries survive (shown in admin answers).
    where: str

    async def load(self) -> dict[Subject, DenyEntry] | None:
        """Every unexpired entry, or None when the store cannot be read right now."""
        ...

    async def save(self, entry: DenyEntry) -> bool:
        """Store one entry; False when the store could not be written (kept locally)."""
        ...

    async def remove(self, subject: Subject) -> bool | None:
        """Remove one entry: whether it was there, or None when the store is unreachable."""
        ...

    def emptied(self) -> bool:
        """Whether the store lost its entries since the previous load (a shared store
        emptied under the fleet); the list then writes its own live entries back."""
        ...


def parse_entries(docs: list[Any], now: float, source: str) -> dict[Subject, DenyEntry]:
    """Entries from stored documents: expired ones dropped, malformed ones logged and skipped."""
    entries: dict[Subject, DenyEntry] = {}
    for doc in docs:
        try:
            entry = DenyEntry.from_json(doc)
        except (ValueError, KeyError, TypeError, BadSubject):
            log.warning("deny list: skipped a malformed entry in %s", source)
            continue
        if entry.until > now:
            entries[entry.subject] = entry
    return entries


class DenyList:
    def __init__(self, store: DenyStore, clock: Callable[[], float] = time.time) -> None:
        self.store = store
        self._clock = clock
        self._entries: dict[Subject, DenyEntry] = {}
        # Changes the store did not take (Redis down), pushed again on each refresh.
        self._unsaved: dict[Subject, DenyEntry] = {}
        self._unremoved: set[Subject] = set()
        self._users: set[str] = set()
        self._tokens: set[str] = set()
        self._credentials: set[str] = set()

    # The review path: set lookups only, and nothing at all while the list is empty.

    def denies_token(self, token_ids: Callable[[], tuple[str, ...]]) -> bool:
        """Whether the token is denied under any of its ids, one per configured secret with
        the current one first (``TokenHasher.token_ids``); called only if any token is
        listed. A denial found under a previous secret's id is carried to the current
        id, so it outlives that secret (docs/operations.md, "Rotate the gateway secret")."""
        if not self._tokens:
            return False
        ids = token_ids()
        for i, value in enumerate(ids):
            entry = self._live_entry(Subject("token", value))
            if entry is not None:
                if i > 0:
                    self._carry(entry, Subject("token", ids[0]))
                return True
        return False

    def denies_credential(self, user: UserInfo) -> bool:
        """Whether any of the credential ids (kube's, ``JTI=...``) an answer carries is
        denied; its extra is read only if any credential is listed."""
        return bool(self._credentials) and any(
            c in self._credentials and self._live(Subject("credential", c))
            for c in user.credential_ids
        )

    def denies_user(self, username: str) -> bool:
        return (
            bool(self._users) and username in self._users and self._live(Subject("user", username))
        )

    def _live(self, subject: Subject) -> bool:
        return self._live_entry(subject) is not None

    def _live_entry(self, subject: Subject) -> DenyEntry | None:
        entry = self._entries.get(subject)
        if entry is None:
            return None
        if entry.until > self._clock():
            return entry
        self._set(dict(self._entries), drop=subject)  # expired: lifted by time
        return None

    def _carry(self, entry: DenyEntry, current: Subject) -> None:
        """Deny ``current`` (the same token's id under the current secret) until ``entry``
        ends: in force here at once, in the store from the next refresh on (the review
        path does not wait for a store)."""
        if current in self._entries:
            return
        carried = DenyEntry(current, entry.until, entry.by, entry.since)
        entries = dict(self._entries)
        entries[current] = carried
        self._set(entries)
        self._unsaved[current] = carried
        log.warning("deny list: a denied token's id under the current secret is denied too")

    # Operator actions.

    async def add(self, subject: Subject, seconds: float, by: str) -> tuple[DenyEntry, bool]:
        """Deny ``subject`` for ``seconds``; returns the entry and whether the store has it."""
        now = self._clock()
        entry = DenyEntry(subject, now + seconds, by, now)
        entries = dict(self._entries)
        entries[subject] = entry
        self._set(entries)
        self._unremoved.discard(subject)
        stored = await self.store.save(entry)
        if not stored:
            self._unsaved[subject] = entry
        return entry, stored

    async def lift(self, subject: Subject) -> tuple[bool, bool]:
        """Lift ``subject``; returns (whether it was denied, whether the store has the change)."""
        was_local = self._live(subject)
        self._set(dict(self._entries), drop=subject)
        self._unsaved.pop(subject, None)
        removed = await self.store.remove(subject)
        if removed is None:
            self._unremoved.add(subject)
            return was_local, False
        return was_local or removed, True

    def entries(self) -> list[DenyEntry]:
        now = self._clock()
        return sorted(
            (e for e in self._entries.values() if e.until > now), key=lambda e: e.subject.key
        )

    def carry_from(self, running: DenyList) -> None:
        """A reload: start from what the running list knows, its changes not yet stored
        included, so that a reload while the store cannot be read forgets no denial
        (issue 32: one during a Redis outage served a denied user until Redis answered)."""
        self._set(dict(running._entries))
        self._unsaved = dict(running._unsaved)
        self._unremoved = set(running._unremoved)

    async def refresh(self) -> None:
        """Read the store again (periodically, and when another replica announced a change)."""
        for subject in list(self._unremoved):
            if await self.store.remove(subject) is not None:
                self._unremoved.discard(subject)
        for subject, entry in list(self._unsaved.items()):
            if await self.store.save(entry):
                del self._unsaved[subject]
        loaded = await self.store.load()
        if loaded is None:
            return  # unreachable: keep the copy we have
        if self.store.emptied():
            # Redis lost the list (FLUSHALL, a restart without persistence): a denial must
            # not be lifted by that. What this replica knows goes back (issue 32).
            now = self._clock()
            back = {s: e for s, e in self._entries.items() if e.until > now and s not in loaded}
            log.warning(
                "deny list: the store lost its entries; writing back %d live ones", len(back)
            )
            for subject, entry in back.items():
                if not await self.store.save(entry):
                    self._unsaved[subject] = entry
            loaded.update(back)
        for subject in self._unremoved:
            loaded.pop(subject, None)
        loaded.update(self._unsaved)
        self._set(loaded)

    def _set(self, entries: dict[Subject, DenyEntry], drop: Subject | None = None) -> None:
        if drop is not None:
            entries.pop(drop, None)
        self._entries = entries
        self._users = {s.value for s in entries if s.kind == "user"}
        self._tokens = {s.value for s in entries if s.kind == "token"}
        self._credentials = {s.value for s in entries if s.kind == "credential"}
