"""A user's Keystone groups (``GET /v3/users/{id}/groups``, every page), cached per user
apart from the review cache, one lookup per user at a time, last known groups served
while Keystone cannot list them."""

from __future__ import annotations

import functools
import logging
import time
from collections.abc import Callable
from urllib.parse import quote, urlsplit

import httpx
from cachetools import TTLCache

from backends.base import Rejected, Unavailable
from backends.context import WireTime
from backends.flight import SingleFlight
from backends.http import server_failure
from backends.keystone.identity import Group
from backends.keystone.service_token import ServiceTokenAuth, send_with_service_token
from backends.keystone.settings import GroupLookupSettings
from backends.settings import DEFAULT_MAX_RETRY_AFTER_SECONDS
from backends.transports import on_the_wire

log = logging.getLogger(__name__)

Groups = tuple[Group, ...]


class GroupLookup:
    def __init__(
        self,
        settings: GroupLookupSettings,
        client: httpx.AsyncClient,
        auth: ServiceTokenAuth,
        base_url: str,
        clock: Callable[[], float] = time.monotonic,
        *,
        max_retry_after: float = DEFAULT_MAX_RETRY_AFTER_SECONDS,
    ) -> None:
        self._settings = settings
        # breaker.max_retry_after_seconds: the longest a 429 on a page holds it back.
        self._max_retry_after = max_retry_after
        self._client = client
        self._auth = auth
        self._base = base_url
        self._clock = clock
        # Entries live for TTL + max_stale; only the TTL makes them fresh.
        self._entries: TTLCache[str, tuple[Groups, float]] = TTLCache(
            settings.max_entries, settings.cache_ttl_seconds + settings.max_stale_seconds, clock
        )
        self._flights: SingleFlight[Groups | Rejected | Unavailable] = SingleFlight()

    async def get(
        self, user_id: str, wire: WireTime | None = None
    ) -> Groups | Rejected | Unavailable:
        """The user's groups; a fetch's pages are timed on ``wire`` (the review that
        started it: the others wait for the same answer)."""
        known = self._entries.get(user_id)
        now = self._clock()
        if known is not None and now < known[1] + self._settings.cache_ttl_seconds:
            return known[0]
        result = await self._flights.do(user_id, lambda: self._fetch(user_id, wire))
        if isinstance(result, tuple):
            self._entries[user_id] = (result, self._clock())
            return result
        if isinstance(result, Rejected):
            self._entries.pop(user_id, None)
            return result
        if known is not None:
            # Still in the cache: within TTL + max_stale.
            return known[0]
        return result

    async def _fetch(self, user_id: str, wire: WireTime | None) -> Groups | Rejected | Unavailable:
        url: str = f"users/{quote(user_id, safe='')}/groups"
        groups: list[Group] = []
        for _page in range(self._settings.max_pages):
            # Each page is a follow-up call: it takes from the backend's call budget.
            answer = await send_with_service_token(
                functools.partial(
                    self._client.get, url, auth=self._auth, extensions=on_the_wire(wire)
                )
            )
            if isinstance(answer, Unavailable):
                return answer
            if answer.status_code == 404:
                return Rejected("the token's user no longer exists (404 on its groups)")
            if answer.status_code == 403:
                return Unavailable(
                    "the service user may not list groups (Keystone 403): it needs the "
                    "reader role on the system and a system-scoped login",
                    misconfigured=True,
                )
            if answer.status_code != 200:
                return server_failure("keystone", answer, self._max_retry_after)
            try:
                body = answer.json()
                groups += [
                    Group(str(g["id"]), str(g["name"]), str(g.get("domain_id", "")))
                    for g in body["groups"]
                ]
                following = (body.get("links") or {}).get("next")
            except (ValueError, KeyError, TypeError, AttributeError):
                return Unavailable("Keystone sent an unreadable group list")
            if not following:
                return tuple(groups)
            if not self._same_keystone(str(following)):
                # Our service token must never go to a host the config does not name.
                return Unavailable("Keystone's next-page link points elsewhere")
            url = str(following)
        # The user's groups, not Keystone's health: a refusal (Unavailable would let one
        # user's own reviews open the breaker for everyone), as the other backends do.
        pages = self._settings.max_pages
        log.warning("keystone: user %s has more than %d pages of groups", user_id, pages)
        return Rejected(f"user has more than {pages} pages of groups", "unmapped")

    def _same_keystone(self, link: str) -> bool:
        ours, theirs = urlsplit(self._base), urlsplit(link)
        return (ours.scheme, ours.netloc) == (theirs.scheme, theirs.netloc) and (
            theirs.path.startswith(ours.path)
        )
