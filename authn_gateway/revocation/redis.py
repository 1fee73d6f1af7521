"""Fleet revocation state in Redis: the deny list as one hash, the bus as one stream.

* Deny list: ``<prefix>:deny`` maps ``user:NAME`` / ``token:ID`` to the entry's JSON.
  Replicas read the whole hash every ``sync_seconds`` (it holds a handful of entries)
  and when the bus announces a change; expired fields are removed by whoever sees them.
* Bus: ``<prefix>:revocations``, a stream capped at about :data:`STREAM_LENGTH` events.
  Each replica reads it with a blocking XREAD on a connection of its own, from the
  last id it saw, so events published while it was cut off are read when it is back.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable
from typing import Any

import orjson

from authn_gateway.config import RedisSettings
from authn_gateway.fleet.redis_link import REDIS_DOWN, RedisDown, RedisLink, make_client
from authn_gateway.revocation.bus import OPS, Event, Handler
from authn_gateway.revocation.denylist import DenyEntry, parse_entries
from authn_gateway.revocation.subject import BadSubject, Subject
from authn_gateway.tasks import STOP_PATIENCE, cancel_and_wait
from backends.durations import whole_ms

log = logging.getLogger(__name__)

STREAM_LENGTH = 1000
BLOCK_SECONDS = 1.0


# A field of the deny hash that no lift removes: gone only when Redis lost everything.
MARKER = "~present"


class RedisDenyStore:
    where = "redis"

    def __init__(self, link: RedisLink, clock: Callable[[], float] = time.time) -> None:
        self._link = link
        self._key = link.key("deny")
        self._clock = clock
        # Whether this process has seen the marker field (see load).
        self._marked = False
        self._emptied = False

    def emptied(self) -> bool:
        """Whether Redis lost the list since the previous load (FLUSHALL, a restart
        without persistence): its marker field, set in the first load of an empty Redis
        and never removed by a lift, was gone."""
        return self._emptied

    async def load(self) -> dict[Subject, DenyEntry] | None:
        try:
            raw = await self._link.run("deny_load", lambda r: r.hgetall(self._key))
        except RedisDown:
            return None
        raw = {_decode(k): v for k, v in raw.items()}
        self._emptied = self._marked and MARKER not in raw
        if raw.pop(MARKER, None) is None:
            await self._link.best_effort("deny_mark", lambda r: r.hset(self._key, MARKER, 1))
        self._marked = True
        docs: list[Any] = []
        for value in raw.values():
            try:
                docs.append(orjson.loads(value))
            except orjson.JSONDecodeError:
                docs.append(None)  # counted as malformed below
        entries = parse_entries(docs, self._clock(), "redis")
        stale = [f for f in raw if f not in {s.key for s in entries}]
        if stale:
            await self._link.best_effort("deny_prune", lambda r: r.hdel(self._key, *stale))
        return entries

    async def save(self, entry: DenyEntry) -> bool:
        value = orjson.dumps(entry.to_json())
        field = entry.subject.key
        done = await self._link.best_effort("deny_save", lambda r: r.hset(self._key, field, value))
        return done is not None

    async def remove(self, subject: Subject) -> bool | None:
        try:
            removed = await self._link.run("deny_remove", lambda r: r.hdel(self._key, subject.key))
        except RedisDown:
            return None
        return bool(removed)


def _decode(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def reader_client(settings: RedisSettings, block_seconds: float = BLOCK_SECONDS) -> Any:
    """A connection for blocking reads: its socket timeout outlasts the block."""
    timeout = block_seconds + settings.timeout_seconds + 1.0
    return make_client(settings.model_copy(update={"timeout_seconds": timeout}))


class RedisBus:
    fleet = True

    def __init__(
        self,
        link: RedisLink,
        reader: Any,
        origin: str,
        *,
        block_seconds: float = BLOCK_SECONDS,
        retry_seconds: float = 1.0,
    ) -> None:
        self._link = link
        self._reader = reader
        self.origin = origin
        self._key = link.key("revocations")
        self._block_ms = whole_ms(block_seconds)
        self._retry = retry_seconds
        self._handlers: list[Handler] = []
        self._task: asyncio.Task[None] | None = None
        self._closing = False
        self._last_id = "$"

    def subscribe(self, handler: Handler) -> None:
        self._handlers.append(handler)

    async def publish(self, event: Event) -> bool:
        fields = {"op": event.op, "subject": event.subject.key, "origin": event.origin}
        done = await self._link.best_effort(
            "revocation_publish",
            lambda r: r.xadd(self._key, fields, maxlen=STREAM_LENGTH, approximate=True),
        )
        return done is not None

    async def start(self) -> None:
        # Start after the newest event: what happened before this replica existed is
        # already in the shared state it reads (deny hash, purged shared cache).
        self._last_id = f"{int(time.time() * 1000)}-0"
        with contextlib.suppress(*REDIS_DOWN):
            async with asyncio.timeout(1.0):
                newest = await self._reader.xrevrange(self._key, count=1)
            self._last_id = _decode(newest[0][0]) if newest else "0-0"
        self._task = asyncio.get_running_loop().create_task(self._read_forever())

    async def close(self) -> None:
        self._closing = True
        # The loop also stops on _closing: a cancellation the client lost (seen as a
        # shutdown that never ended, 1 in 5 runs of a test) ends it at its next turn.
        if self._task is not None and not await cancel_and_wait(self._task, STOP_PATIENCE):
            log.warning("revocations: the stream reader did not stop; left behind")
        with contextlib.suppress(*REDIS_DOWN):
            await self._reader.aclose()

    async def _read_forever(self) -> None:
        failing = False
        while not self._closing:
            try:
                batch = await self._reader.xread(
                    {self._key: self._last_id}, block=self._block_ms, count=100
                )
            except REDIS_DOWN as exc:
                if self._closing:
                    return
                if not failing:
                    log.warning(
                        "revocations: cannot read the stream (%s); retrying, missed events "
                        "are read when Redis answers",
                        type(exc).__name__,
                    )
                failing = True
                await asyncio.sleep(self._retry)
                continue
            if failing:
                log.warning("revocations: reading the stream again")
                failing = False
            for _key, messages in batch or ():
                for message_id, fields in messages:
                    self._last_id = _decode(message_id)
                    await self._deliver(fields)

    async def _deliver(self, fields: dict[Any, Any]) -> None:
        doc = {_decode(k): _decode(v) for k, v in fields.items()}
        if doc.get("origin") == self.origin:
            return
        op = doc.get("op")
        try:
            if op not in OPS:
                raise BadSubject("unknown op")
            event = Event(op, Subject.from_key(doc.get("subject", "")), doc.get("origin", ""))  # type: ignore[arg-type]
        except BadSubject:
            log.warning("revocations: skipped a malformed event")
            return
        for handler in self._handlers:
            try:
                await handler(event)
            except Exception:
                log.exception("revocations: handling %s %s failed", event.op, event.subject.kind)
