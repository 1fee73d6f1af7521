"""One replica's revocation state: the deny list in a file (or memory), and a local bus.

The file is the deny list's home when there is no Redis, so a denial survives a
restart. It is written whole and atomically (temporary file, fsync, rename) with
mode 0600, and read again when its modification time or size changes, so worker
processes sharing it see each other's changes on their next refresh.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import orjson

from authn_gateway.revocation.bus import Event, Handler
from authn_gateway.revocation.denylist import DenyEntry, parse_entries
from authn_gateway.revocation.subject import Subject
from backends.files import DENY_LIST_BYTES, FileRefused, read_file

log = logging.getLogger(__name__)


class MemoryDenyStore:
    """Entries in this process only: they end with it. Used when no file is configured."""

    where = "memory"

    def __init__(self, clock: Callable[[], float] = time.time) -> None:
        self._clock = clock
        self._entries: dict[Subject, DenyEntry] = {}

    def emptied(self) -> bool:
        return False  # only this process writes it

    async def load(self) -> dict[Subject, DenyEntry] | None:
        now = self._clock()
        return {s: e for s, e in self._entries.items() if e.until > now}

    async def save(self, entry: DenyEntry) -> bool:
        self._entries[entry.subject] = entry
        return True

    async def remove(self, subject: Subject) -> bool | None:
        return self._entries.pop(subject, None) is not None


class FileDenyStore:
    where = "file"

    def __init__(self, path: Path, clock: Callable[[], float] = time.time) -> None:
        self.path = path
        self._clock = clock
        self._seen: tuple[int, int] | None = None
        self._entries: dict[Subject, DenyEntry] = {}
        self._lock = asyncio.Lock()

    def emptied(self) -> bool:
        return False  # a deleted file is the operator's own change

    async def load(self) -> dict[Subject, DenyEntry] | None:
        try:
            stat = self.path.stat()
        except FileNotFoundError:
            self._seen, self._entries = None, {}
            return {}
        except OSError as exc:
            log.error("deny list: cannot read %s: %s", self.path, exc.strerror)
            return None
        stamp = (stat.st_mtime_ns, stat.st_size)
        if stamp != self._seen:
            entries = self._read()
            if entries is None:
                return None
            self._seen, self._entries = stamp, entries
        now = self._clock()
        return {s: e for s, e in self._entries.items() if e.until > now}

    def _read(self) -> dict[Subject, DenyEntry] | None:
        try:
            doc = orjson.loads(read_file(self.path, DENY_LIST_BYTES))
        except FileRefused as exc:
            log.error("deny list: %s; keeping the entries already loaded", exc)
            return None
        except orjson.JSONDecodeError:
            log.error(
                "deny list: %s is not valid JSON; keeping the entries already loaded", self.path
            )
            return None
        docs = doc.get("entries") if isinstance(doc, dict) else None
        if not isinstance(docs, list):
            log.error(
                'deny list: %s has no "entries" list; keeping the entries already loaded', self.path
            )
            return None
        return parse_entries(docs, self._clock(), str(self.path))

    async def save(self, entry: DenyEntry) -> bool:
        async with self._lock:
            current = await self.load()
            if current is None:
                return False
            current[entry.subject] = entry
            return self._write(current)

    async def remove(self, subject: Subject) -> bool | None:
        async with self._lock:
            current = await self.load()
            if current is None:
                return None
            if current.pop(subject, None) is None:
                return False
            return True if self._write(current) else None

    def _write(self, entries: dict[Subject, DenyEntry]) -> bool:
        body = orjson.dumps(
            {"entries": [e.to_json() for e in entries.values()]}, option=orjson.OPT_INDENT_2
        )
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            fd, tmp = tempfile.mkstemp(prefix=".deny-", dir=self.path.parent)
            try:
                with os.fdopen(fd, "wb") as f:
                    f.write(body)
                    f.flush()
                    os.fsync(f.fileno())
                os.replace(tmp, self.path)  # mkstemp made it 0600
            except BaseException:
                with contextlib.suppress(OSError):
                    os.unlink(tmp)
                raise
        except OSError as exc:
            log.error("deny list: cannot write %s: %s", self.path, exc.strerror)
            return False
        stat = self.path.stat()
        self._seen, self._entries = (stat.st_mtime_ns, stat.st_size), dict(entries)
        return True


class LocalBus:
    """No fleet to tell: an event reaches this process only, which already acted on it."""

    fleet = False

    def subscribe(self, handler: Handler) -> None:
        return None

    async def publish(self, event: Event) -> bool:
        return False

    async def start(self) -> None:
        return None

    async def close(self) -> None:
        return None
