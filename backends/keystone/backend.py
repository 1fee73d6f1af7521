"""Keystone v3, a drop-in for k8s-keystone-auth's authentication webhook.

A user's token is checked with ``GET /v3/auth/tokens?nocatalog``: the gateway's own
service token in ``X-Auth-Token``, the user's in ``X-Subject-Token``. Never HEAD (the
``identity:check_token`` policy refuses service-role tokens) and never
``allow_expired`` (Keystone would call an expired token valid).

=======================  ==========================================================
Keystone answers         outcome
=======================  ==========================================================
200                      authenticated (mapped as k8s-keystone-auth does)
404                      rejected: unknown, tampered, expired, revoked, user disabled
401                      the gateway's *own* token is bad: one coalesced re-login
403                      unavailable, misconfigured: the service user may not validate
5xx, 429, transport      unavailable
=======================  ==========================================================

The incident this backend exists for: Keystone faltered, its 401s were read as "the
user's token expired", every client logged in again and retried, and the storm kept
Keystone down. Here a 401 can only ever cost one shared re-login, then exponential
backoff during which reviews are answered "unavailable" without calling Keystone.
"""

from __future__ import annotations

import logging

import httpx

from backends.base import Backend, Outcome, Rejected, Unavailable
from backends.budget import PAID_BY_REVIEW, UNLIMITED, CallBudget
from backends.context import WireTime
from backends.http import header_safe, make_client, server_failure, unsendable
from backends.keystone.fernet import canonical_fernet
from backends.keystone.groups import GroupLookup
from backends.keystone.identity import Group, map_identity
from backends.keystone.service_token import ServiceToken, ServiceTokenAuth, send_with_service_token
from backends.keystone.settings import FERNET, FERNET_MIN_LENGTH, KeystoneSettings
from backends.registry import builds
from backends.transports import on_the_wire

log = logging.getLogger(__name__)


@builds(KeystoneSettings)
class KeystoneBackend(Backend):
    kind = "keystone"

    def __init__(
        self,
        settings: KeystoneSettings,
        client: httpx.AsyncClient | None = None,
        budget: CallBudget = UNLIMITED,
    ) -> None:
        super().__init__(settings.name)
        self._s = settings
        self._base = settings.v3_url + "/"
        # The review's validation call is paid by the gateway; service logins and group
        # pages take from ``budget`` in the client's transport.
        self._client = client or make_client(
            self._base,
            settings.timeouts,
            settings.tls,
            settings.pool,
            budget=budget,
            resend_if_dropped=True,
        )
        max_wait = settings.breaker.max_retry_after_seconds
        self.service = ServiceToken(
            settings.name,
            self._client,
            settings.service,
            settings.service_token,
            settings.timeouts,
            max_retry_after=max_wait,
        )
        self._auth = ServiceTokenAuth(self.service)
        self._groups = GroupLookup(
            settings.groups, self._client, self._auth, self._base, max_retry_after=max_wait
        )
        # Built once: httpx would parse and merge the path and its query on every call.
        self._validate_url = self._client.build_request(
            "GET", "auth/tokens", params={"nocatalog": "1"}
        ).url

    async def start(self) -> None:
        if not self._s.tls.verify:
            log.warning("backend %s: TLS verification is OFF", self.name)
        await self.service.start()

    async def close(self) -> None:
        await self.service.close()
        await self._client.aclose()

    def could_accept(self, token: str) -> bool:
        # X-Subject-Token carries visible ASCII only: anything else is no Keystone token.
        if not header_safe(token):
            return False
        if not self._s.fernet_precheck:
            return True
        return FERNET_MIN_LENGTH <= len(token) <= self._s.fernet_max_length and bool(
            FERNET.fullmatch(token)
        )

    def credential(self, token: str) -> str:
        # Keystone takes one fernet token in many spellings (fernet.py): one id for all.
        return canonical_fernet(token)

    async def authenticate(self, token: str, wire: WireTime | None = None) -> Outcome:
        refusal = unsendable(token)
        if refusal is not None:
            return refusal
        answer = await send_with_service_token(
            lambda: self._client.get(
                self._validate_url,
                headers={"X-Subject-Token": token},
                auth=self._auth,
                extensions=on_the_wire(wire, PAID_BY_REVIEW),
            )
        )
        if isinstance(answer, Unavailable):
            return answer
        status = answer.status_code
        if status == 404:
            return Rejected("Keystone does not know the token (404)")
        if status == 403:
            return Unavailable(
                "the service user may not validate tokens (Keystone 403): give it the "
                "service role on its project or the reader role on the system",
                misconfigured=True,
            )
        if status != 200:
            return server_failure(self.kind, answer, self._s.breaker.max_retry_after_seconds)
        try:
            body = answer.json()["token"]
            user_id = body["user"]["id"]
        except (ValueError, KeyError, TypeError):
            return Unavailable("Keystone sent an unreadable token body")
        groups: tuple[Group, ...] = ()
        if self._s.groups.enabled:
            found = await self._groups.get(str(user_id), wire)
            if not isinstance(found, tuple):
                return found
            groups = found
        return map_identity(body, groups, self._s)
