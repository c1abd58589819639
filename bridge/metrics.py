"""Prometheus metrics, one registry per app (no process-global state)."""

from __future__ import annotations

from dataclasses import dataclass

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

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
    )
