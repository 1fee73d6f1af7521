"""The issuer's signing keys: discovery and JWKS, fetched like any IdP call.

Verification is local; the only calls to the issuer are key fetches, and they are
what a flood of crafted tokens would aim at. So every fetch goes through:

* one flight: concurrent needs share one fetch (:meth:`KeySource.refresh`);
* a deadline (the backend's ``timeouts``);
* a floor between fetches, ``min_refresh_seconds``: an unknown ``kid`` triggers at
  most one fetch per floor, and is refused locally in between;
* a breaker-like back-off after failures (doubling up to ``max_backoff_seconds``,
  longer when the issuer sends ``Retry-After``, but never past ``max_backoff_seconds``);
* the backend's call budget (the gateway's outbound token bucket), when it has one;
* in fleet mode, the fleet: a fetched set is shared (signed) through Redis, and one
  replica per floor may fetch, so a fleet fetches as often as one replica would.

A background task refetches before the set's lifetime ends (``Cache-Control:
max-age``, clamped). While the issuer is down, the last good set keeps verifying up
to ``max_stale_seconds`` past its lifetime, with a log line and a metric. A
successful fetch replaces the whole set, so a removed key stops verifying then.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import re
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

import httpx
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from backends.budget import CallBudget
from backends.flight import SingleFlight
from backends.jwt.jwks import MAX_JWKS_BYTES, KeySet, UnusableJWKS, VerificationKey, parse_jwks
from backends.retry_after import retry_after_seconds
from backends.shared import SharedBlobs
from backends.transports import AnswerRefused

log = logging.getLogger(__name__)

_MAX_AGE = re.compile(r"(?:^|,)\s*(?:s-)?max-age\s*=\s*\"?(\d+)")
# Names of the fleet-shared values (the gateway scopes them to the backend).
_SHARED_SET = "jwks"
_CLAIM = "jwks-fetch"
_FETCH = "fetch"  # the one flight key: there is one key set to fetch


class FetchFailed(Exception):
    """A discovery or JWKS fetch that gave no usable answer; ``str()`` is secret-free."""

    def __init__(self, reason: str, retry_after: float | None = None) -> None:
        super().__init__(reason)
        self.retry_after = retry_after


def max_age_seconds(response: httpx.Response) -> float | None:
    cache_control = response.headers.get("cache-control", "").lower()
    if "no-store" in cache_control or "no-cache" in cache_control:
        return 0.0
    match = _MAX_AGE.search(cache_control)
    return float(match.group(1)) if match else None


@dataclass
class FetchStats:
    by_result: dict[str, int] = field(default_factory=dict)
    stale_served: int = 0
    unknown_kid_refused: int = 0

    def count(self, result: str) -> None:
        self.by_result[result] = self.by_result.get(result, 0) + 1


@dataclass(frozen=True, slots=True)
class KeyPolicy:
    min_refresh_seconds: float
    default_refresh_seconds: float
    max_refresh_seconds: float
    max_stale_seconds: float
    max_backoff_seconds: float
    deadline_seconds: float


class KeySource:
    def __init__(
        self,
        issuer_url: str,
        discovery_url: str,
        client: httpx.AsyncClient,
        policy: KeyPolicy,
        budget: CallBudget | None = None,
        clock: Callable[[], float] = time.time,
        backend_name: str = "jwt",
        share: Callable[[], SharedBlobs | None] = lambda: None,
    ) -> None:
        self._issuer = issuer_url
        self._discovery_url = discovery_url
        self._client = client
        self._policy = policy
        self._budget = budget
        self._clock = clock
        self._name = backend_name
        self._share = share
        self._jwks_uri: str | None = None
        self._set: KeySet | None = None
        self._flights: SingleFlight[None] = SingleFlight()
        self._last_attempt = float("-inf")
        self._failures = 0
        self._blocked_until = float("-inf")
        self._stale_logged = False
        self._background: asyncio.Task[None] | None = None
        self._last_document: Any = None
        self.stats = FetchStats()

    # ---- what the verifier asks ------------------------------------------------
    def current(self) -> KeySet | None:
        """The key set to verify with now, or None (never fetched, or too stale)."""
        ks = self._set
        if ks is None:
            return None
        now = self._clock()
        if now <= ks.fresh_until:
            return ks
        if now > ks.fresh_until + self._policy.max_stale_seconds:
            return None
        if not self._stale_logged:
            self._stale_logged = True
            log.warning(
                "backend %s: issuer keys could not be refreshed; verifying with the last "
                "good key set, fetched %.0fs ago (usable for max_stale_seconds=%g past its "
                "lifetime)",
                self._name,
                now - ks.fetched_at,
                self._policy.max_stale_seconds,
            )
        self.stats.stale_served += 1
        return ks

    def may_fetch_now(self) -> bool:
        now = self._clock()
        if now < self._blocked_until:
            return False
        return now - self._last_attempt >= self._policy.min_refresh_seconds

    async def refresh(self, force: bool = False) -> None:
        """Fetch now if the floor and back-off allow it (or join the fetch in flight)."""
        if not self._flights.busy(_FETCH) and not force and not self.may_fetch_now():
            return
        await self._flights.do(_FETCH, self._fetch)

    # ---- background refresh ----------------------------------------------------
    def start(self) -> None:
        if self._background is None:
            self._background = asyncio.ensure_future(self._refresh_loop())

    async def close(self) -> None:
        if self._background is not None:
            self._background.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._background
        await self._flights.cancel_all()

    async def _refresh_loop(self) -> None:
        while True:
            try:
                await self.refresh()
            except Exception:
                # The loop must outlive any one refresh; _fetch logs its own failures.
                log.exception("backend %s: background key refresh raised", self._name)
            await asyncio.sleep(max(0.05, self._next_refresh_at() - self._clock()))

    def _next_refresh_at(self) -> float:
        now = self._clock()
        if now < self._blocked_until:
            return self._blocked_until
        floor = self._last_attempt + self._policy.min_refresh_seconds
        ks = self._set
        if ks is None:
            return floor
        # Refresh at 80 % of the lifetime, so a short outage never makes the set stale.
        due = ks.fetched_at + 0.8 * (ks.fresh_until - ks.fetched_at)
        return max(floor, due)

    # ---- the fetch itself --------------------------------------------------------
    async def _fetch(self) -> None:
        previous_attempt, self._last_attempt = self._last_attempt, self._clock()
        share = self._share()
        try:
            if share is not None and not await self._fleet_allows_fetch(share):
                return
        except Exception:
            # Sharing is an optimisation: a bug in it must not stop this replica fetching.
            log.exception("backend %s: fleet key sharing raised; fetching alone", self._name)
            share = None
        budget = self._budget
        if budget is not None and not await budget.acquire(0.0):
            # Our own budget said no: the issuer was not asked, so the refetch floor
            # (one fetch per min_refresh_seconds) is not spent either.
            self._last_attempt = previous_attempt
            self.stats.count("held_back")
            return
        try:
            async with asyncio.timeout(self._policy.deadline_seconds):
                keys, lifetime = await self._fetch_keys()
        except TimeoutError:
            self._failed(FetchFailed(f"no answer within {self._policy.deadline_seconds:g}s"))
        except FetchFailed as exc:
            self._failed(exc)
        except Exception:
            # A bug here must not end the refresh loop or reach a review.
            log.exception("backend %s: key fetch raised", self._name)
            self._failed(FetchFailed("internal error"))
        else:
            now = self._clock()
            self._install(KeySet(keys, now, now + lifetime, self._last_document))
            self.stats.count("ok")
            if share is not None:
                await self._publish(share)

    def _install(self, ks: KeySet) -> None:
        self._set = ks
        self._failures = 0
        self._blocked_until = float("-inf")
        if self._stale_logged:
            log.warning("backend %s: issuer keys refreshed; stale key set retired", self._name)
        self._stale_logged = False

    # ---- fleet sharing -------------------------------------------------------------
    async def _fleet_allows_fetch(self, share: SharedBlobs) -> bool:
        """Adopt a newer set from the fleet; True only if this replica should fetch."""
        await self._adopt(share)
        floor = self._policy.min_refresh_seconds
        ks = self._set
        if ks is not None and self._clock() - ks.fetched_at < floor:
            return False  # the fleet fetched within the floor: nothing newer to get
        if await share.claim(_CLAIM, floor):
            return True
        # Another replica is fetching now: wait for its set rather than fetch too.
        known = ks.fetched_at if ks is not None else float("-inf")
        deadline = time.monotonic() + self._policy.deadline_seconds
        while time.monotonic() < deadline:
            await asyncio.sleep(0.05)
            if await self._adopt(share) and self._set is not None and self._set.fetched_at > known:
                break
        return False

    async def _adopt(self, share: SharedBlobs) -> bool:
        raw = await share.get(_SHARED_SET)
        if raw is None:
            return False
        try:
            record = json.loads(raw)
            fetched_at, fresh_until = float(record["fetched_at"]), float(record["fresh_until"])
            keys = parse_jwks(record["jwks"])
        except (ValueError, KeyError, TypeError, UnusableJWKS):
            return False
        current = self._set
        if current is not None and current.fetched_at >= fetched_at:
            return False
        self._install(KeySet(keys, fetched_at, fresh_until, record["jwks"]))
        uri = record.get("jwks_uri")
        if self._jwks_uri is None and isinstance(uri, str) and uri.startswith("https://"):
            self._jwks_uri = uri  # signed by a replica that checked the discovery document
        self.stats.count("adopted")
        return True

    async def _publish(self, share: SharedBlobs) -> None:
        ks = self._set
        if ks is None or ks.document is None:
            return
        record = {
            "jwks": ks.document,
            "jwks_uri": self._jwks_uri,
            "fetched_at": ks.fetched_at,
            "fresh_until": ks.fresh_until,
        }
        # Kept as long as any replica could use it (its lifetime plus max_stale).
        ttl = ks.fresh_until - ks.fetched_at + self._policy.max_stale_seconds
        await share.put(_SHARED_SET, json.dumps(record).encode(), max(ttl, 1.0))

    def _failed(self, exc: FetchFailed) -> None:
        self._failures += 1
        backoff = min(
            self._policy.max_backoff_seconds,
            self._policy.min_refresh_seconds * 2 ** (self._failures - 1),
        )
        if exc.retry_after:
            backoff = max(backoff, exc.retry_after)
        self._blocked_until = self._clock() + backoff
        self.stats.count("failed")
        log.warning(
            "backend %s: key fetch failed (%s); next attempt in %.0fs", self._name, exc, backoff
        )

    async def _fetch_keys(self) -> tuple[tuple[VerificationKey, ...], float]:
        if self._jwks_uri is None:
            self._jwks_uri = await self._discover()
        response = await self._get(self._jwks_uri, "JWKS")
        if response.status_code in (404, 410):
            # The issuer moved its keys: rediscover on the next attempt.
            self._jwks_uri = None
        self._check_status(response, "JWKS")
        document = self._json(response, "JWKS")
        try:
            keys = parse_jwks(document)
        except UnusableJWKS as exc:
            raise FetchFailed(str(exc)) from None
        self._last_document = document
        age = max_age_seconds(response)
        p = self._policy
        lifetime = p.default_refresh_seconds if age is None else age
        return keys, min(max(lifetime, p.min_refresh_seconds), p.max_refresh_seconds)

    async def _discover(self) -> str:
        response = await self._get(self._discovery_url, "discovery")
        self._check_status(response, "discovery")
        doc = self._json(response, "discovery")
        if not isinstance(doc, dict):
            raise FetchFailed("discovery document is not an object")
        if doc.get("issuer") != self._issuer:
            # kube's rule: the document must be about this issuer, byte for byte.
            raise FetchFailed("discovery document names another issuer")
        jwks_uri = doc.get("jwks_uri")
        if not isinstance(jwks_uri, str) or not jwks_uri.startswith("https://"):
            raise FetchFailed("discovery document has no https jwks_uri")
        return jwks_uri

    async def _get(self, url: str, what: str) -> httpx.Response:
        try:
            return await self._client.get(url, headers={"accept": "application/json"})
        except httpx.TimeoutException:
            raise FetchFailed(f"{what}: timed out") from None
        except httpx.ConnectError:
            raise FetchFailed(f"{what}: connection failed") from None
        except AnswerRefused as exc:
            raise FetchFailed(f"{what}: {exc}") from None
        except httpx.HTTPError as exc:
            raise FetchFailed(f"{what}: transport error ({type(exc).__name__})") from None

    def _check_status(self, response: httpx.Response, what: str) -> None:
        if response.status_code == 200:
            return
        wait = None
        if response.status_code in (429, 503):
            # Honoured up to the back-off's own ceiling: one answer must not stop every
            # key fetch, the background refresh included, past max_backoff_seconds.
            wait = retry_after_seconds(
                response,
                cap=self._policy.max_backoff_seconds,
                cap_name="keys.max_backoff_seconds",
            )
        raise FetchFailed(f"{what}: issuer answered {response.status_code}", retry_after=wait)

    def _json(self, response: httpx.Response, what: str) -> Any:
        if len(response.content) > MAX_JWKS_BYTES:
            raise FetchFailed(f"{what}: document larger than {MAX_JWKS_BYTES} bytes")
        try:
            return response.json()
        except ValueError:
            raise FetchFailed(f"{what}: not JSON") from None

    # ---- metrics -----------------------------------------------------------------
    def metric_families(self, prefix: str) -> Iterable[Metric]:
        fetches = CounterMetricFamily(
            f"{prefix}_jwks_fetches",
            "Issuer key fetches, by result (adopted: taken from another replica).",
            labels=["backend", "result"],
        )
        for result, n in sorted(self.stats.by_result.items()):
            fetches.add_metric([self._name, result], n)
        yield fetches
        stale = CounterMetricFamily(
            f"{prefix}_jwks_stale_verifications",
            "Tokens verified with a key set past its lifetime (the issuer could not be reached).",
            labels=["backend"],
        )
        stale.add_metric([self._name], self.stats.stale_served)
        yield stale
        unknown = CounterMetricFamily(
            f"{prefix}_jwks_unknown_kid_refusals",
            "Tokens refused locally because their kid is not in the key set.",
            labels=["backend"],
        )
        unknown.add_metric([self._name], self.stats.unknown_kid_refused)
        yield unknown
        ks = self._set
        age = GaugeMetricFamily(
            f"{prefix}_jwks_age_seconds",
            "Seconds since the key set in use was fetched (absent before the first fetch).",
            labels=["backend"],
        )
        keys = GaugeMetricFamily(
            f"{prefix}_jwks_keys", "Usable keys in the key set in use.", labels=["backend"]
        )
        if ks is not None:
            age.add_metric([self._name], self._clock() - ks.fetched_at)
            keys.add_metric([self._name], len(ks.keys))
        yield age
        yield keys
