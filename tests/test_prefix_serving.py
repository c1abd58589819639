"""The prefix cache through the pipeline and the server: answers with it equal answers without it
(within 1e-4 on probabilities), over appended states, the same state asked other questions, unrelated
states, eviction, batches mixing hits and misses, interleaved clients, and after faults; memory stays
within the budget."""

from __future__ import annotations

import asyncio
import os
import random

import aiohttp
import numpy as np
import pytest
from clef_bridge.head.answer import softmax64

from .conftest import open_spec, tiny_spec
from .deciding import prepare, respond, score_batch
from .serverkit import RunningServer, registry_for
from .test_hardening import faulty_loader

pytestmark = pytest.mark.integration

TOLERANCE = 1e-4  # on probabilities; hidden states of a hit differ from a full prefill by ~1e-6
WORDS = ("invoice refund printer outage password upgrade contract delivery dashboard export account billing "
         "urgent broken slow error please thanks yesterday again customer").split()
QUESTIONS = {"team": {"type": "choice", "instructions": "Which team?", "criteria": {"billing": "payments",
                                                                                    "tech": "bugs", "sales": None}},
             "urgent": {"type": "noul", "instructions": "Is it urgent?"},
             "mood": {"type": "score", "criteria": ["calm", "annoyed", "angry"]}}


def text(rng: random.Random, n: int) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(n))


def body(state, *names: str) -> dict:
    return {"model": "tiny", "state": state, "questions": {n: QUESTIONS[n] for n in names or QUESTIONS}}


@pytest.fixture(scope="module")
def plain(fx):
    model = open_spec(tiny_spec(fx, prefix_cache_mb=0))
    yield model
    model.close()


def cached_model(fx, **keys):
    return open_spec(tiny_spec(fx, **({"prefix_cache_mb": 64, "prefix_cache_every": 32} | keys)))


def probabilities(model, bodies: list[dict]) -> tuple[list[list[np.ndarray]], list[int]]:
    """Unrounded per-question probabilities of bodies decoded in ONE batch, and the tokens each reused."""
    prepared = [prepare(model, b) for b in bodies]
    out, reused = [], []
    for p, item in zip(prepared, model.prefill_batch(prepared)):
        logits = model.head_logits([model.head_input(item)])[0]
        bounds = list(p.encoded.layout.option_offsets) + [len(logits)]
        out.append([softmax64(logits[s:e]) for s, e in zip(bounds, bounds[1:])])
        reused.append(item.reused)
    return out, reused


def worst(a: list[list[np.ndarray]], b: list[list[np.ndarray]]) -> float:
    return max(float(np.abs(x - y).max()) for qa, qb in zip(a, b) for x, y in zip(qa, qb))


def conversation(rng: random.Random, turns: int) -> list[dict]:
    """A state that grows by one message a turn, as an agent harness sends it."""
    state, out = {"goal": text(rng, 20), "messages": []}, []
    for _ in range(turns):
        state["messages"].append(text(rng, 25))
        out.append({"goal": state["goal"], "messages": list(state["messages"])})
    return out


def test_appended_states_same_state_other_questions_and_unrelated_states(fx, plain):
    cached = cached_model(fx)
    try:
        rng = random.Random(1)
        grown = conversation(rng, 4)
        cases = ([[body(s)] for s in grown]  # appended states
                 + [[body(grown[-1], q)] for q in QUESTIONS]  # the same state, other questions
                 + [[body(text(rng, 60))] for _ in range(3)])  # unrelated states
        reused = []
        for bodies in cases:
            got, hits = probabilities(cached, bodies)
            assert worst(got, probabilities(plain, bodies)[0]) <= TOLERANCE
            reused += hits
        assert all(r > 0 for r in reused[1:7])  # every grown state and every other question hit
        stats = cached.backbone.prefix_cache.stats()
        assert stats.hits >= 6 and stats.tokens_reused > 300
    finally:
        cached.close()


def test_a_batch_mixing_hits_and_misses(fx, plain):
    cached = cached_model(fx)
    try:
        rng = random.Random(2)
        states = conversation(rng, 3)
        probabilities(cached, [body(states[0]), body(states[1])])  # warm two prefixes
        batch = [body(states[2]), body(text(rng, 50)), body(states[1], "urgent"), body(states[2], "mood"),
                 body(text(rng, 80), "team")]
        got, reused = probabilities(cached, batch)
        assert worst(got, probabilities(plain, batch)[0]) <= TOLERANCE
        assert any(r > 0 for r in reused) and any(r == 0 for r in reused)
    finally:
        cached.close()


def test_eviction_under_a_small_budget(fx, plain):
    cached = cached_model(fx, prefix_cache_mb=0.2, prefix_cache_every=16)
    try:
        rng = random.Random(3)
        for state in conversation(rng, 6) + [text(rng, 70) for _ in range(4)]:
            got, _ = probabilities(cached, [body(state)])
            assert worst(got, probabilities(plain, [body(state)])[0]) <= TOLERANCE
            stats = cached.backbone.prefix_cache.stats()
            assert stats.bytes <= stats.max_bytes
        assert cached.backbone.prefix_cache.stats().evictions > 0
    finally:
        cached.close()


def test_interleaved_clients_over_http(fx, plain, tmp_path):
    spec = tiny_spec(fx, prefix_cache_mb=64, prefix_cache_every=32)
    rng = random.Random(4)
    conversations = [conversation(rng, 4) for _ in range(3)]
    with RunningServer(registry_for(spec, tmp_path / "m.toml")) as srv:
        async def client(states, session):
            out = []
            for state in states:
                for name in QUESTIONS:
                    async with session.post(f"{srv.url}/v1/systemone", json=body(state, name)) as resp:
                        out.append((body(state, name), resp.status, await resp.json()))
            return out

        async def main():
            async with aiohttp.ClientSession() as session:
                return await asyncio.gather(*(client(c, session) for c in conversations))

        results = [r for rs in asyncio.run(main()) for r in rs]
        hits = srv.metric("clef_prefix_cache_hits_total", model="tiny")
        reused = srv.metric("clef_prefix_cache_tokens_reused_total", model="tiny")
    assert all(status == 200 for _, status, _ in results)
    for request, _, served in results:
        expected = respond(plain, request)["answers"]
        for qid, answer in served["answers"].items():
            a, b = answer.get("probabilities", {"p": answer.get("noul")}), \
                expected[qid].get("probabilities", {"p": expected[qid].get("noul")})
            assert all(abs(a[k] - b[k]) <= TOLERANCE + 1e-4 for k in a)  # both rounded to 4 decimals
    assert sum(r["x_timings"]["reused_tokens"] > 0 for _, _, r in results) >= 24 and hits >= 24 and reused > 0


def test_a_fault_leaves_no_poisoned_checkpoint(fx, plain, tmp_path):
    """A real llama_decode failure in a batch wipes the cache; what follows is still exact."""
    spec = tiny_spec(fx, prefix_cache_mb=64, prefix_cache_every=32)
    rng = random.Random(5)
    states = conversation(rng, 3)
    with RunningServer(registry_for(spec, tmp_path / "m.toml"), faulty_loader) as srv:
        assert srv.post(body(states[0])).status == 200
        assert srv.post(body({**states[1], "note": "POISON"})).status == 503
        assert srv.post(body({**states[1], "note": "NANHEAD"})).status == 503
        replies = [srv.post(body(s)) for s in states]
        faults = srv.metric("clef_prefix_cache_faults_total", model="tiny")
    assert faults >= 1  # the failed decode emptied the cache
    for state, reply in zip(states, replies):
        got = reply.json()["answers"]["urgent"]["noul"]
        assert abs(got - respond(plain, body(state))["answers"]["urgent"]["noul"]) <= TOLERANCE + 1e-4


@pytest.mark.skipif(not os.path.exists("/proc/self/status"), reason="reads RSS from /proc")
def test_memory_stays_within_the_budget(fx):
    """400 requests of 100 growing conversations through a 0.5 MB cache: bytes never above the budget, and
    the process's memory flat after warm-up (the cache's own bytes plus a bounded overhead). A 2,000-request
    run of the same loop (2 MB budget) grew 11 MiB of RSS in all; see docs/prefix-cache.md."""
    cached = cached_model(fx, prefix_cache_mb=0.5, prefix_cache_every=16)
    rng = random.Random(6)
    conversations = [conversation(rng, 4) for _ in range(100)]

    def rss_mb() -> float:
        with open("/proc/self/status") as f:
            return next(int(line.split()[1]) for line in f if line.startswith("VmRSS:")) / 1024

    try:
        samples, peak = [], 0
        for i in range(50):  # 50 batches of 8 = 400 requests
            batch = [body(conversations[(i * 8 + j) % 100][(i * 8 + j) // 100], "urgent") for j in range(8)]
            score_batch(cached, [prepare(cached, b) for b in batch])
            stats = cached.backbone.prefix_cache.stats()
            peak = max(peak, stats.bytes)
            assert stats.bytes <= stats.max_bytes
            if i % 10 == 9:
                samples.append(rss_mb())
        stats = cached.backbone.prefix_cache.stats()
    finally:
        cached.close()
    print(f"prefix cache over 400 requests: {stats.hits} hits, {stats.evictions} evictions, peak "
          f"{peak / 2**20:.2f} MiB of {stats.max_bytes / 2**20:.0f}; RSS after warm-up {samples[1]:.1f} MiB, "
          f"at the end {samples[-1]:.1f} MiB")
    assert stats.hits > 100 and stats.evictions > 0  # a small budget churns: about half the requests hit
    assert samples[-1] - samples[1] <= 16  # MiB: no growth beyond the budget's churn
