"""The backbone's prefix cache: hidden states with it equal those without it, over the traffic it must survive.

Every check compares the cached backbone's rows of tokens[reused:] with a plain prefill of the whole
prompt on a second backbone (same GGUF, no cache). Tolerance: 1e-4 absolute on the hidden states
(they are O(1) on the tiny model; restored prefixes and a different ubatch split differ by ~1e-5).
Prompts are random token ids shaped like Clef's: a fixed prefix, the state (the cache span), a question.
"""

from __future__ import annotations

from dataclasses import replace

import llama_cpp as lc
import numpy as np
import pytest
from clef_bridge.bridge.llama.backbone import Backbone, BackboneOptions, DecodeFailed
from clef_bridge.bridge.llama.prefix_cache import PrefillRequest, PrefixCacheOptions

pytestmark = pytest.mark.integration

TOL = 1e-4
EVERY, MARGIN = 64, 4
PREFIX = np.random.default_rng(7).integers(1000, 100000, size=30).astype(np.int32)


def options(**cache) -> BackboneOptions:
    settings = dict(max_mb=64, every=EVERY, margin=MARGIN, sequences=4) | cache
    return BackboneOptions(n_ctx=4096, n_seq_max=4, n_ubatch=128, n_threads=2,
                           prefix_cache=PrefixCacheOptions(**settings))


@pytest.fixture(scope="module")
def plain(fx):
    with Backbone(fx.gguf_f32, BackboneOptions(n_ctx=4096, n_seq_max=4, n_ubatch=128, n_threads=2)) as backbone:
        yield backbone


@pytest.fixture(scope="module")
def shared(fx):
    with Backbone(fx.gguf_f32, options()) as backbone:
        yield backbone


@pytest.fixture
def cached(shared):
    shared.prefix_cache.clear()
    return shared


class Words:
    """Random token ids, reproducible per test."""

    def __init__(self, seed: int):
        self.rng = np.random.default_rng(seed)

    def __call__(self, n: int) -> np.ndarray:
        return self.rng.integers(1000, 100000, size=n).astype(np.int32)


def request(state: np.ndarray, question: np.ndarray) -> PrefillRequest:
    start = len(PREFIX)
    return PrefillRequest(np.concatenate([PREFIX, state, question]), (start, start + len(state)))


def check(cached: Backbone, plain: Backbone, requests: list[PrefillRequest]) -> list[int]:
    """Prefill with and without the cache; assert equal rows; return each request's reused length."""
    results = cached.prefill_cached(requests)
    expected = plain.prefill_many([r.tokens for r in requests])
    for result, full, req in zip(results, expected, requests):
        assert result.hidden.shape == (len(req.tokens) - result.reused, cached.n_embd)
        np.testing.assert_allclose(result.hidden, full[result.reused:], rtol=0, atol=TOL)
    return [r.reused for r in results]


def span_end(req: PrefillRequest) -> int:
    return req.cache_span[1]


def test_appended_state_reuses_the_previous_turn(cached, plain):
    words = Words(1)
    state = words(150)
    previous = None
    for turn in range(5):
        req = request(state, words(40))
        [reused] = check(cached, plain, [req])
        assert reused == (span_end(previous) - MARGIN if previous else 0)
        previous, state = req, np.concatenate([state, words(90)])
    stats = cached.prefix_cache.stats()
    assert (stats.hits, stats.misses) == (4, 1)
    assert stats.tokens_reused == sum(len(PREFIX) + 150 + 90 * t - MARGIN for t in range(4))


def test_same_state_different_questions(cached, plain):
    words = Words(2)
    state = words(300)
    reqs = [request(state, words(n)) for n in (20, 45, 33, 60)]
    assert check(cached, plain, reqs[:1]) == [0]
    for req in reqs[1:]:
        assert check(cached, plain, [req]) == [span_end(req) - MARGIN]


def test_unrelated_states_and_a_shared_system_prompt_only(cached, plain):
    words = Words(3)
    check(cached, plain, [request(words(200), words(30))])
    # the fixed prefix is outside every cache span: nothing before the state is checkpointed
    assert check(cached, plain, [request(words(200), words(30))]) == [0]
    assert check(cached, plain, [PrefillRequest(words(250))]) == [0]


def test_a_diverging_state_restores_the_last_checkpoint_before_the_change(cached, plain):
    words = Words(4)
    state = words(300)
    check(cached, plain, [request(state, words(30))])
    edited = state.copy()
    edited[200] += 1  # an edit inside the state: checkpoints at 64, 128, 192 (absolute) still match
    assert check(cached, plain, [request(edited, words(30))]) == [192]


def test_interleaved_clients(cached, plain):
    words = Words(5)
    states = [words(120), words(140), words(160)]
    last: list[PrefillRequest | None] = [None, None, None]
    for _ in range(3):
        for client in range(3):
            req = request(states[client], words(25))
            [reused] = check(cached, plain, [req])
            assert reused == (span_end(last[client]) - MARGIN if last[client] else 0)
            last[client] = req
            states[client] = np.concatenate([states[client], words(70)])


def test_mixed_hits_and_misses_in_one_batch(cached, plain):
    words = Words(6)
    a, b = words(200), words(260)
    check(cached, plain, [request(a, words(20)), request(b, words(20))])
    batch = [request(a, words(31)), request(words(180), words(20)), request(b, words(17)), request(a, words(44))]
    reused = check(cached, plain, batch)
    assert reused == [span_end(batch[0]) - MARGIN, 0, span_end(batch[2]) - MARGIN, span_end(batch[3]) - MARGIN]
    # the miss made its checkpoints in the same decode: it hits now
    assert check(cached, plain, [request(batch[1].tokens[30:210], words(9))]) == [span_end(batch[1]) - MARGIN]


def test_duplicates_in_one_batch_keep_one_checkpoint_chain(cached, plain):
    words = Words(7)
    state = words(200)
    before = cached.prefix_cache.stats().checkpoints
    assert check(cached, plain, [request(state, words(20)), request(state, words(30))]) == [0, 0]
    made = cached.prefix_cache.stats().checkpoints - before
    assert made == len(range(EVERY, len(PREFIX) + 200 - MARGIN, EVERY)) + 1
    assert check(cached, plain, [request(state, words(12))]) == [len(PREFIX) + 200 - MARGIN]


def test_eviction_under_a_small_budget(fx, plain):
    words = Words(8)
    with Backbone(fx.gguf_f32, options(sequences=2)) as probe:
        probe.prefill_cached([request(words(100), words(10))])
        state_bytes = probe.prefix_cache.stats().bytes // 2  # checkpoints at 64 and 126
    budget = 5 * state_bytes  # room for 5 recurrent states
    with Backbone(fx.gguf_f32, options(max_mb=budget / 2**20, sequences=2)) as small:
        states = [words(300) for _ in range(4)]
        for round_ in range(3):
            for client, state in enumerate(states):
                check(small, plain, [request(state, words(15 + client))])
                stats = small.prefix_cache.stats()
                assert stats.bytes <= stats.max_bytes
                assert stats.branches <= 2
        assert stats.evictions > 0
        # the most recent client still hits its last checkpoint; the rest were evicted or kept, never wrong
        assert check(small, plain, [request(states[-1], words(5))]) == [len(PREFIX) + 300 - MARGIN]


def test_eviction_for_the_context_cells(fx, plain):
    words = Words(9)
    with Backbone(fx.gguf_f32, BackboneOptions(n_ctx=1024, n_seq_max=4, n_ubatch=128, n_threads=2,
                                               prefix_cache=PrefixCacheOptions(max_mb=64, every=EVERY,
                                                                               margin=MARGIN))) as tight:
        for _ in range(4):
            state = words(400)
            check(tight, plain, [request(state, words(20))])
            assert check(tight, plain, [request(state, words(25))]) == [len(PREFIX) + 400 - MARGIN]
            assert tight.prefix_cache.stats().cells <= 1024
        # a batch that needs every cell runs without the cache, and right
        big = [request(words(420), words(10)) for _ in range(2)]
        check(tight, plain, big)
        assert tight.prefix_cache.stats().evictions > 0


def test_a_failed_decode_leaves_no_checkpoint_behind(cached, plain):
    words = Words(10)
    state = words(300)
    check(cached, plain, [request(state, words(20))])
    aborting = {"on": False}

    @lc.ggml_abort_callback
    def abort(_):
        return aborting["on"]

    lc.llama_set_abort_callback(cached._ctx, abort, None)
    faults = cached.prefix_cache.stats().faults
    try:
        aborting["on"] = True
        with pytest.raises(DecodeFailed):  # a hit and a miss, aborted inside llama_decode
            cached.prefill_cached([request(state, words(25)), request(words(200), words(25))])
        aborting["on"] = False
        stats = cached.prefix_cache.stats()
        assert (stats.faults - faults, stats.bytes, stats.cells, stats.branches) == (1, 0, 0, 0)
        assert check(cached, plain, [request(state, words(30))]) == [0]
        assert check(cached, plain, [request(state, words(35))]) == [len(PREFIX) + 300 - MARGIN]
    finally:
        lc.llama_set_abort_callback(cached._ctx, lc.ggml_abort_callback(), None)  # NULL: the callback dies here


def test_non_finite_hidden_states_are_not_cached(cached, plain, monkeypatch):
    words = Words(11)
    state = words(250)
    real = cached.decode_chunks

    def poisoned(chunks):
        rows = real(chunks)
        rows[-1, 0] = np.nan  # the last chunk's request
        return rows

    faults = cached.prefix_cache.stats().faults
    monkeypatch.setattr(cached, "decode_chunks", poisoned)
    [result] = cached.prefill_cached([request(state, words(20))])
    assert np.isnan(result.hidden).any()
    monkeypatch.undo()
    assert cached.prefix_cache.stats().faults == faults + 1
    assert check(cached, plain, [request(state, words(20))]) == [0]  # nothing was kept from the poisoned run


def test_payloads_cover_the_reused_prefix(fx, plain):
    words = Words(12)
    with Backbone(fx.gguf_f32, options(payloads=True)) as backbone:
        state = words(200)
        [first] = backbone.prefill_cached([request(state, words(20))])
        assert first.ticket and first.new_segments[0][0] == 0
        assert [e for _, e in first.new_segments] == [64, 128, 192, len(PREFIX) + 200 - MARGIN]
        # not attached yet: no hit
        assert check(backbone, plain, [request(state, words(21))]) == [0]
        backbone.prefix_cache.attach(first.ticket, [np.arange(s, e) for s, e in first.new_segments])
        grown = np.concatenate([state, words(100)])
        [hit] = backbone.prefill_cached([request(grown, words(22))])
        assert hit.reused == len(PREFIX) + 200 - MARGIN
        np.testing.assert_array_equal(np.concatenate(hit.prefix_payloads), np.arange(hit.reused))
        assert hit.new_segments == ((hit.reused, 256), (256, 320), (320, len(PREFIX) + 300 - MARGIN))
        backbone.prefix_cache.discard(hit.ticket)  # its head failed: the grown state's checkpoint goes
        assert check(backbone, plain, [request(grown, words(23))]) == [len(PREFIX) + 200 - MARGIN]


def test_prefill_many_with_the_cache_on_keeps_it(cached, plain):
    words = Words(13)
    state = words(200)
    check(cached, plain, [request(state, words(20))])
    other = [words(300), words(100)]
    for got, want in zip(cached.prefill_many(other), plain.prefill_many(other)):
        np.testing.assert_allclose(got, want, rtol=0, atol=TOL)
    assert check(cached, plain, [request(state, words(20))]) == [len(PREFIX) + 200 - MARGIN]


def test_without_a_cache_every_request_is_a_miss(plain):
    words = Words(14)
    req = request(words(100), words(20))
    [result] = plain.prefill_cached([req])
    assert (result.reused, result.ticket, result.prefix_payloads) == (0, 0, ())
    np.testing.assert_array_equal(result.hidden, plain.prefill(req.tokens))


def test_a_state_growing_in_its_middle_restores_one_change_behind(fx, plain):
    """Like {"messages":[...],"task":"..."}: the list grows before a fixed tail, past the margin checkpoint."""
    words = Words(15)
    tail = words(20)
    with Backbone(fx.gguf_f32, options(every=4096)) as backbone:
        history = words(120)
        boundaries = []
        for turn in range(4):
            reused = check(backbone, plain, [request(np.concatenate([history, tail]), words(30))])
            assert reused == [boundaries[-2] if len(boundaries) > 1 else 0]
            boundaries.append(len(PREFIX) + len(history))
            history = np.concatenate([history, words(80)])


def test_one_batch_decodes_a_shared_new_prefix_once(cached, plain):
    words = Words(16)
    state, other = words(300), words(200)
    before = cached.prefix_cache.stats()
    batch = [request(state, words(20)), request(other, words(20)), request(state, words(33)),
             request(state, words(41))]
    assert check(cached, plain, batch) == [0, 0, 0, 0]
    after = cached.prefix_cache.stats()
    shared = len(PREFIX) + 300 - MARGIN  # the leader's last checkpoint before the state's end
    assert after.shared - before.shared == 2
    assert after.tokens_prefilled - before.tokens_prefilled == sum(len(r.tokens) for r in batch) - 2 * shared
    # and on a hit: two followers of a request restoring the same checkpoint
    grown = np.concatenate([state, words(150)])
    batch = [request(grown, words(20)), request(grown, words(25)), request(grown, words(30))]
    assert check(cached, plain, batch) == [shared] * 3
    assert cached.prefix_cache.stats().shared - after.shared == 2


def test_the_agent_loop_benchmark_runs_on_the_tiny_model(fx, capsys):
    from benchmarks.agent_loop import AgentLoopConfig, agent_loop
    from benchmarks.render import text  # the package's renderer, with the benchmarks' results registered

    cfg = AgentLoopConfig(turns=3, message_tokens=60, questions=2, state_tokens=120, baseline_turns=1,
                          baseline_questions=1, n_ctx=2048)
    result = agent_loop(fx.gguf_f32, fx.head, cfg)
    assert [t["turn"] for t in result.turns] == [1, 2, 3]
    assert [t["plain_p50_ms"] is not None for t in result.turns] == [False, False, True]
    assert (result.cache["hits"], result.cache["misses"]) == (5, 1)  # every request after the first hits
    assert result.speedup > 0 and result.split_ms["head"] > 0
    assert [r["reused"] > 0 for r in result.same_state] == [False, True]
    assert "uncached / cached" in text(result) and "plain_over_cached" in result.to_dict()


def test_partitions_share_no_kv_in_a_batch_or_across_batches(cached, plain):
    words = Words(21)
    state, question = words(150), words(6)
    alice, bob = (replace(request(state, question), partition=(who,)) for who in ("alice", "bob"))
    shared = cached.prefix_cache.stats().shared
    assert check(cached, plain, [alice, bob]) == [0, 0]  # the same prompt, decoded twice
    assert cached.prefix_cache.stats().shared == shared
    assert check(cached, plain, [alice])[0] > 0
    assert check(cached, plain, [replace(alice, partition=("carol",)), request(state, question)]) == [0, 0]
    assert check(cached, plain, [bob])[0] > 0
