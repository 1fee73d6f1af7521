"""The per-review counts kept as plain integers (review/metrics.py ``ReviewTally``,
layers/cache/metrics.py ``LookupTally``) export what prometheus_client's own counters
would: the same names, types, labels and values, sampled at scrape time."""

from __future__ import annotations

from prometheus_client import generate_latest

from authn_gateway.layers.cache.metrics import CacheMetrics
from authn_gateway.observe.metrics import Metrics
from tests.support.procs import metric_value


def test_cache_lookups_are_exported_as_a_counter_per_backend_and_result() -> None:
    metrics = Metrics()
    cache = metrics.group(CacheMetrics)
    hit = cache.counter("idp", "hit")
    assert cache.counter("idp", "hit") is hit  # one count, kept across reloads
    cache.counter("idp", "miss")  # made at start-up: exported as 0
    for _ in range(3):
        hit.inc()
    cache.lookup("ldap", "negative_hit")
    cache.stale_served("idp", 12.5)
    text = generate_latest(metrics.registry).decode()
    assert "# TYPE authn_gateway_cache_lookups_total counter" in text
    name = "authn_gateway_cache_lookups_total"
    assert metric_value(text, name, backend="idp", result="hit") == 3
    assert f'{name}{{backend="idp",result="miss"}} 0.0' in text.splitlines()
    assert metric_value(text, name, backend="ldap", result="negative_hit") == 1
    assert metric_value(text, name, backend="idp", result="stale_served") == 1
    assert metric_value(text, "authn_gateway_stale_answers_total", backend="idp") == 1
    # Counting goes on after a scrape, from where it was.
    hit.inc()
    text = generate_latest(metrics.registry).decode()
    assert metric_value(text, name, backend="idp", result="hit") == 4
