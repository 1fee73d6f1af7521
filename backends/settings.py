"""The settings base shared by the gateway and every backend.

Defaults and validation sit next to the field they belong to. Backend modules
subclass :class:`BackendSettings` and register it (:mod:`backends.registry`);
:mod:`authn_gateway.config` assembles the file.

Every number is finite and bounded (:mod:`backends.durations`); rates are written the
way limits writes them ("50/second", "3000/minute").
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Annotated, Any

from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    SecretStr,
    model_validator,
)

from backends.base import Backend
from backends.budget import UNLIMITED, CallBudget
from backends.durations import Age, Interval, Rate, Timeout, Wait, count, finite
from backends.files import SECRET_BYTES, FileRefused, read_text, shown


class Strict(BaseModel):
    """Unknown keys are errors: a typo in a config must not silently do nothing."""

    model_config = ConfigDict(extra="forbid", frozen=True)


def _resolve_secret(value: Any) -> Any:
    """``env:NAME`` reads an environment variable, ``file:PATH`` a file; else literal.

    Empty (or only whitespace) after that is refused, wherever the secret comes from: a
    Secret key missing in a deployment gives an empty variable or file, and an empty
    secret would let an empty credential match (a bearer with nothing after it, an LDAP
    unauthenticated bind). The message names where it came from, never the value.
    """
    if isinstance(value, SecretStr):
        where, resolved = "the value", value
    elif not isinstance(value, str):
        return value
    elif value.startswith("env:"):
        name = value[4:]
        if name not in os.environ:
            raise ValueError(f"environment variable {name} is not set")
        where, resolved = f"environment variable {name}", SecretStr(os.environ[name])
    elif value.startswith("file:"):
        path = Path(value[5:])
        try:
            # No more than a secret can be, from a regular file: file:/dev/zero must not
            # fill the memory, nor a FIFO hang the start.
            resolved = SecretStr(read_text(path, SECRET_BYTES).strip())
        except FileRefused as exc:
            raise ValueError(f"secret file {exc}") from None
        where = f"secret file {shown(path)}"
    else:
        where, resolved = "the value", SecretStr(value)
    if not resolved.get_secret_value().strip():
        raise ValueError(f"must not be empty ({where} is empty or only whitespace)")
    return resolved


#: The longest file name and path Linux's open() takes (NAME_MAX, PATH_MAX).
NAME_MAX, PATH_MAX = 255, 4095


def usable_path(path: Path) -> Path:
    """``path`` if open() can take it; else a ValueError saying why, never a traceback
    later when the gateway opens it (a NUL is a ValueError there, a long name an OSError
    at start-up)."""
    text = str(path)
    if not text or text == ".":
        raise ValueError("must name a file")
    if "\x00" in text:
        raise ValueError("must not contain a NUL character")
    if len(os.fsencode(text)) > PATH_MAX:
        raise ValueError(f"longer than {PATH_MAX} bytes")
    if any(len(os.fsencode(part)) > NAME_MAX for part in path.parts):
        raise ValueError(f"has a name longer than {NAME_MAX} bytes")
    return path


#: A file the config names (read or written): a path open() can take.
FilePath = Annotated[Path, AfterValidator(usable_path)]

#: A secret given literally, as ``env:NAME`` or as ``file:/path``. Never printed.
Secret = Annotated[SecretStr, BeforeValidator(_resolve_secret)]

#: A share of calls, (0, 1].
Share = Annotated[float, finite(gt=0, le=1)]


class TimeoutSettings(Strict):
    """Deadlines for one backend call; well under kube-apiserver's 30 s webhook timeout."""

    connect_seconds: Timeout = 1.0
    read_seconds: Timeout = 2.0
    total_seconds: Timeout = 2.0


class CacheSettings(Strict):
    positive_ttl_seconds: Age = 300.0
    negative_ttl_seconds: Age = 30.0
    # Negative TTLs are spread by +/- this fraction so expiries don't synchronise.
    negative_jitter: Annotated[float, finite(ge=0, le=0.5)] = 0.1
    # How long past its TTL a positive entry may be served while the IdP cannot
    # answer. 0 disables serving stale identities. Read when an entry is: a reload that
    # raises or lowers it applies at once to every entry already cached.
    max_stale_seconds: Age = 3600.0
    # How long past its TTL an identity is kept (in process and in Redis), whatever
    # max_stale says: the ceiling up to which max_stale_seconds can be raised later
    # and still reach the entries cached before. Capped by the token's expiry.
    keep_stale_seconds: Age = 86400.0
    # Answer a known user's entry past its TTL (within max_stale) at once and refresh
    # it in the background, so a slow IdP adds no latency to known users. Off: a
    # revoked token then stays accepted until the refresh answers (docs/security.md).
    stale_while_revalidate: bool = False

    @model_validator(mode="after")
    def _check_stale(self) -> CacheSettings:
        if self.max_stale_seconds > self.keep_stale_seconds:
            raise ValueError(
                f"max_stale_seconds: {self.max_stale_seconds:g} is above keep_stale_seconds "
                f"({self.keep_stale_seconds:g}), how long entries are kept; raise "
                "keep_stale_seconds too (entries cached before keep their old ceiling)"
            )
        return self


class FailureRateSettings(Strict):
    """Also open when this share of the calls in the window were unavailable.

    Catches an IdP that fails often but not N times in a row (a flapping load balancer
    member, 30 % 503s), which the consecutive count never sees.
    """

    threshold: Share = 0.5
    window_seconds: Interval = 30.0
    # Fewer calls than this in the window say nothing: quiet periods must not trip it.
    min_calls: Annotated[int, count(le=1_000_000)] = 20


class SlowCallSettings(Strict):
    """Also open when this share of the calls in the window were slow.

    resilience4j's ``slowCallDurationThreshold`` and ``slowCallRateThreshold``: an IdP
    that still answers, but late, is in trouble before it fails. Every call counts,
    failed ones too (a timeout is slow). Counted while closed; a half-open probe is judged
    by its answer alone (a restarted IdP's first answer is often slow).
    """

    # A call that took at least this long is slow; unset: half the backend's
    # timeouts.total_seconds.
    duration_threshold_seconds: Timeout | None = None
    rate_threshold: Share = 0.8
    window_seconds: Interval = 10.0
    # Fewer calls than this in the window never trip it.
    min_calls: Annotated[int, count(le=1_000_000)] = 20


#: breaker.max_retry_after_seconds unless set: the longest one IdP answer holds a path back.
DEFAULT_MAX_RETRY_AFTER_SECONDS = 300.0


class BreakerSettings(Strict):
    # Consecutive unavailable answers that open the breaker.
    fail_max: Annotated[int, count(le=1_000_000)] = 5
    reset_timeout_seconds: Interval = 10.0
    # Calls admitted while half-open, in total (fleet-wide with Redis).
    half_open_probes: Annotated[int, count(le=10_000)] = 1
    # Optional second trip condition; off when unset.
    failure_rate: FailureRateSettings | None = None
    # Longest the breaker stays open because the IdP said so (Retry-After,
    # RateLimit-Reset); longer requests are cut to this.
    max_retry_after_seconds: Interval = DEFAULT_MAX_RETRY_AFTER_SECONDS
    # Slow-call trip condition; on by default, off with `slow_calls: null`.
    slow_calls: SlowCallSettings | None = Field(default_factory=SlowCallSettings)
    # While an operator forces the breaker closed nothing sheds a hanging IdP, so a
    # review that has a stale entry waits at most this long before it is answered
    # stale (the call goes on in the background and refreshes the entry).
    forced_closed_stale_wait_seconds: Timeout = 0.5


class BucketSettings(Strict):
    """Token bucket on calls *to* the IdP (R per second, burst B)."""

    rate: Rate = 50.0
    burst: Annotated[int, count()] = 100
    # Wait this long for a token before answering from stale cache or unavailable.
    max_wait_seconds: Wait = 0.0


class ConcurrencySettings(Strict):
    """Adaptive limit on calls in flight to the IdP, found from its latency (Vegas).

    Nothing here needs tuning per IdP; see docs/decisions.md. The bucket stays the
    hard ceiling on the call rate.
    """

    enabled: bool = True
    initial_limit: Annotated[int, count(le=100_000)] = 20
    min_limit: Annotated[int, count(le=100_000)] = 1
    max_limit: Annotated[int, count(le=100_000)] = 200
    # Calls the limit lets wait in the IdP's own queue (low, high). In fleet mode each
    # replica aims at its share: queue / redis.expected_replicas.
    queue_low: Annotated[float, finite(gt=0, le=100_000)] = 3.0
    queue_high: Annotated[float, finite(gt=0, le=100_000)] = 6.0

    @model_validator(mode="after")
    def _check_bounds(self) -> ConcurrencySettings:
        if not self.min_limit <= self.initial_limit <= self.max_limit:
            raise ValueError("initial_limit: must be between min_limit and max_limit")
        if self.queue_low >= self.queue_high:
            raise ValueError("queue_low: must be below queue_high")
        return self


#: A token is inside a review body, which server.max_body_bytes caps at 16 MiB.
MAX_TOKEN_BYTES = 16 * 1024 * 1024


class TokenRules(Strict):
    """Local pre-rejection: tokens that break these never reach the IdP."""

    min_length: Annotated[int, count(le=MAX_TOKEN_BYTES)] = 1
    max_length: Annotated[int, count(le=MAX_TOKEN_BYTES)] = 4096


class BackendSettings(Strict):
    """Fields every backend shares. Subclasses add their own fields, and narrow ``type``
    to a literal (their registered name, see :mod:`backends.registry`)."""

    type: str
    name: Annotated[str, Field(min_length=1, max_length=63, pattern=r"^[a-z0-9][a-z0-9_-]*$")]
    # Tokens starting with this prefix go to this backend only.
    prefix: str | None = None
    # Remove the prefix before the token is sent to the IdP.
    strip_prefix: bool = False
    # Whether tokens that match no prefix may try this backend, in file order.
    in_chain: bool | None = None
    # Audiences this backend's tokens are valid for; [] inherits the gateway's.
    audiences: list[str] = Field(default_factory=list)
    timeouts: TimeoutSettings = Field(default_factory=TimeoutSettings)
    cache: CacheSettings | None = None
    breaker: BreakerSettings = Field(default_factory=BreakerSettings)
    bucket: BucketSettings = Field(default_factory=BucketSettings)
    concurrency: ConcurrencySettings = Field(default_factory=ConcurrencySettings)
    token_rules: TokenRules = Field(default_factory=TokenRules)

    @model_validator(mode="after")
    def _check_shape(self) -> BackendSettings:
        if self.prefix == "":
            raise ValueError("prefix: must not be empty (omit it instead)")
        if self.strip_prefix and not self.prefix:
            raise ValueError("strip_prefix: needs a prefix")
        if self.token_rules.min_length > self.token_rules.max_length:
            raise ValueError("token_rules.min_length: must be <= max_length")
        return self

    def build(self, budget: CallBudget = UNLIMITED) -> Backend:
        """The backend these settings describe (each backend type implements this).

        ``budget`` pays for the backend's follow-up calls (see :mod:`backends.budget`).
        """
        raise NotImplementedError

    @property
    def chained(self) -> bool:
        """Backends with no prefix are in the chain unless told otherwise."""
        return self.in_chain if self.in_chain is not None else self.prefix is None
