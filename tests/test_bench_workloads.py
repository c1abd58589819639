"""The workloads benchmark's pieces (issue 52): the generated workloads have the published shapes, a measurement
against a live server counts decisions and latencies, the bare prefill runs a clef GGUF's batches; the whole run
needs llama-server's build and is `python -m benchmarks workloads`."""

from __future__ import annotations

import random
import subprocess
import sys
from pathlib import Path

import pytest
from clef_bridge.head.schema import parse_request

from benchmarks.__main__ import build_parser
from benchmarks.llama_server import Server
from benchmarks.workloads import (
    INTENTS,
    ROUTES,
    SIZES,
    TRIAGE_QUESTIONS,
    banking,
    bare_prefill,
    decisions,
    measure,
    measure_interleaved,
    triage,
    workloads,
)

from . import fixturegen_upstream


def _words(body) -> int:
    state = body["state"]
    return len((state["message"] if isinstance(state, dict) else state).split())


@pytest.mark.unit
def test_the_workloads_have_the_published_shapes_and_are_the_same_every_run():
    load = workloads(seed=0)
    assert {k: len(v) for k, v in load.items()} == SIZES == {"triage": 300, "router": 150, "banking77": 320}
    assert sum(decisions(b) for v in load.values() for b in v) == 1370  # the published count of decisions
    for name in ("triage", "router"):
        lengths = [_words(b) for b in load[name]]
        assert min(lengths) >= 20 and max(lengths) <= 400 and max(lengths) > 250 and min(lengths) < 40, name
    assert max(_words(b) for b in load["banking77"]) < 20
    assert len(INTENTS) == 16 and set(ROUTES) == {"cheap", "mid-tier", "frontier", "human approval"}
    assert workloads(seed=0) == load and workloads(seed=1) != load
    assert len({repr(b["state"]) for b in load["triage"]}) == 300  # distinct: no answer is cached or joined
    for body in (b for v in load.values() for b in v[:40]):
        parse_request(body)  # each one a valid System One request


@pytest.mark.unit
def test_its_flags_parse():
    args = build_parser().parse_args(["workloads", "--requests", "4", "--concurrency", "1", "4", "--sample", "0",
                                      "--png", "none", "--json"])
    assert (args.requests, args.concurrency, args.sample, args.png, args.binary) == (4, [1, 4], 0, "none", None)


@pytest.mark.integration
def test_a_measurement_counts_every_decision_of_a_live_server(tiny_server):
    bodies = [{**b, "model": "tiny"} for b in triage(random.Random(5), 6)]
    server = Server("clef-bridge", tiny_server.url, None, Path("unused.log"))  # not started here: no process
    ticks = []
    row = measure(server, "triage", bodies, 3, tick=ticks.append)
    assert row.requests == 6 == len(ticks) and row.concurrency == 3
    assert row.decisions_per_s == pytest.approx(row.requests_per_s * len(TRIAGE_QUESTIONS))
    assert 0 < row.p50_ms <= row.p95_ms


@pytest.mark.integration
def test_single_requests_are_measured_turn_by_turn_on_every_server(tiny_server):
    """Concurrency 1 interleaves the servers request by request, the order flipping at each body."""
    bodies = [{**b, "model": "tiny"} for b in banking(random.Random(2), 3)]
    posted = []

    class Recording(Server):
        def post(self, body, path="/v1/systemone"):
            posted.append((self.name, body["state"]))
            return super().post(body, path)

    servers = [Recording(name, tiny_server.url, None, Path("unused.log")) for name in ("one", "two")]
    rows = measure_interleaved(servers, "banking77", bodies)
    states = [b["state"] for b in bodies]
    assert posted == [("two", states[0]), ("one", states[0]), ("one", states[1]), ("two", states[1]),
                      ("two", states[2]), ("one", states[2])]
    assert [(r.server, r.concurrency, r.requests) for r in rows] == [("one", 1, 3), ("two", 1, 3)]
    assert all(r.decisions_per_s == pytest.approx(r.requests_per_s) and 0 < r.p50_ms <= r.p95_ms for r in rows)


@pytest.mark.integration
def test_the_bare_prefill_runs_an_upstream_clef_gguf():
    gguf = fixturegen_upstream.build().clef("f32")
    bodies = [{**b, "model": "bench"} for b in workloads()["banking77"][:4]]
    limit = bare_prefill(gguf, {"banking77": bodies}, group=2, threads=1)
    assert set(limit) == {"banking77"} and limit["banking77"] > 0


@pytest.mark.integration
def test_a_missing_binary_is_refused_before_anything_is_built():
    done = subprocess.run([sys.executable, "-m", "benchmarks", "workloads", "--llama-server", "/nonexistent"],
                          capture_output=True, text=True)
    assert done.returncode == 2 and "--llama-server /nonexistent: no such file" in done.stderr
