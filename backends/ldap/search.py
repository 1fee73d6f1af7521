"""The searches of one review, on a bound connection: the user's entry, found by filter
or read by DN, and the user's groups, page by page."""

from __future__ import annotations

import logging

from ldap3 import BASE, SUBTREE, Connection

from backends.base import Rejected, Unavailable
from backends.ldap.entries import Entry, entries_of, filter_with
from backends.ldap.failures import SIZE_LIMIT_EXCEEDED, Done, result_failure
from backends.ldap.settings import LDAPSettings

log = logging.getLogger(__name__)

PAGED_RESULTS = "1.2.840.113556.1.4.319"
GROUP_PAGE_SIZE = 500
MAX_GROUP_PAGES = 20


class Searches:
    """The searches one backend makes, with its attributes and server-side time limit."""

    def __init__(self, settings: LDAPSettings, time_limit: int) -> None:
        self._s = settings
        # Server-side limit on each search (0 would mean none).
        self._time_limit = time_limit
        groups = settings.groups
        self._attributes = sorted(
            {
                settings.username_attribute,
                settings.uid_attribute,
                *settings.extra_attributes.values(),
            }
            | ({groups.member_of_attribute} if groups.mode == "member_of" else set())
        )

    def find_user(self, conn: Connection, username: str) -> Entry:
        assert self._s.user_base is not None
        conn.search(
            self._s.user_base,
            filter_with(self._s.user_filter, username=username),
            SUBTREE,
            attributes=self._attributes,
            size_limit=2,
            time_limit=self._time_limit,
        )
        entries = entries_of(conn.response)
        code = conn.result.get("result")
        if code == SIZE_LIMIT_EXCEEDED or len(entries) > 1:
            raise Done(Rejected("more than one entry matches"))
        if code != 0:
            raise Done(result_failure(conn.result, "user search"))
        if not entries:
            raise Done(Rejected("no such user"))
        return entries[0]

    def read_entry(self, conn: Connection, dn: str) -> Entry:
        conn.search(
            dn,
            "(objectClass=*)",
            BASE,
            attributes=self._attributes,
            time_limit=self._time_limit,
        )
        entries = entries_of(conn.response)
        if conn.result.get("result") != 0 or len(entries) != 1:
            # The bind succeeded, so the entry exists: we are not allowed to read it.
            failure = result_failure(conn.result, "reading the user entry")
            raise Done(Unavailable(failure.reason, misconfigured=True))
        return entries[0]

    def groups(self, conn: Connection, entry: Entry, username: str) -> list[str]:
        groups = self._s.groups
        assert groups.base is not None
        flt = filter_with(groups.search_filter, dn=entry.dn, username=username)
        names: list[str] = []
        cookie: bytes | None = None
        for _ in range(MAX_GROUP_PAGES):
            conn.search(
                groups.base,
                flt,
                SUBTREE,
                attributes=[groups.name_attribute],
                time_limit=self._time_limit,
                paged_size=GROUP_PAGE_SIZE,
                paged_cookie=cookie,
            )
            if conn.result.get("result") != 0:
                raise Done(result_failure(conn.result, "group search"))
            names += [e.first(groups.name_attribute) or e.dn for e in entries_of(conn.response)]
            control = (conn.result.get("controls") or {}).get(PAGED_RESULTS) or {}
            cookie = (control.get("value") or {}).get("cookie")
            if not cookie:
                return names
        # This user's groups, not the directory's health (the filter must name the user):
        # a refusal, as GitLab's backend does. Unavailable would let one user's own
        # reviews open the breaker for everyone.
        most = MAX_GROUP_PAGES * GROUP_PAGE_SIZE
        log.warning("backend %s: user %s is in more than %d groups", self._s.name, username, most)
        raise Done(Rejected(f"user is in more than {most} groups", "unmapped"))
