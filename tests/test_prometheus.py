"""bridge/server/prometheus.py: one metrics registry per app, and the prefix caches' counters read at scrape time."""

from __future__ import annotations

import dataclasses

import pytest
from clef_bridge.bridge.llama.prefix_cache import CacheStats
from clef_bridge.bridge.server.prometheus import PREFIX_COUNTERS, PREFIX_GAUGES, PrefixCacheCollector, create_metrics

pytestmark = pytest.mark.unit


def stats(**values) -> CacheStats:
    return CacheStats(**{f.name: values.get(f.name, 0) for f in dataclasses.fields(CacheStats)})


def test_two_apps_count_apart():
    one, two = create_metrics(), create_metrics()
    one.requests.labels(route="decide", model="m", status="200").inc()
    one.queue_depth.labels(model="m").set(3)
    text = one.render().decode()
    assert 'clef_requests_total{model="m",route="decide",status="200"} 1.0' in text
    assert 'clef_queue_depth{model="m"} 3.0' in text
    assert "clef_requests_total{" not in two.render().decode()


def test_latency_goes_into_its_buckets_by_stage():
    metrics = create_metrics()
    metrics.latency.labels(model="m", stage="total").observe(0.3)
    text = metrics.render().decode()
    assert 'clef_request_seconds_bucket{le="0.2",model="m",stage="total"} 0.0' in text
    assert 'clef_request_seconds_bucket{le="0.35",model="m",stage="total"} 1.0' in text


def test_the_prefix_caches_are_read_when_scraped():
    current = {"a": stats(hits=3, misses=1, bytes=100, max_bytes=1000), "b": stats(tokens_reused=42)}
    metrics = create_metrics()
    metrics.registry.register(PrefixCacheCollector(lambda: current))
    text = metrics.render().decode()
    assert 'clef_prefix_cache_hits_total{model="a"} 3.0' in text
    assert 'clef_prefix_cache_tokens_reused_total{model="b"} 42.0' in text
    assert 'clef_prefix_cache_max_bytes{model="a"} 1000.0' in text
    current["a"] = stats(hits=5)
    assert 'clef_prefix_cache_hits_total{model="a"} 5.0' in metrics.render().decode()  # not a copy


def test_every_prefix_metric_is_a_field_of_the_stats():
    fields = {f.name for f in dataclasses.fields(CacheStats)}
    assert set(PREFIX_COUNTERS) | set(PREFIX_GAUGES) <= fields
    families = list(PrefixCacheCollector(lambda: {"m": stats()}).collect())
    assert len(families) == len(PREFIX_COUNTERS) + len(PREFIX_GAUGES)
    assert all(f.samples for f in families)
