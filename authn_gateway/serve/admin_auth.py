"""Who may use the admin API: the admin token, and a brake on whoever keeps guessing it.

The token is compared in constant time, and an empty bearer matches nothing. Every
failed attempt is counted (``authn_gateway_admin_auth_failures_total``, which the
AuthnGatewayAdminAuthFailures alert watches) and limited, so a guesser gets a few
tries a minute instead of thousands a second:

* **per source address**: :data:`PER_SOURCE_BURST` failures, then one more every
  :data:`PER_SOURCE_INTERVAL` seconds. Past that, the source is answered 429 (with
  Retry-After) before its token is looked at, so a guess there costs nothing and
  teaches nothing.
* **overall**: :data:`OVERALL_BURST` failures from all sources together, then one a
  :data:`OVERALL_INTERVAL`. Past that, a source that failed within
  :data:`SUSPECT_SECONDS` is answered 429 unchecked; a source with no recent failure is
  still checked, so an operator at another address still gets in while guesses from
  many addresses come at one per address.

Failures are GCRA buckets (:func:`authn_gateway.layers.bucket.gcra.gcra`), in this process:
each worker and each replica keeps its own. A request with the right token is never
counted, whatever it asks afterwards.
"""

from __future__ import annotations

import hmac
import logging
import math
import time
from collections.abc import Callable
from dataclasses import dataclass

from pydantic import SecretStr
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from authn_gateway.edge.callerauth import bearer_token
from authn_gateway.edge.ratelog import RateLimitedLog
from authn_gateway.layers.bucket.gcra import EPSILON, gcra
from authn_gateway.observe.metrics import Metrics
from authn_gateway.serve.metrics import ServeMetrics

log = logging.getLogger(__name__)

PER_SOURCE_BURST = 10
PER_SOURCE_INTERVAL = 6.0  # 10 a minute once the burst is spent
OVERALL_BURST = 100
OVERALL_INTERVAL = 1.0
# How long a source that failed stays suspect while the overall budget is spent.
SUSPECT_SECONDS = 900.0
# Sources remembered at most; past it (and after forgetting the ones long quiet) a source
# not remembered counts as suspect, so cycling addresses cannot wash a record clean.
MAX_SOURCES = 10_000
OVERALL = "\0overall"


@dataclass(slots=True)
class _Record:
    tat: float  # the failure bucket's theoretical arrival time (GCRA)
    last_failure: float


class AdminGuard:
    """The admin token check shared by every /admin route of one gateway."""

    def __init__(
        self,
        token: SecretStr,
        metrics: Metrics,
        clock: Callable[[], float] = time.monotonic,
        max_sources: int = MAX_SOURCES,
    ) -> None:
        expected = token.get_secret_value().strip().encode()
        # The config refuses empty and weak tokens (StrongSecret); never compare with one.
        self._expected = expected or None
        self._failures = metrics.group(ServeMetrics).admin_auth_failures
        self._clock = clock
        self._max_sources = max_sources
        self._sources: dict[str, _Record] = {}
        self._overall_tat = 0.0
        # One line per reason per 10 s, with the address of the one logged: a guesser
        # cannot flood the log, and the operator learns where guesses come from.
        self._log = RateLimitedLog(log, interval=10.0)

    def refusal(self, request: Request) -> Response | None:
        """None when ``request`` carries the admin token; else the answer to send it."""
        source = request.client.host if request.client else "unknown"
        now = self._clock()
        wait = self._throttled(source, now)
        if wait is not None:
            self._refused("throttled", source)
            return JSONResponse(
                {"message": "too many failed admin authentications; retry later"},
                status_code=429,
                headers={"retry-after": str(max(1, math.ceil(wait)))},
            )
        header = request.headers.get("authorization")
        given = bearer_token(header.encode("latin-1")) if header is not None else None
        if (
            given is not None
            and self._expected is not None
            and hmac.compare_digest(given, self._expected)
        ):
            return None
        self._failed(source, now)
        self._refused("missing" if given is None else "wrong", source)
        return JSONResponse(
            {"message": "unauthorized"}, status_code=401, headers={"www-authenticate": "Bearer"}
        )

    def _refused(self, reason: str, source: str) -> None:
        self._failures.labels(reason).inc()
        self._log.warning(reason, "admin API: credentials refused (%s) from %s", reason, source)

    def _throttled(self, source: str, now: float) -> float | None:
        """Seconds until ``source`` may try again, or None when it may try now."""
        record = self._sources.get(source)
        if record is not None:
            wait = _wait(record.tat, now, PER_SOURCE_INTERVAL, PER_SOURCE_BURST)
            if wait > 0:
                return wait
        wait = _wait(self._overall_tat, now, OVERALL_INTERVAL, OVERALL_BURST)
        if wait > 0 and self._suspect(record, now):
            return wait
        return None

    def _suspect(self, record: _Record | None, now: float) -> bool:
        if record is None:
            return len(self._sources) >= self._max_sources
        return now - record.last_failure < SUSPECT_SECONDS

    def _failed(self, source: str, now: float) -> None:
        # A spent bucket is left as it is (GCRA's refusal), so failures from new
        # addresses while it is spent do not push its refill further out.
        self._overall_tat, _ = gcra(self._overall_tat, now, OVERALL_INTERVAL, OVERALL_BURST, 0.0)
        record = self._sources.get(source)
        if record is None:
            if len(self._sources) >= self._max_sources:
                self._forget_quiet(now)
            if len(self._sources) >= self._max_sources:
                return  # full of live records: an unknown source counts as suspect anyway
            record = self._sources[source] = _Record(0.0, now)
        record.tat, _ = gcra(record.tat, now, PER_SOURCE_INTERVAL, PER_SOURCE_BURST, 0.0)
        record.last_failure = now

    def _forget_quiet(self, now: float) -> None:
        """Drop the sources whose bucket has refilled and that are no longer suspect:
        forgetting them is exact."""
        self._sources = {
            source: record
            for source, record in self._sources.items()
            if record.tat > now or now - record.last_failure < SUSPECT_SECONDS
        }


def _wait(tat: float, now: float, interval: float, burst: int) -> float:
    """Seconds until the failure bucket takes one more (0: it would now)."""
    _, wait = gcra(tat, now, interval, burst, math.inf)
    assert wait is not None  # no wait is too long for an infinite max_wait
    return wait if wait > EPSILON else 0.0
