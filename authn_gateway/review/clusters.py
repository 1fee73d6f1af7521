"""Which cluster a caller is, and what that cluster may reach (issue 37).

A caller is identified by the edge (a client-certificate name, or ``token:<name>`` for
a caller token, edge/callerauth.py); :class:`ClusterMap` maps it to a configured
cluster, or to ``default``. The review's cluster rides in its
:class:`~backends.context.ReviewContext`, and each backend's budget and concurrency
layers share the IdP between clusters by the weights here
(:meth:`ClusterMap.shares`). A cluster that may not use a backend gets a refusal from
its own router, never a call (:meth:`ClusterMap.allows`).
"""

from __future__ import annotations

from collections.abc import Sequence

from authn_gateway.config import ClusterSettings, ServerSettings, cluster_weights
from authn_gateway.layers.bucket.shares import FairShares
from backends.context import DEFAULT_CLUSTER
from backends.settings import BackendSettings

#: The caller identity of a caller token (edge/callerauth.py).
TOKEN_CALLER = "token:"


class ClusterMap:
    def __init__(self, clusters: Sequence[ClusterSettings], server: ServerSettings) -> None:
        self.configured = bool(clusters)
        self.weights = cluster_weights(clusters, server)
        self.names = tuple(self.weights)
        self._by_caller: dict[str, str] = {}
        self._settings = {c.name: c for c in clusters}
        for cluster in clusters:
            for subject in cluster.subjects:
                self._by_caller[subject] = cluster.name
            for token in cluster.caller_tokens:
                self._by_caller[TOKEN_CALLER + token] = cluster.name
        #: The client-certificate names that name a cluster: the edge prefers them
        #: when a certificate carries several names.
        self.subjects = frozenset(s for c in clusters for s in c.subjects)

    def of(self, caller: str) -> str:
        """The caller's cluster: a configured name, or ``default``."""
        return self._by_caller.get(caller, DEFAULT_CLUSTER)

    def shares(self) -> FairShares | None:
        """The weights each backend's bucket is shared by; None with no clusters
        configured (one cluster: the bucket as it always was)."""
        return FairShares.of(self.weights) if self.configured else None

    def limits(self, cluster: str) -> ClusterSettings | None:
        """The cluster's restrictions, if it has any (None: it may use everything)."""
        settings = self._settings.get(cluster)
        if settings is None or (settings.backends is None and settings.prefixes is None):
            return None
        return settings

    def allows(self, cluster: str, backend: BackendSettings, by_prefix: bool) -> bool:
        """Whether ``cluster`` may reach ``backend`` (by its prefix, or in the chain)."""
        limits = self.limits(cluster)
        if limits is None:
            return True
        if limits.backends is not None and backend.name not in limits.backends:
            return False
        if by_prefix and limits.prefixes is not None:
            return backend.prefix in limits.prefixes
        return True

    def restricted(self) -> list[str]:
        """The clusters whose reviews need a router of their own."""
        return [name for name in self.names if self.limits(name) is not None]
