"""Prometheus metrics: the process's registry, and how each part declares its own.

Every metric is named ``authn_gateway_...``; labels carry backend names, answers and
states, never tokens or user names.

Each layer (and fleet/, revocation/, review/, serve/, edge/) declares its metrics in a
:class:`MetricsGroup` in a ``metrics.py`` beside it. :meth:`Metrics.group` builds a
group once per :class:`Metrics`, which holds the registry: the registry outlives
config reloads (serve/reloader.py hands the same ``Metrics`` to each new gateway), and
prometheus_client refuses a second registration of a name, so a reload's new layers
get the groups the old ones counted in. This module holds only that plumbing and what
is the whole gateway's: internal errors, the log queues, the backends' own collectors.

Label children are resolved once and kept (:meth:`MetricsGroup.child`), and the counts
every review makes are plain integers sampled at scrape time (:class:`Count`), so the
review hot path pays one dictionary lookup and an increment.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Any, TypeVar

from prometheus_client import CollectorRegistry, Counter
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from authn_gateway.observe.logsink import all_sinks

LOGS = ("review", "audit", "process")

PREFIX = "authn_gateway"

# Reviews answered from cache take ~50 us; IdP calls take 10 ms to seconds.
LATENCY_BUCKETS = (
    0.0001,
    0.0005,
    0.001,
    0.0025,
    0.005,
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    0.5,
    1.0,
    2.5,
    5.0,
    10.0,
)

#: The histogram's "le" labels, as prometheus_client writes them.
BOUND_LABELS = [*(repr(float(b)) for b in LATENCY_BUCKETS), "+Inf"]


class MetricsGroup:
    """The metrics of one part of the gateway, registered in ``registry`` when built.

    Build one only through :meth:`Metrics.group`: a second one on the same registry
    would register the same names again, which prometheus_client refuses.
    """

    def __init__(self, registry: CollectorRegistry) -> None:
        self._children: dict[tuple[Any, ...], Any] = {}

    def child(self, metric: Any, *labels: str) -> Any:
        """``metric.labels(*labels)``, resolved once and kept: prometheus_client's
        ``labels()`` builds and locks on every call."""
        key = (id(metric), *labels)
        found = self._children.get(key)
        if found is None:
            found = self._children[key] = metric.labels(*labels)
        return found


G = TypeVar("G", bound=MetricsGroup)


class Metrics:
    """The process's registry, its groups, and the gateway-wide metrics."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry if registry is not None else CollectorRegistry()
        self._groups: dict[type[MetricsGroup], MetricsGroup] = {}
        self.internal_errors = Counter(
            f"{PREFIX}_internal_errors",
            "Reviews answered 'internal error' (a bug of ours), by where and exception type.",
            ["where", "error"],
            registry=self.registry,
        )
        self._internal_errors: dict[tuple[str, str], Any] = {}
        self.registry.register(LogSinkCollector())
        #: Backends' own metrics (the jwt backend's key fetches).
        self.backend_collectors = BackendCollectors()
        self.registry.register(self.backend_collectors)

    def group(self, kind: type[G]) -> G:
        """This registry's ``kind`` group: built and registered on the first call, the
        same object on every later one (a reload's layers count where the old did)."""
        found = self._groups.get(kind)
        if found is None:
            found = self._groups[kind] = kind(self.registry)
        assert isinstance(found, kind)
        return found

    def internal_error(self, where: str, error: str) -> None:
        key = (where, error)
        child = self._internal_errors.get(key)
        if child is None:
            child = self._internal_errors[key] = self.internal_errors.labels(where, error)
        child.inc()


class Count:
    """One plain integer count; ``inc()`` as a prometheus_client child's, without its lock.

    Only the event loop writes; a scrape in another thread reads the integer.
    """

    __slots__ = ("value",)

    def __init__(self) -> None:
        self.value = 0

    def inc(self) -> None:
        self.value += 1


def counter_family(
    name: str,
    documentation: str,
    labels: list[str],
    counts: Iterable[tuple[tuple[str, ...], int]],
) -> CounterMetricFamily:
    """A counter family from plain integer counts by label values (a dict's items),
    read at scrape time: a snapshot, as only the event loop writes them."""
    family = CounterMetricFamily(name, documentation, labels=labels)
    for values, count in list(counts):
        family.add_metric(list(values), count)
    return family


class BackendCollectors(Collector):
    """The metrics backends export themselves, registered once per process.

    Each backend name maps to the running generation's backend: a reload attaches the
    new one, and closing the old one detaches it only if it is still the current one.
    A backend's counters start again from zero after a reload (``rate()`` handles it).
    """

    def __init__(self) -> None:
        self._current: dict[str, Collector] = {}

    def attach(self, backend: str, collector: Collector) -> None:
        self._current[backend] = collector

    def detach(self, backend: str, collector: Collector) -> None:
        if self._current.get(backend) is collector:
            del self._current[backend]

    def collect(self) -> Iterable[Metric]:
        # Two backends of one kind export the same families: merge their samples.
        families: dict[str, Metric] = {}
        for collector in list(self._current.values()):
            for family in collector.collect():
                merged = families.get(family.name)
                if merged is None:
                    families[family.name] = family
                else:
                    merged.samples.extend(family.samples)
        return list(families.values())


class LogSinkCollector(Collector):
    """The log queues' counts, read at scrape time: the sinks are per process, not per
    config, so they outlive the gateway of any one reload."""

    def collect(self) -> Iterator[Metric]:
        dropped = CounterMetricFamily(
            f"{PREFIX}_log_lines_dropped",
            "Log lines dropped unwritten: their reader fell behind and the queue was full.",
            labels=["log"],
        )
        queued = GaugeMetricFamily(
            f"{PREFIX}_log_queue_lines",
            "Log lines waiting for their writer, by destination.",
            labels=["destination"],
        )
        totals = dict.fromkeys(LOGS, 0)
        for sink in all_sinks():
            for log, count in sink.dropped.items():
                totals[log] = totals.get(log, 0) + count
            queued.add_metric([_destination_label(sink.destination)], sink.queued())
        for log, count in totals.items():
            dropped.add_metric([log], count)
        yield dropped
        yield queued


def _destination_label(destination: str) -> str:
    # A file's path is configuration, not a secret, but "file" keeps the label short.
    return destination if destination in ("stderr", "stdout") else "file"
