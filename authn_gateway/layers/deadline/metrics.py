"""The backend calls' metrics, counted by the deadline layer around every call: calls
and latency by outcome, rejections by cause, the last definite answer, the gateway's
own delay and timeouts, and answers that say our own credentials are wrong
(:class:`CallMetrics`)."""

from __future__ import annotations

import time

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from authn_gateway.observe.metrics import LATENCY_BUCKETS, PREFIX, MetricsGroup
from backends.base import Authenticated, Outcome, Rejected


class CallMetrics(MetricsGroup):
    def __init__(self, registry: CollectorRegistry) -> None:
        super().__init__(registry)
        r = registry
        self.calls = Counter(
            f"{PREFIX}_backend_calls",
            "Calls that reached an identity provider, by outcome.",
            ["backend", "outcome"],
            registry=r,
        )
        self.latency = Histogram(
            f"{PREFIX}_backend_call_duration_seconds",
            "Latency of calls to an identity provider.",
            ["backend"],
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self.rejections = Counter(
            f"{PREFIX}_backend_rejections",
            "Rejections answered by backend calls, by cause: idp (the IdP refused the token), "
            "unsendable (the protocol cannot carry the token), unmapped (the IdP's answer "
            "lacks what the identity mapping needs, or has more groups than the gateway reads).",
            ["backend", "cause"],
            registry=r,
        )
        self.misconfigured_answers = Counter(
            f"{PREFIX}_backend_config_errors",
            "Answers that mean the gateway's own IdP credentials or permissions are wrong.",
            ["backend"],
            registry=r,
        )
        self.own_delay_seconds = Counter(
            f"{PREFIX}_backend_call_own_delay_seconds",
            "Time answers to IdP calls waited for the gateway's own event loop (CPU "
            "starvation); left out of the latency the concurrency limit and the "
            "slow-call rule see.",
            ["backend"],
            registry=r,
        )
        self.own_timeouts = Counter(
            f"{PREFIX}_backend_own_timeouts",
            "IdP calls that timed out mostly waiting for the gateway's own event loop: "
            "not counted against the IdP.",
            ["backend"],
            registry=r,
        )
        self.last_success = Gauge(
            f"{PREFIX}_backend_last_success_timestamp_seconds",
            "Unix time of this process's last definite answer from the backend (a token "
            "accepted, or refused by the IdP). Absent until the first one.",
            ["backend"],
            registry=r,
        )

    def call(self, backend: str, outcome: str, seconds: float) -> None:
        self.child(self.calls, backend, outcome).inc()
        self.child(self.latency, backend).observe(seconds)

    def outcome(self, backend: str, outcome: Outcome, seconds: float) -> None:
        """One finished backend call: its outcome, latency and, for a rejection, its cause."""
        self.call(backend, type(outcome).__name__.lower(), seconds)
        if isinstance(outcome, Rejected):
            self.child(self.rejections, backend, outcome.cause).inc()
        # The IdP answered: known users' stale limits count from answers like this one.
        # ("unsendable": refused before any call, so it proves nothing about the IdP.)
        if isinstance(outcome, Authenticated) or (
            isinstance(outcome, Rejected) and outcome.cause != "unsendable"
        ):
            self.child(self.last_success, backend).set(time.time())

    def own_delay(self, backend: str, seconds: float) -> None:
        if seconds > 0:
            self.child(self.own_delay_seconds, backend).inc(seconds)

    def own_timeout(self, backend: str) -> None:
        self.child(self.own_timeouts, backend).inc()

    def misconfigured(self, backend: str) -> None:
        self.child(self.misconfigured_answers, backend).inc()
