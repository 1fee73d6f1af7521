"""The LDAP backend: one review's exchange (find the user, bind as them, read their
groups) on a bounded thread pool, and the identity it makes of the entry."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import TypeVar

from ldap3 import Connection
from ldap3.core.exceptions import LDAPException

from backends.base import Authenticated, Backend, Outcome, Rejected, UserInfo
from backends.budget import UNLIMITED, CallBudget
from backends.context import WireTime
from backends.ldap.bind import Binder
from backends.ldap.entries import Entry, dn_with, group_name
from backends.ldap.failures import Done, connection_failure
from backends.ldap.pool import ServicePool, close_quietly
from backends.ldap.search import Searches
from backends.ldap.settings import LDAPSettings
from backends.ldap.token import (
    SASLPREP_REFUSAL,
    Credentials,
    canonical_token,
    parse_token,
    sendable_password,
)
from backends.registry import builds

log = logging.getLogger(__name__)

T = TypeVar("T")


@builds(LDAPSettings)
class LDAPBackend(Backend):
    kind = "ldap"

    def __init__(self, settings: LDAPSettings, budget: CallBudget = UNLIMITED) -> None:
        super().__init__(settings.name)
        self._s = settings
        self._binder = Binder(settings)
        self._searches = Searches(settings, time_limit=self._binder.read_timeout)
        size = settings.pool.size
        self._executor = ThreadPoolExecutor(
            max_workers=size, thread_name_prefix=f"ldap-{self.name}"
        )
        self._slots = asyncio.Semaphore(size)
        self.pool: ServicePool | None = None
        if settings.bind_dn is not None:
            self.pool = ServicePool(self._binder.open_service, size, settings.pool.max_idle_seconds)
        self._warm_up: asyncio.Task[None] | None = None

    # -- lifecycle

    async def start(self) -> None:
        if not self._s.tls.verify:
            log.warning("backend %s: TLS certificate verification is OFF", self.name)
        if self._s.allow_plaintext and not self._s.start_tls and self._s.url.startswith("ldap:"):
            log.warning("backend %s: passwords go to the LDAP server in clear", self.name)
        if self.pool is not None:
            # Early word on a wrong bind DN or CA, without delaying start-up.
            self._warm_up = asyncio.create_task(self._check_service(), name=f"ldap-{self.name}")

    async def _check_service(self) -> None:
        problem = await self._in_thread(self._service_problem)
        if problem is not None:
            log.warning("backend %s: service account not usable yet: %s", self.name, problem)

    def _service_problem(self) -> str | None:
        assert self.pool is not None
        try:
            self.pool.run(lambda conn: None)
        except Done as done:
            return getattr(done.outcome, "reason", "refused")
        except LDAPException as exc:
            return connection_failure(exc).reason
        return None

    async def close(self) -> None:
        if self._warm_up is not None:
            self._warm_up.cancel()
        await asyncio.to_thread(self._shutdown)

    def _shutdown(self) -> None:
        self._executor.shutdown(wait=True, cancel_futures=True)
        if self.pool is not None:
            self.pool.close()

    # -- the review

    def could_accept(self, token: str) -> bool:
        creds = parse_token(token, self._s.token_format)
        return creds is not None and sendable_password(creds.password)

    def credential(self, token: str) -> str:
        return canonical_token(token, self._s.token_format)

    async def authenticate(self, token: str, wire: WireTime | None = None) -> Outcome:
        creds = parse_token(token, self._s.token_format)
        if creds is None:
            return Rejected("token is not username:password with both parts set")
        if not sendable_password(creds.password):
            # Refused here, before a thread or a connection: no such password can be valid.
            return SASLPREP_REFUSAL
        return await self._in_thread(lambda: self._guarded(lambda: self._exchange(creds)))

    async def _in_thread(self, fn: Callable[[], T]) -> T:
        await self._slots.acquire()
        try:
            future = asyncio.get_running_loop().run_in_executor(self._executor, fn)
        except BaseException:
            self._slots.release()
            raise
        # The slot is freed when the thread is done, not when the caller gives up: a
        # review cancelled by its deadline must not let a hung server collect threads.
        future.add_done_callback(lambda _: self._slots.release())
        return await asyncio.shield(future)

    def _guarded(self, exchange: Callable[[], Outcome]) -> Outcome:
        try:
            return exchange()
        except Done as done:
            return done.outcome
        except LDAPException as exc:
            return connection_failure(exc)

    def _exchange(self, creds: Credentials) -> Outcome:
        template = self._s.user_dn_template
        if template is None:
            assert self.pool is not None
            entry = self.pool.run(lambda c: self._searches.find_user(c, creds.username))
            self._binder.check_password(entry.dn, creds.password)
            return self._identity(entry, self.pool.run)
        dn = dn_with(template, creds.username)
        if self.pool is not None:
            self._binder.check_password(dn, creds.password)
            entry = self.pool.run(lambda c: self._searches.read_entry(c, dn))
            return self._identity(entry, self.pool.run)
        # No service account: the user reads their own entry and groups.
        conn = self._binder.bound(dn, creds.password, user=True)
        try:
            entry = self._searches.read_entry(conn, dn)
            return self._identity(entry, lambda op: op(conn))
        finally:
            close_quietly(conn)

    def _identity(
        self, entry: Entry, run: Callable[[Callable[[Connection], list[str]]], list[str]]
    ) -> Outcome:
        s = self._s
        username = entry.first(s.username_attribute)
        if not username:
            # The password was right, so the directory is healthy: a refusal (an entry
            # with a password but no name, such as a service entry), never "unavailable".
            return Rejected(
                f"user entry has no {s.username_attribute!r} attribute (username_attribute)",
                "unmapped",
            )
        groups = s.groups
        names: list[str] = []
        if groups.mode == "member_of":
            names = [
                group_name(dn, groups.name_attribute)
                for dn in entry.all(groups.member_of_attribute)
            ]
        elif groups.mode == "search":
            names = run(lambda c: self._searches.groups(c, entry, username))
        extra = {key: tuple(entry.all(attr)) for key, attr in s.extra_attributes.items()}
        return Authenticated(
            UserInfo(
                username=username,
                uid=entry.first(s.uid_attribute),
                groups=tuple(sorted(set(names))),
                extra={k: v for k, v in extra.items() if v},
            )
        )
