"""Locust users that call the gateway the way kube-apiserver calls its token webhook.

Each user is one kube-apiserver connection: ``POST /authenticate?timeout=30s`` with a
TokenReview (v1 or v1beta1) over one keep-alive connection, retrying the way
kube-apiserver's webhook client does (:class:`Retrier`). Tokens come from populations
(:class:`Tokens`): a hot set of valid tokens, a long tail of cold valid ones,
invalid ones and Kubernetes service-account JWTs.

Every HTTP attempt is a locust request named ``attempt``; every finished review is a
``REVIEW`` event named for its answer (authenticated, rejected, unavailable,
http_<status>, conn_error), whose ``response_length`` is the number of attempts it
took. So amplification is visible: attempts / reviews.

Configured by environment variables, because locust owns the command line:

=========================  ====================================================
``LOADTEST_HOSTS``         comma-separated gateway URLs; user *i* uses host i % n
``LOADTEST_TOKENS``        ``idp`` (fake IdP), ``keystone`` or ``gitlab``
``LOADTEST_MIX``           e.g. ``hot=0.85,cold=0.05,invalid=0.05,sa=0.05``
``LOADTEST_HOT``           size of the hot set (200)
``LOADTEST_COLD``          size of the cold population (1,000,000)
``LOADTEST_RATE``          reviews per second per user (constant throughput, 10)
``LOADTEST_V1BETA1``       share of reviews sent as v1beta1 (0.2)
``LOADTEST_REAUTH_URL``    Keystone URL: clients whose valid token was refused
                           get a new one there and use it (the incident's storm)
``LOADTEST_TIMELINE``      where to write the per-second timeline (JSON) at exit
``LOADTEST_DEADLINE``      seconds a review may take before it counts as late (30)
=========================  ====================================================
"""

from __future__ import annotations

import base64
import json
import os
import random
import time
import uuid
from collections import Counter, defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

V1 = "authentication.k8s.io/v1"
V1BETA1 = "authentication.k8s.io/v1beta1"
REVIEW_PATH = "/authenticate?timeout=30s"

# ---------------------------------------------------------------------------------
# kube-apiserver's retry policy, as pure logic so it can be tested without locust.
# ---------------------------------------------------------------------------------

#: Statuses kube-apiserver's webhook backoff retries (plus connection resets).
RETRY_STATUSES = frozenset({500, 502, 504, 429})


@dataclass(frozen=True)
class RetryPolicy:
    """k8s.io/apiserver webhook.DefaultRetryBackoffWithInitialDelay(500ms) and client-go's
    Retry-After handling."""

    attempts: int = 5
    initial: float = 0.5
    factor: float = 1.5
    jitter: float = 0.2
    # While the server sends Retry-After (on 429 or 5xx), client-go waits and tries
    # again; the harness does so once per second for up to 30 s.
    retry_after_interval: float = 1.0
    retry_after_window: float = 30.0


class Retrier:
    """The retry decisions for one review: feed it each attempt's result in turn.

    :meth:`after` returns the seconds to wait before the next attempt, or None to stop.
    Backoff attempts and Retry-After attempts are counted separately, as in
    kube-apiserver, where the REST client's Retry-After loop runs inside each backoff
    step.
    """

    def __init__(
        self,
        policy: RetryPolicy = RetryPolicy(),
        clock: Callable[[], float] = time.monotonic,
        rng: Callable[[], float] = random.random,
    ) -> None:
        self.policy = policy
        self.clock = clock
        self.rng = rng
        self.backoff_attempts = 1
        self._delay = policy.initial
        self._retry_after_since: float | None = None

    def after(
        self, status: int | None, *, retry_after: bool = False, connection_reset: bool = False
    ) -> float | None:
        """``status`` is None when the attempt got no HTTP answer (see connection_reset)."""
        p = self.policy
        if status is None and not connection_reset:
            # Refused connections, timeouts: kube-apiserver's ShouldRetry says no.
            return None
        if status is not None and retry_after and (status == 429 or status >= 500):
            now = self.clock()
            if self._retry_after_since is None:
                self._retry_after_since = now
            if now - self._retry_after_since < p.retry_after_window:
                return p.retry_after_interval
        elif status is not None:
            self._retry_after_since = None
        if status is not None and status not in RETRY_STATUSES:
            # 200, other 4xx, 503 without Retry-After: the answer stands.
            return None
        if self.backoff_attempts >= p.attempts:
            return None
        self.backoff_attempts += 1
        # wait.Jitter: d + rand * jitter * d
        delay = self._delay * (1 + p.jitter * self.rng())
        self._delay *= p.factor
        return delay


@dataclass(frozen=True)
class Attempt:
    """One HTTP attempt's result, as the retry policy sees it."""

    status: int | None  # None: no HTTP answer
    retry_after: bool = False
    connection_reset: bool = False
    body: bytes = b""


def call_with_retries(
    attempt: Callable[[], Attempt],
    retrier: Retrier,
    sleep: Callable[[float], None] = time.sleep,
) -> tuple[Attempt, int]:
    """Run ``attempt`` until the policy says stop; return the last result and the count."""
    count = 0
    while True:
        count += 1
        result = attempt()
        delay = retrier.after(
            result.status, retry_after=result.retry_after, connection_reset=result.connection_reset
        )
        if delay is None:
            return result, count
        sleep(delay)


# ---------------------------------------------------------------------------------
# Token populations
# ---------------------------------------------------------------------------------


def _b64(raw: bytes) -> str:
    return base64.urlsafe_b64encode(raw).rstrip(b"=").decode()


def service_account_jwt(namespace: str, name: str, rng: random.Random) -> str:
    """A legacy (secret-based) service-account token as kube-controller-manager mints it:
    RS256, iss ``kubernetes/serviceaccount``, a 256-byte signature."""
    header = {"alg": "RS256", "kid": _b64(rng.randbytes(32))}
    secret = f"{name}-token-{''.join(rng.choices('bcdfghjklmnpqrstvwxz2456789', k=5))}"
    claims = {
        "iss": "kubernetes/serviceaccount",
        "kubernetes.io/serviceaccount/namespace": namespace,
        "kubernetes.io/serviceaccount/secret.name": secret,
        "kubernetes.io/serviceaccount/service-account.name": name,
        "kubernetes.io/serviceaccount/service-account.uid": str(
            uuid.UUID(int=rng.getrandbits(128))
        ),
        "sub": f"system:serviceaccount:{namespace}:{name}",
    }
    parts = [json.dumps(d, separators=(",", ":")).encode() for d in (header, claims)]
    return ".".join([_b64(parts[0]), _b64(parts[1]), _b64(rng.randbytes(256))])


@dataclass
class Tokens:
    """Draws tokens from the populations, in the proportions of ``mix``.

    ``valid(name, n)`` makes the n-th valid token of user ``name`` and ``invalid(i)``
    the i-th invalid one, in the syntax of the IdP under test.
    """

    valid: Callable[[str, int], str]
    invalid: Callable[[int], str]
    mix: dict[str, float]
    hot: int = 200
    cold: int = 1_000_000
    invalid_count: int = 50
    service_accounts: int = 100
    rng: random.Random = field(default_factory=random.Random)
    # A client that re-authenticated replaces its hot token (see LOADTEST_REAUTH_URL).
    replaced: dict[int, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        seed = random.Random(9)
        self._hot = [self.valid(f"hot{i}", 0) for i in range(self.hot)]
        self._invalid = [self.invalid(i) for i in range(self.invalid_count)]
        self._sa = [
            service_account_jwt(f"ns{i % 7}", f"sa{i}", seed) for i in range(self.service_accounts)
        ]
        self._kinds = list(self.mix)
        self._weights = [self.mix[k] for k in self._kinds]

    def hot_tokens(self) -> list[str]:
        return list(self._hot)

    def draw(self) -> tuple[str, str, int | None]:
        """(population, token, hot index or None)."""
        kind = self.rng.choices(self._kinds, self._weights)[0]
        if kind == "hot":
            i = self.rng.randrange(self.hot)
            return kind, self.replaced.get(i, self._hot[i]), i
        if kind == "cold":
            n = self.rng.randrange(self.cold)
            return kind, self.valid(f"cold{n}", n), None
        if kind == "invalid":
            return kind, self.rng.choice(self._invalid), None
        return "sa", self.rng.choice(self._sa), None


def parse_mix(text: str) -> dict[str, float]:
    mix: dict[str, float] = {}
    for part in text.split(","):
        name, _, weight = part.partition("=")
        if name.strip() not in ("hot", "cold", "invalid", "sa"):
            raise ValueError(f"LOADTEST_MIX: unknown population {name.strip()!r}")
        mix[name.strip()] = float(weight)
    return mix


def idp_tokens(mix: dict[str, float], hot: int, cold: int) -> Tokens:
    return Tokens(lambda name, n: f"good-{name}", lambda i: f"bad-{i:08d}", mix, hot, cold)


def keystone_tokens(mix: dict[str, float], hot: int, cold: int) -> Tokens:
    from tests.support.fakes.keystone import mint_token

    def invalid(i: int) -> str:
        # Well-formed but with a broken HMAC: Keystone answers 404 (unknown token).
        good = mint_token(f"gone{i}", nonce=i)
        return good[:-8] + ("A" if good[-8] != "A" else "B") + good[-7:]

    return Tokens(lambda name, n: mint_token(name, nonce=n), invalid, mix, hot, cold)


#: Users in the fake GitLab's synthetic seed (``--synthetic-users``); tokens outside it
#: are unknown to GitLab.
GITLAB_USERS = 20_000


def gitlab_tokens(mix: dict[str, float], hot: int, cold: int) -> Tokens:
    """Personal access tokens of the fake GitLab's synthetic users (see its synthetic_seed)."""

    def valid(name: str, n: int) -> str:
        if name.startswith("hot"):
            i = int(name[3:]) % GITLAB_USERS
        else:
            i = hot + n % max(1, GITLAB_USERS - hot)
        return f"glpat-load-{i + 1:08d}-fake"

    return Tokens(valid, lambda i: f"glpat-gone-{i:08d}-fake", mix, hot, cold)


TOKEN_KINDS = {"idp": idp_tokens, "keystone": keystone_tokens, "gitlab": gitlab_tokens}


def review_body(token: str, api_version: str) -> dict[str, Any]:
    return {"apiVersion": api_version, "kind": "TokenReview", "spec": {"token": token}}


def classify(status: int, body: bytes) -> str:
    """The answer kube-apiserver would act on."""
    if status != 200:
        return f"http_{status}"
    try:
        doc = json.loads(body)
        st = doc.get("status") or {}
    except (ValueError, AttributeError):
        return "bad_body"
    if st.get("authenticated"):
        return "authenticated"
    return "unavailable" if st.get("error") else "rejected"


# ---------------------------------------------------------------------------------
# Per-second timeline, written at exit for the runner's plot
# ---------------------------------------------------------------------------------


@dataclass
class Second:
    attempts: int = 0
    statuses: Counter[str] = field(default_factory=Counter)
    answers: Counter[str] = field(default_factory=Counter)
    latencies: list[float] = field(default_factory=list)
    reauths: int = 0


class Timeline:
    def __init__(self, deadline: float) -> None:
        self.deadline_ms = deadline * 1000
        self.seconds: dict[int, Second] = defaultdict(Second)
        self.late = 0
        self.max_ms = 0.0

    def attempt(self, status: int) -> None:
        s = self.seconds[int(time.time())]
        s.attempts += 1
        s.statuses[str(status)] += 1

    def review(self, answer: str, ms: float) -> None:
        s = self.seconds[int(time.time())]
        s.answers[answer] += 1
        s.latencies.append(ms)
        self.max_ms = max(self.max_ms, ms)
        if ms > self.deadline_ms:
            self.late += 1

    def reauth(self) -> None:
        self.seconds[int(time.time())].reauths += 1

    def dump(self) -> dict[str, Any]:
        rows = []
        for sec in sorted(self.seconds):
            s = self.seconds[sec]
            lat = sorted(s.latencies)
            rows.append(
                {
                    "t": sec,
                    "attempts": s.attempts,
                    "statuses": dict(s.statuses),
                    "answers": dict(s.answers),
                    "p50_ms": _pct(lat, 0.50),
                    "p99_ms": _pct(lat, 0.99),
                    "reauths": s.reauths,
                }
            )
        all_lat = sorted(x for s in self.seconds.values() for x in s.latencies)
        return {
            "rows": rows,
            "late": self.late,
            "max_ms": self.max_ms,
            "p50_ms": _pct(all_lat, 0.50),
            "p99_ms": _pct(all_lat, 0.99),
        }


def _pct(sorted_values: list[float], q: float) -> float | None:
    if not sorted_values:
        return None
    return sorted_values[min(len(sorted_values) - 1, int(q * len(sorted_values)))]


# ---------------------------------------------------------------------------------
# The locust user. Defined only when locust loads this file (as module "locustfile"):
# importing locust monkey-patches the process with gevent, which the runner and the
# tests that import the logic above must not get.
# ---------------------------------------------------------------------------------

if __name__ == "locustfile":
    import gevent  # type: ignore[import-untyped]
    from locust import constant_throughput, events, task
    from locust.contrib.fasthttp import FastHttpSession, FastHttpUser

    _HOSTS = [h for h in os.environ.get("LOADTEST_HOSTS", "").split(",") if h]
    _KIND = os.environ.get("LOADTEST_TOKENS", "idp")
    _TOKENS = TOKEN_KINDS[_KIND](
        parse_mix(os.environ.get("LOADTEST_MIX", "hot=0.85,cold=0.05,invalid=0.05,sa=0.05")),
        int(os.environ.get("LOADTEST_HOT", "200")),
        int(os.environ.get("LOADTEST_COLD", "1000000")),
    )
    _V1BETA1 = float(os.environ.get("LOADTEST_V1BETA1", "0.2"))
    _REAUTH_URL = os.environ.get("LOADTEST_REAUTH_URL")
    _TIMELINE = Timeline(float(os.environ.get("LOADTEST_DEADLINE", "30")))
    _user_seq = iter(range(1 << 30))

    @events.quitting.add_listener  # type: ignore[untyped-decorator]
    def _write_timeline(environment: Any, **_: Any) -> None:
        path = os.environ.get("LOADTEST_TIMELINE")
        if path:
            with open(path, "w") as fh:
                json.dump(_TIMELINE.dump(), fh)

    class KubeApiserver(FastHttpUser):
        """One kube-apiserver connection to the webhook."""

        # One keep-alive connection per user, as kube-apiserver's webhook client has.
        concurrency = 1
        network_timeout = 30.0  # the ?timeout=30s kube-apiserver sends
        connection_timeout = 5.0
        wait_time = constant_throughput(float(os.environ.get("LOADTEST_RATE", "10")))

        def __init__(self, environment: Any) -> None:
            if _HOSTS:
                self.host = _HOSTS[next(_user_seq) % len(_HOSTS)]
            super().__init__(environment)
            self.keystone = (
                FastHttpSession(
                    base_url=_REAUTH_URL,
                    request_event=environment.events.request,
                    user=self,
                    network_timeout=5.0,
                    connection_timeout=2.0,
                )
                if _REAUTH_URL
                else None
            )

        @task
        def review(self) -> None:
            population, token, hot_index = _TOKENS.draw()
            api_version = V1BETA1 if random.random() < _V1BETA1 else V1
            answer = self.review_once(token, api_version)
            if (
                self.keystone is not None
                and population in ("hot", "cold")
                and answer != "authenticated"
            ):
                self.reauthenticate(population, hot_index)

        def review_once(self, token: str, api_version: str) -> str:
            body = json.dumps(review_body(token, api_version))
            started = time.perf_counter()
            result, attempts = call_with_retries(
                lambda: self.attempt(body), Retrier(), sleep=gevent.sleep
            )
            ms = (time.perf_counter() - started) * 1000
            status = result.status
            answer = "conn_error" if status is None else classify(status, result.body)
            _TIMELINE.review(answer, ms)
            self.environment.events.request.fire(
                request_type="REVIEW",
                name=answer,
                response_time=ms,
                response_length=attempts,
                exception=None,
                context={},
            )
            return answer

        def attempt(self, body: str) -> Attempt:
            resp = self.client.post(
                REVIEW_PATH,
                data=body,
                headers={"Content-Type": "application/json", "Accept": "application/json"},
                name="attempt",
            )
            status = resp.status_code or None
            _TIMELINE.attempt(status or 0)
            if status is None:
                error = getattr(resp, "error", None)
                return Attempt(None, connection_reset=isinstance(error, ConnectionResetError))
            retry_after = bool(resp.headers and resp.headers.get("retry-after"))
            return Attempt(status, retry_after=retry_after, body=resp.content or b"")

        def reauthenticate(self, population: str, hot_index: int | None) -> None:
            """A client told "unauthorized" asks Keystone for a new token and uses it."""
            assert self.keystone is not None
            name = f"hot{hot_index}" if hot_index is not None else f"client{random.randrange(1000)}"
            _TIMELINE.reauth()
            resp = self.keystone.post(
                "/v3/auth/tokens",
                json={
                    "auth": {
                        "identity": {
                            "methods": ["password"],
                            "password": {
                                "user": {
                                    "name": name,
                                    "domain": {"name": "Default"},
                                    "password": f"pw-{name}",
                                }
                            },
                        },
                        "scope": {"project": {"name": "demo", "domain": {"name": "Default"}}},
                    }
                },
                name="keystone reauth",
            )
            header = resp.headers.get("x-subject-token") if resp.headers else None
            new = header if isinstance(header, str) else None
            if new and hot_index is not None:
                _TOKENS.replaced[hot_index] = new
            elif new:
                self.review_once(new, V1)
