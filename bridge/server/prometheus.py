"""Prometheus metrics, one registry per app (no process-global state)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

from ..llama.prefix_cache import CacheStats

LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.2, 0.35, 0.5, 0.75, 1.0, 2.0, 5.0, 10.0, 30.0, 60.0)


@dataclass(frozen=True)
class Metrics:
    registry: CollectorRegistry
    requests: Counter
    latency: Histogram
    tokens: Counter
    batch_size: Histogram
    backbone_runs: Counter
    coalesced: Counter
    queue_depth: Gauge
    log_lines: Counter  # the decision log's (bridge/server/decision_log.py), counted from its writer thread
    log_dropped: Counter
    log_errors: Counter
    shadows: Counter  # shadow scorings by primary model, shadow and outcome (answered, dropped, failed)
    shadow_questions: Counter  # questions a shadow answered, by whether its top answer agreed with the primary's

    def render(self) -> bytes:
        return generate_latest(self.registry)


def create_metrics() -> Metrics:
    reg = CollectorRegistry()
    return Metrics(
        registry=reg,
        requests=Counter("clef_requests", "HTTP requests by route, model and status", ["route", "model", "status"],
                         registry=reg),
        latency=Histogram("clef_request_seconds", "Latency of answered decisions by stage", ["model", "stage"],
                          buckets=LATENCY_BUCKETS, registry=reg),
        tokens=Counter("clef_input_tokens", "Prompt tokens prefilled", ["model"], registry=reg),
        batch_size=Histogram("clef_batch_size", "Requests per batched llama_decode", ["model"],
                             buckets=(1, 2, 3, 4, 6, 8, 12, 16, 24, 32), registry=reg),
        backbone_runs=Counter("clef_backbone_runs", "Batched llama_decode calls", ["model"], registry=reg),
        coalesced=Counter("clef_coalesced", "Requests answered by another identical request's computation",
                          ["model", "source"], registry=reg),
        queue_depth=Gauge("clef_queue_depth", "Requests waiting for a worker", ["model"], registry=reg),
        log_lines=Counter("clef_decision_log_lines", "Decisions written to the decision log", registry=reg),
        log_dropped=Counter("clef_decision_log_dropped", "Decisions left out of the decision log: its queue was full",
                            registry=reg),
        log_errors=Counter("clef_decision_log_errors", "Decisions the decision log failed to write, by the error "
                           "(ENOSPC, EACCES, ...)", ["reason"], registry=reg),
        shadows=Counter("clef_shadow_scorings", "Shadow models' scorings of answered requests, by outcome (dropped: "
                        "the shadow's model had requests waiting)", ["model", "shadow", "outcome"], registry=reg),
        shadow_questions=Counter("clef_shadow_questions", "Questions a shadow model answered, by whether its top "
                                 "answer agreed with the served model's", ["model", "shadow", "agree"], registry=reg),
    )


PREFIX_COUNTERS = {"hits": "Requests that restored a cached prompt prefix",
                   "misses": "Requests that found no cached prefix",
                   "tokens_reused": "Prompt tokens the backbone did not decode thanks to the prefix cache",
                   "evictions": "Prefix-cache checkpoints dropped for room",
                   "faults": "Failed decodes or restores (each emptied the prefix cache) and non-finite requests"}
PREFIX_GAUGES = {"bytes": "Host bytes the prefix cache holds (recurrent states and memory rows)",
                 "max_bytes": "The prefix cache's budget (prefix_cache_mb)", "checkpoints": "Checkpoints made so far"}


class PrefixCacheCollector:
    """Each model's prefix-cache counters, read from the caches themselves at scrape time."""

    def __init__(self, stats: Callable[[], dict[str, CacheStats]]):
        self._stats = stats

    def collect(self):
        stats = self._stats()
        for field, help_text in PREFIX_COUNTERS.items():
            family = CounterMetricFamily(f"clef_prefix_cache_{field}", help_text, labels=["model"])
            for model, s in stats.items():
                family.add_metric([model], getattr(s, field))
            yield family
        for field, help_text in PREFIX_GAUGES.items():
            family = GaugeMetricFamily(f"clef_prefix_cache_{field}", help_text, labels=["model"])
            for model, s in stats.items():
                family.add_metric([model], getattr(s, field))
            yield family
