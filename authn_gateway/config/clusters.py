"""``clusters:``: the kube-apiservers (clusters) one gateway serves, each known by what
already authenticates it, with its weight in every IdP's budget (issue 37).

A cluster's reviews share each backend's bucket and concurrency slots with the other
clusters' by weight (authn_gateway/layers/bucket/fair.py, layers/concurrency/fair.py).
Callers that match no cluster, and every caller while no cluster is configured, are
the cluster ``default``; an entry named ``default`` (with no credentials) sets its
weight and the backends it may use. When every caller is in a configured cluster (each
caller token and allowed subject named by one), ``default`` has no share of its own.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Annotated

from pydantic import Field, model_validator

from authn_gateway.config.server import ServerSettings
from backends.context import DEFAULT_CLUSTER
from backends.durations import finite
from backends.settings import BackendSettings, Strict

#: A Prometheus label value and a DNS label alike: what a cluster is called in metrics,
#: logs and dashboards.
CLUSTER_NAME = r"^[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?$"

#: The largest weight: a ratio of 1000 to 1 between two clusters is plenty, and keeps
#: each share's interval a finite float for any bucket rate.
MAX_WEIGHT = 1000.0
#: Each cluster is a label value of a few metric families, and a share of every bucket.
MAX_CLUSTERS = 256


class ClusterSettings(Strict):
    """One cluster: its kube-apiservers' credentials, its weight, what it may use."""

    name: Annotated[str, Field(pattern=CLUSTER_NAME)]
    # Client-certificate names (Common Name, DNS or URI SAN) its kube-apiservers present.
    subjects: list[Annotated[str, Field(min_length=1, max_length=1024)]] = Field(
        default_factory=list
    )
    # Names of server.caller_tokens its kube-apiservers send.
    caller_tokens: list[str] = Field(default_factory=list)
    # Its share of every IdP's budget against the other clusters' weights.
    weight: Annotated[float, finite(gt=0, le=MAX_WEIGHT)] = 1.0
    # The backends its reviews may reach (unset: all); a token routed to another is
    # refused without a call.
    backends: list[str] | None = None
    # The backend prefixes it may route by (unset: those of its backends).
    prefixes: list[str] | None = None

    @model_validator(mode="after")
    def _credentials(self) -> ClusterSettings:
        if self.name == DEFAULT_CLUSTER:
            if self.subjects or self.caller_tokens:
                raise ValueError(
                    f"{DEFAULT_CLUSTER!r} is the cluster of callers in no other cluster: "
                    "it takes no subjects or caller_tokens"
                )
        elif not self.subjects and not self.caller_tokens:
            raise ValueError("needs subjects or caller_tokens: how its kube-apiservers call")
        for field, values in (
            ("subjects", self.subjects),
            ("caller_tokens", self.caller_tokens),
            ("backends", self.backends or []),
            ("prefixes", self.prefixes or []),
        ):
            for i, value in enumerate(values):
                if values.index(value) != i:
                    raise ValueError(f"{field}[{i}]: {value!r} is listed twice")
        return self


def cluster_problem(
    clusters: Sequence[ClusterSettings],
    server: ServerSettings,
    backends: Sequence[BackendSettings],
) -> str | None:
    """The first problem between ``clusters:`` and the rest of the file, or None."""
    token_names = {t.name for t in server.caller_tokens}
    backend_names = {b.name: b for b in backends}
    prefixes = {b.prefix: b.name for b in backends if b.prefix is not None}
    mutual_tls = server.tls is not None and server.tls.client_ca_file is not None
    seen_names: dict[str, int] = {}
    seen_credentials: dict[tuple[str, str], int] = {}
    for i, cluster in enumerate(clusters):
        at = f"clusters[{i}]"
        if cluster.name in seen_names:
            return (
                f"{at}.name: {cluster.name!r} is used twice (clusters[{seen_names[cluster.name]}])"
            )
        seen_names[cluster.name] = i
        for j, subject in enumerate(cluster.subjects):
            if not mutual_tls:
                return f"{at}.subjects[{j}]: needs server.tls.client_ca_file (mutual TLS)"
            if server.allowed_subjects and subject not in server.allowed_subjects:
                return f"{at}.subjects[{j}]: {subject!r} is not in server.allowed_subjects"
        for j, name in enumerate(cluster.caller_tokens):
            if name not in token_names:
                return f"{at}.caller_tokens[{j}]: no server.caller_tokens entry is named {name!r}"
        for field, values in (
            ("subjects", cluster.subjects),
            ("caller_tokens", cluster.caller_tokens),
        ):
            for j, value in enumerate(values):
                other = seen_credentials.get((field, value))
                if other is not None:
                    return (
                        f"{at}.{field}[{j}]: {value!r} is also clusters[{other}]'s: a "
                        "credential names one cluster"
                    )
                seen_credentials[(field, value)] = i
        for field, limit, unset in (
            ("backends", cluster.backends, "every backend"),
            ("prefixes", cluster.prefixes, "its backends' prefixes"),
        ):
            if limit == []:
                return (
                    f"{at}.{field}: is empty, so the cluster could reach no backend by "
                    f"it; leave it out for {unset}, or remove the cluster"
                )
        for j, name in enumerate(cluster.backends or []):
            if name not in backend_names:
                return f"{at}.backends[{j}]: no backend is named {name!r}"
        for j, prefix in enumerate(cluster.prefixes or []):
            owner = prefixes.get(prefix)
            if owner is None:
                return f"{at}.prefixes[{j}]: no backend has the prefix {prefix!r}"
            if cluster.backends is not None and owner not in cluster.backends:
                return f"{at}.prefixes[{j}]: {prefix!r} is backend {owner!r}'s, not in its backends"
    return _share_problem(clusters, server, backends)


def cluster_weights(
    clusters: Sequence[ClusterSettings], server: ServerSettings
) -> dict[str, float]:
    """Each cluster's weight, and ``default``'s (1 unless configured) when a caller can
    be in it: a cluster no caller can be in would only hold a share to lend."""
    weights = {c.name: c.weight for c in clusters}
    if DEFAULT_CLUSTER not in weights and default_reachable(clusters, server):
        weights[DEFAULT_CLUSTER] = 1.0
    return weights


def default_reachable(clusters: Sequence[ClusterSettings], server: ServerSettings) -> bool:
    """Whether a caller can authenticate as no configured cluster: a caller token no
    cluster names, a client certificate no cluster's subjects name (any the CA signed,
    when allowed_subjects is empty), or no caller authentication at all."""
    if not server.callers_must_authenticate:
        return True
    tokens = {t for c in clusters for t in c.caller_tokens}
    if any(t.name not in tokens for t in server.caller_tokens):
        return True
    if server.tls is None or server.tls.client_ca_file is None:
        return False
    subjects = {s for c in clusters for s in c.subjects}
    return not server.allowed_subjects or any(s not in subjects for s in server.allowed_subjects)


def _share_problem(
    clusters: Sequence[ClusterSettings],
    server: ServerSettings,
    backends: Sequence[BackendSettings],
) -> str | None:
    """A bucket shared between clusters must hold two calls: one its shares keep for a
    cluster under its share (their reserves), one to lend. Any share may be a fraction
    of a call (layers/bucket/fair.py makes a call of several)."""
    if not clusters:
        return None
    weights = cluster_weights(clusters, server)
    if len(weights) < 2:
        return None  # one share: the bucket as it was
    for i, backend in enumerate(backends):
        burst = backend.bucket.burst
        if burst < 2:
            return (
                f"backends[{i}].bucket.burst: {burst} call cannot be shared between "
                f"{len(weights)} clusters: it must be at least 2 (a call kept for a cluster "
                "under its share, and one to lend)"
            )
    return None
