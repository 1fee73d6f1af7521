"""The gateway's own Keystone token: one login at a time, a refresher, one re-login per
401, and :class:`ServiceTokenAuth`, the httpx auth flow that puts it on requests."""

from __future__ import annotations

import asyncio
import logging
import random
import time
from collections.abc import AsyncGenerator, Awaitable, Callable
from dataclasses import dataclass

import httpx

from backends.base import HeldBack, Unavailable
from backends.budget import CallHeldBack
from backends.context import WireTime
from backends.flight import SingleFlight
from backends.http import server_failure, transport_failure
from backends.keystone.identity import parse_keystone_time
from backends.keystone.settings import ServiceCredentials, ServiceTokenSettings
from backends.settings import DEFAULT_MAX_RETRY_AFTER_SECONDS, TimeoutSettings
from backends.transports import WIRE_KEY, on_the_wire

log = logging.getLogger(__name__)

_LOGIN = "login"


@dataclass(frozen=True, slots=True)
class _Held:
    value: str
    # Monotonic times, from Keystone's own issued_at -> expires_at lifetime so that
    # clock skew between us and Keystone does not matter.
    refresh_at: float
    usable_until: float


class ServiceToken:
    """The gateway's own token: one login, one refresher, one re-login per 401.

    Every login goes through one shared flight, whatever triggered it: the
    start, the refresher, or any number of concurrent reviews that saw a 401. After a
    failed login, or a 401 on a token we just got, the next login waits out an
    exponential backoff; meanwhile :meth:`get` answers :class:`Unavailable` at once.
    The backoff resets only when Keystone accepts our token on a validation.
    """

    def __init__(
        self,
        backend_name: str,
        client: httpx.AsyncClient,
        credentials: ServiceCredentials,
        settings: ServiceTokenSettings,
        timeouts: TimeoutSettings,
        clock: Callable[[], float] = time.monotonic,
        *,
        max_retry_after: float = DEFAULT_MAX_RETRY_AFTER_SECONDS,
    ) -> None:
        self._name = backend_name
        # breaker.max_retry_after_seconds: the longest a 429 on a login holds it back.
        self._max_retry_after = max_retry_after
        self._client = client
        self._credentials = credentials
        self._settings = settings
        self._deadline = timeouts.total_seconds
        self._clock = clock
        self._held: _Held | None = None
        self._flights: SingleFlight[_Held | Unavailable] = SingleFlight()
        self._refresher: asyncio.Task[None] | None = None
        self._strikes = 0
        self._not_before = 0.0
        self._last_failure = Unavailable("no service token yet")
        #: Logins attempted (for logs and tests).
        self.logins = 0

    async def start(self) -> None:
        # In the background: a Keystone outage must neither fail nor hold up the gateway's
        # start (it would rather answer from its cache); early reviews join this login.
        self._flights.start(_LOGIN, lambda: self._authenticate(None))
        self._refresher = asyncio.create_task(self._refresh_loop(), name=f"keystone-{self._name}")

    async def close(self) -> None:
        # Let them unwind before the HTTP client they use is closed.
        if self._refresher is not None:
            self._refresher.cancel()
            await asyncio.gather(self._refresher, return_exceptions=True)
        await self._flights.cancel_all()

    async def get(self, wire: WireTime | None = None) -> str | Unavailable:
        held = self._held
        if held is not None and self._clock() < held.usable_until:
            return held.value
        return await self._login(wire)

    def refused(self, token: str) -> None:
        """Keystone answered 401 to ``token``: drop it; the next :meth:`get` logs in again."""
        held = self._held
        if held is not None and held.value == token:
            self._held = None
            self._trouble(Unavailable("Keystone refused the gateway's service token (401)"))

    def confirmed(self) -> None:
        """Keystone accepted our token on a validation: the trouble is over."""
        self._strikes = 0

    async def _login(self, wire: WireTime | None = None) -> str | Unavailable:
        """A login, shared by every review that needs one now; it is timed on the wire
        clock of the review that started it (``wire``): a review waiting for a hanging
        login waits for Keystone, not for the gateway."""
        if not self._flights.busy(_LOGIN):
            wait = self._not_before - self._clock()
            if wait > 0:
                return Unavailable(
                    f"{self._last_failure.reason}; next service login in {wait:.1f}s"
                )
        # The flight is shielded: a review that gives up does not cancel the others' login.
        result = await self._flights.do(_LOGIN, lambda: self._authenticate(wire))
        return result.value if isinstance(result, _Held) else result

    def _trouble(self, failure: Unavailable) -> None:
        """Schedule the next login: at once after the first trouble, then backing off."""
        s = self._settings
        delay = 0.0
        if self._strikes > 0:
            delay = min(
                s.reauth_backoff_initial_seconds * 2 ** (self._strikes - 1),
                s.reauth_backoff_max_seconds,
            ) * random.uniform(0.8, 1.2)
        self._strikes += 1
        self._not_before = self._clock() + delay
        self._last_failure = failure

    async def _authenticate(self, wire: WireTime | None) -> _Held | Unavailable:
        self.logins += 1
        started = self._clock()
        try:
            async with asyncio.timeout(self._deadline):
                # A login is a follow-up call: it takes from the backend's call budget.
                response = await self._client.post(
                    "auth/tokens",
                    params={"nocatalog": "1"},
                    json=self._credentials.auth_request(),
                    extensions=on_the_wire(wire),
                )
        except TimeoutError:
            return self._failed(Unavailable("service login: no answer in time"))
        except CallHeldBack as exc:
            # Our own budget said no: not Keystone's trouble, so no backoff either.
            refused: HeldBack = exc.outcome
            return refused
        except httpx.HTTPError as exc:
            return self._failed(Unavailable(f"service login: {transport_failure(exc).reason}"))
        if response.status_code == 201:
            held = self._parse(response, started)
            if isinstance(held, _Held):
                self._held = held
                log.info("backend %s: logged in to Keystone as the service user", self._name)
            else:
                self._failed(held)
            return held
        if response.status_code in (400, 401, 403, 404):
            # Wrong password, disabled user, unknown project: someone has to fix the config.
            return self._failed(
                Unavailable(
                    f"Keystone refused the service credentials ({response.status_code})",
                    misconfigured=True,
                )
            )
        failure = server_failure("keystone", response, self._max_retry_after)
        return self._failed(
            Unavailable(f"service login: {failure.reason}", retry_after=failure.retry_after)
        )

    def _failed(self, failure: Unavailable) -> Unavailable:
        self._trouble(failure)
        log.warning("backend %s: service login failed: %s", self._name, failure.reason)
        return failure

    def _parse(self, response: httpx.Response, started: float) -> _Held | Unavailable:
        value = response.headers.get("x-subject-token", "")
        try:
            body = response.json()["token"]
            issued = parse_keystone_time(body["issued_at"])
            expires = parse_keystone_time(body["expires_at"])
        except (ValueError, KeyError, TypeError):
            return Unavailable("service login: Keystone sent an unreadable token body")
        lifetime = expires - issued
        if not value or lifetime <= 0:
            return Unavailable("service login: Keystone sent no usable token")
        margin = min(self._settings.refresh_before_expiry_seconds, lifetime / 2)
        # Stop using it a little before Keystone would, so a validation never races expiry.
        return _Held(value, started + lifetime - margin, started + lifetime - min(30.0, margin / 2))

    async def _refresh_loop(self) -> None:
        """Log in again shortly before expiry, or when there is no token (backing off)."""
        while True:
            held = self._held
            due = held.refresh_at if held is not None else self._not_before
            # Wake at least every few seconds: state changes under us (401s, logins).
            await asyncio.sleep(min(max(due - self._clock(), 0.05), 5.0))
            held = self._held
            now = self._clock()
            if held is not None and now < held.refresh_at:
                continue
            if now < self._not_before:
                continue
            try:
                await self._login()
            except asyncio.CancelledError:
                raise
            except Exception:
                # The refresher must outlive any bug in one attempt.
                log.exception("backend %s: refreshing the service login failed", self._name)


class ServiceTokenUnavailable(Exception):
    """No service token to send (login failing, backing off); carries the outcome."""

    def __init__(self, outcome: Unavailable) -> None:
        super().__init__(outcome.reason)
        self.outcome = outcome


class ServiceTokenAuth(httpx.Auth):
    """Sends the service token in ``X-Auth-Token``; after a 401, once more with a fresh
    one, never more (the second 401 is returned to the caller)."""

    def __init__(self, service: ServiceToken) -> None:
        self._service = service

    async def async_auth_flow(
        self, request: httpx.Request
    ) -> AsyncGenerator[httpx.Request, httpx.Response]:
        for attempt in (1, 2):
            # A login it needs is timed on the wire clock of the request it is for.
            wire = request.extensions.get(WIRE_KEY)
            token = await self._service.get(wire if isinstance(wire, WireTime) else None)
            if isinstance(token, Unavailable):
                raise ServiceTokenUnavailable(token)
            request.headers["X-Auth-Token"] = token
            response = yield request
            if response.status_code != 401:
                if response.status_code in (200, 404):
                    self._service.confirmed()
                return
            self._service.refused(token)
            if attempt == 2:
                return


async def send_with_service_token(
    send: Callable[[], Awaitable[httpx.Response]],
) -> httpx.Response | Unavailable:
    """Keystone's answer to a request made with :class:`ServiceTokenAuth`, or why none."""
    try:
        response = await send()
    except ServiceTokenUnavailable as exc:
        return exc.outcome
    except httpx.HTTPError as exc:
        return transport_failure(exc)
    if response.status_code == 401:
        return Unavailable("Keystone refused the gateway's service token (401)")
    return response
