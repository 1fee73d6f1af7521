"""Static tokens, compatible with kube-apiserver's ``--token-auth-file`` CSV.

Each line is ``token,user,uid,"group1,group2"``; lines starting with ``#`` and
blank lines are skipped. Intended for development and break-glass accounts.

Tokens are indexed by a keyed hash, then compared with :func:`hmac.compare_digest`,
so lookup time does not depend on how much of a guessed token is right.
"""

from __future__ import annotations

import asyncio
import csv
import hmac
import io
import logging
import os
import secrets
from dataclasses import dataclass
from hashlib import sha256
from typing import Literal

from pydantic import Field, model_validator

from backends.base import Authenticated, Backend, BackendConfigError, Outcome, Rejected, UserInfo
from backends.budget import UNLIMITED, CallBudget
from backends.context import WireTime
from backends.durations import Interval
from backends.files import TOKEN_FILE_BYTES, FileRefused, read_text, shown
from backends.registry import register
from backends.settings import BackendSettings, FilePath, Secret, Strict

log = logging.getLogger(__name__)


class TokenFileError(BackendConfigError):
    """A token file that cannot be used; the message names file and line."""


class InlineToken(Strict):
    token: Secret
    username: str = Field(min_length=1)
    uid: str = ""
    groups: list[str] = Field(default_factory=list)


@register
class StaticSettings(BackendSettings):
    type: Literal["static"]
    # A --token-auth-file CSV (a regular file, at most 16 MiB); reloaded when it changes.
    file: FilePath | None = None
    # Tokens written into the config itself (the embedded demo uses these).
    tokens: list[InlineToken] = Field(default_factory=list)
    reload_interval_seconds: Interval = 2.0

    @model_validator(mode="after")
    def _one_source(self) -> StaticSettings:
        if self.file is None and not self.tokens:
            raise ValueError("needs a file or tokens")
        return self

    def build(self, budget: CallBudget = UNLIMITED) -> Backend:
        return StaticBackend(self)


@dataclass(frozen=True, slots=True)
class _Entry:
    token: bytes
    user: UserInfo


def parse_token_file(text: str, source: str) -> list[tuple[str, UserInfo]]:
    """Parse token-file CSV. Raises :class:`TokenFileError` naming ``source:line``."""
    return [(token, user) for token, user, _ in _token_rows(text, source)]


def _token_rows(text: str, source: str) -> list[tuple[str, UserInfo, int]]:
    entries: list[tuple[str, UserInfo, int]] = []
    seen: dict[str, int] = {}
    for lineno, row in enumerate(csv.reader(io.StringIO(text)), start=1):
        if not row or not "".join(row).strip() or row[0].lstrip().startswith("#"):
            continue
        where = f"{source}:{lineno}"
        if len(row) < 3:
            raise TokenFileError(
                f"{where}: expected token,user,uid[,groups], got {len(row)} fields"
            )
        token, username, uid = row[0].strip(), row[1].strip(), row[2].strip()
        if not token:
            raise TokenFileError(f"{where}: empty token")
        if not username:
            raise TokenFileError(f"{where}: empty user name")
        if token in seen:
            raise TokenFileError(
                f"{where}: duplicate token (user {username}), first at line {seen[token]}"
            )
        seen[token] = lineno
        groups = tuple(g.strip() for g in row[3].split(",") if g.strip()) if len(row) > 3 else ()
        entries.append((token, UserInfo(username=username, uid=uid, groups=groups), lineno))
    return entries


class StaticBackend(Backend):
    kind = "static"
    # A table lookup: no cache, breaker or bucket in front (see Backend.remote), so an
    # edit to the file takes effect at the next reload, removals and additions alike.
    remote = False

    def __init__(self, settings: StaticSettings) -> None:
        super().__init__(settings.name)
        self._settings = settings
        self._index_key = secrets.token_bytes(32)
        self._table: dict[bytes, _Entry] = {}
        self._mtime: tuple[int, int] | None = None
        self._watcher: asyncio.Task[None] | None = None
        self.load()

    def _digest(self, token: str) -> bytes:
        return hmac.new(self._index_key, token.encode(), sha256).digest()

    def load(self) -> None:
        """(Re)load every source; raises TokenFileError and keeps the old table."""
        pairs: list[tuple[str, UserInfo]] = []
        # Where each token was given, so a duplicate names both places (never the token).
        places: dict[str, str] = {}

        def add(token: str, user: UserInfo, place: str) -> None:
            if token in places:
                raise TokenFileError(
                    f"{place}: duplicate token (user {user.username}), also at {places[token]}"
                )
            places[token] = place
            pairs.append((token, user))

        for i, t in enumerate(self._settings.tokens):
            user = UserInfo(t.username, t.uid, tuple(t.groups))
            add(t.token.get_secret_value(), user, f"tokens[{i}]")
        path = self._settings.file
        if path is not None:
            try:
                stat = path.stat()
            except OSError as exc:
                raise TokenFileError(f"file: {shown(path)}: cannot read: {exc.strerror}") from None
            try:
                text = read_text(path, TOKEN_FILE_BYTES)
            except FileRefused as exc:
                raise TokenFileError(f"file: {exc}") from None
            for token, user, lineno in _token_rows(text, str(path)):
                add(token, user, f"{path}:{lineno}")
            self._mtime = (stat.st_mtime_ns, stat.st_size)
        self._table = {self._digest(t): _Entry(t.encode(), u) for t, u in pairs}

    async def start(self) -> None:
        if self._settings.file is not None:
            self._watcher = asyncio.create_task(self._watch(), name=f"static-reload-{self.name}")

    async def close(self) -> None:
        if self._watcher is not None:
            self._watcher.cancel()

    async def _watch(self) -> None:
        path = self._settings.file
        assert path is not None
        while True:
            await asyncio.sleep(self._settings.reload_interval_seconds)
            try:
                stat = os.stat(path)
            except OSError:
                continue
            if (stat.st_mtime_ns, stat.st_size) == self._mtime:
                continue
            try:
                self.load()
            except TokenFileError as exc:
                # A half-written or broken file must not drop every token: keep the old set.
                self._mtime = (stat.st_mtime_ns, stat.st_size)
                log.error(
                    "backend %s: token file reload refused, keeping previous: %s", self.name, exc
                )
            else:
                log.info(
                    "backend %s: reloaded %d tokens from %s", self.name, len(self._table), path
                )

    async def authenticate(self, token: str, wire: WireTime | None = None) -> Outcome:
        entry = self._table.get(self._digest(token))
        if entry is not None and hmac.compare_digest(entry.token, token.encode()):
            return Authenticated(entry.user)
        return Rejected("unknown static token")
