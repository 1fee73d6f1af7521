"""Each part of the gateway declares its metrics beside it, as a group
(authn_gateway/observe/metrics.py, ``MetricsGroup``), built once per registry by
``Metrics.group``: the registry outlives reloads, and prometheus_client refuses a
name registered twice."""

from __future__ import annotations

import importlib
import inspect
from pathlib import Path

import prometheus_client
import pytest
from prometheus_client import generate_latest

from authn_gateway.config import GatewayConfig
from authn_gateway.layers.cache.layer import CacheLayer
from authn_gateway.layers.cache.metrics import CacheMetrics
from authn_gateway.observe.metrics import Metrics, MetricsGroup
from authn_gateway.serve.gateway import METRICS_GROUPS, Gateway
from tests.support.metric_names import families

PACKAGE = Path(__file__).resolve().parents[2] / "authn_gateway"


def test_a_group_is_built_once_per_registry() -> None:
    metrics = Metrics()
    cache = metrics.group(CacheMetrics)
    assert metrics.group(CacheMetrics) is cache
    assert Metrics().group(CacheMetrics) is not cache  # another registry, another group
    # What the memo saves us from: a second group on the same registry is refused.
    with pytest.raises(ValueError, match="Duplicated timeseries"):
        CacheMetrics(metrics.registry)


def config(max_stale: float) -> GatewayConfig:
    return GatewayConfig.model_validate(
        {
            "secret": "metrics-groups-test-secret-of-32-bytes-at-least",
            "cache": {"max_stale_seconds": max_stale},
            "backends": [{"name": "idp", "type": "userinfo", "url": "http://127.0.0.1:9/"}],
        }
    )


def cache_layer(gateway: Gateway) -> CacheLayer:
    top = gateway.pipeline.backends["idp"].top
    assert isinstance(top, CacheLayer), top
    return top


async def test_a_reload_registers_nothing_again_and_counts_on() -> None:
    """A reload builds new layers on the same ``Metrics``: no name is registered twice
    (that would raise), the same families are exported, and the new cache layer counts
    on the count the old one did."""
    first = Gateway(config(60))
    exported = families(generate_latest(first.metrics.registry).decode())
    hit = cache_layer(first)._hit
    hit.inc()
    second = Gateway(config(3600), metrics=first.metrics, previous=first)
    try:
        assert cache_layer(second) is not cache_layer(first)
        assert cache_layer(second)._hit is hit, "a reload's layer must count on the same count"
        again = families(generate_latest(second.metrics.registry).decode())
        assert again == exported, sorted(set(again) ^ set(exported))
    finally:
        await second.close()
        await first.close()


def test_every_group_lives_in_a_metrics_module_and_every_gateway_builds_it() -> None:
    """A group is declared in its part's ``metrics.py``, and listed in METRICS_GROUPS
    (serve/gateway.py), so that a gateway exports its families whatever its config."""
    declared: set[type[MetricsGroup]] = set()
    for path in sorted(PACKAGE.rglob("metrics.py")):
        parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
        module = importlib.import_module(".".join(parts))
        declared |= {
            cls
            for _, cls in inspect.getmembers(module, inspect.isclass)
            if issubclass(cls, MetricsGroup)
            and cls is not MetricsGroup
            and cls.__module__ == module.__name__
        }
    listed = set(METRICS_GROUPS)
    assert declared == listed, (
        f"not built by a gateway: {sorted(c.__qualname__ for c in declared - listed)}; "
        f"not in a metrics.py: {sorted(c.__qualname__ for c in listed - declared)}"
    )


async def test_no_metric_goes_to_the_default_registry() -> None:
    """Every metric is registered in the gateway's own registry: none in
    prometheus_client's process-wide default one, which no reload could reset."""
    gateway = Gateway(config(60))
    try:
        ours = [
            family.name
            for family in prometheus_client.REGISTRY.collect()
            if family.name.startswith("authn_gateway")
        ]
        assert ours == []
    finally:
        await gateway.close()
