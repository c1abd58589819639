"""The prefix cache as a property: whatever the edit and wherever it falls (before, at or after a
checkpoint; replaced, inserted or deleted tokens), inside one batch or across batches, a cached prefill
gives the rows a plain prefill of the whole prompt gives, and never claims a prefix it has not seen.

Hypothesis draws the edits; the examples are derandomized (the same ones every run) and few, so the
whole test stays within seconds on the tiny model. Tolerance as tests/test_prefix_cache.py: 1e-4.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pytest
from clef_bridge.bridge.llama.backbone import Backbone, BackboneOptions
from clef_bridge.bridge.llama.prefix_cache import PrefillRequest, PrefixCacheOptions
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

pytestmark = pytest.mark.integration

TOL = 1e-4
EVERY, MARGIN = 32, 4  # a checkpoint every 32 tokens: several per state, inside and across ubatches of 64
PREFIX = np.random.default_rng(70).integers(1000, 100000, size=20).astype(np.int32)
START = len(PREFIX)  # the state (the cache span) starts here


def backbone_options(cache: PrefixCacheOptions | None) -> BackboneOptions:
    return BackboneOptions(n_ctx=4096, n_seq_max=4, n_ubatch=64, n_threads=2,
                           **({"prefix_cache": cache} if cache else {}))


@pytest.fixture(scope="module")
def plain(fx):
    with Backbone(fx.gguf_f32, backbone_options(None)) as backbone:
        yield backbone


@pytest.fixture(scope="module")
def cached(fx):
    cache = PrefixCacheOptions(max_mb=64, every=EVERY, margin=MARGIN, sequences=4)
    with Backbone(fx.gguf_f32, backbone_options(cache)) as backbone:
        yield backbone


@dataclass(frozen=True)
class Edit:
    kind: str  # "replace", "insert" or "delete"
    at: int  # absolute token position in the prompt (inside the state)
    size: int  # tokens inserted or deleted (replace: 1)


@dataclass(frozen=True)
class Scenario:
    state: int  # tokens in the original state
    edits: tuple[tuple[Edit, ...], ...]  # per edited variant, its edits (applied back to front)
    batches: tuple[tuple[int, ...], ...]  # which prompts go in each batch: 0 is the original, i the i-th variant
    seed: int
    partitioned: bool = False  # odd-numbered prompts in a partition of their own (prompt_cache_key)

    def partition(self, prompt: int) -> tuple[str, ...]:
        return ("odd",) if self.partitioned and prompt % 2 else ()


def checkpoints(state: int) -> list[int]:
    """Where a cold prefill of a state this long stops to checkpoint: multiples of EVERY and the margin."""
    end = START + state - MARGIN
    return sorted({c for c in range(EVERY, end, EVERY) if c > START} | {end})


@st.composite
def edits_for(draw, state: int) -> tuple[Edit, ...]:
    out = []
    for _ in range(draw(st.integers(1, 2))):
        if draw(st.booleans()):  # near a checkpoint: 9 tokens before it to 9 after, the checkpoint itself included
            at = draw(st.sampled_from(checkpoints(state))) + draw(st.integers(-9, 9))
        else:
            at = draw(st.integers(START, START + state - 1))
        at = min(max(at, START), START + state - 1)
        kind = draw(st.sampled_from(["replace", "replace", "insert", "delete"]))
        out.append(Edit(kind, at, 1 if kind == "replace" else draw(st.integers(1, 6))))
    return tuple(sorted(out, key=lambda e: -e.at))


@st.composite
def scenarios(draw) -> Scenario:
    state = draw(st.integers(60, 150))
    variants = tuple(draw(edits_for(state)) for _ in range(draw(st.integers(1, 2))))
    prompts = list(range(len(variants) + 1)) + draw(st.lists(st.integers(0, len(variants)), max_size=1))
    order = draw(st.permutations(prompts))
    if draw(st.booleans()) and len(order) > 1:  # across batches: split the prompts in two decodes
        cut = draw(st.integers(1, len(order) - 1))
        batches = (tuple(order[:cut]), tuple(order[cut:]))
    else:  # one batch: followers join leaders inside the decode
        batches = (tuple(order),)
    return Scenario(state, variants, batches, draw(st.integers(0, 2**16)), draw(st.booleans()))


def apply(state: np.ndarray, edits: tuple[Edit, ...], rng: np.random.Generator) -> np.ndarray:
    """The edited state; positions are absolute prompt positions, edits applied from the back."""
    out = state.copy()
    for e in edits:
        i = e.at - START
        if e.kind == "replace":
            out[i] = out[i] + 1 if out[i] < 99999 else 1000
        elif e.kind == "insert":
            out = np.concatenate([out[:i], rng.integers(1000, 100000, size=e.size).astype(np.int32), out[i:]])
        elif len(out) - e.size > 8:
            out = np.concatenate([out[:i], out[i + e.size:]])
    return out


def common(a: np.ndarray, b: np.ndarray) -> int:
    n = min(len(a), len(b))
    differ = np.flatnonzero(a[:n] != b[:n])
    return int(differ[0]) if len(differ) else n


NEAR_MISS = Scenario(  # an edit 3 tokens before the checkpoint at 64, both prompts in one batch: the follower
    100, ((Edit("replace", 61, 1),),), ((0, 1),), 1)  # must join its leader at 32, not at 64
ACROSS = Scenario(100, ((Edit("replace", 64, 1),), (Edit("insert", 70, 3),)), ((0,), (1, 2, 0)), 2)
APART = Scenario(100, ((Edit("replace", 90, 1),),), ((0, 1), (1, 0)), 3, partitioned=True)  # restores its own


@settings(max_examples=30, deadline=None, derandomize=True, database=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@example(NEAR_MISS)
@example(ACROSS)
@example(APART)
@given(scenarios())
def test_any_edit_gives_a_plain_prefills_hidden_states(cached, plain, scenario):
    rng = np.random.default_rng(scenario.seed)
    state = rng.integers(1000, 100000, size=scenario.state).astype(np.int32)
    states = [state] + [apply(state, edits, rng) for edits in scenario.edits]
    cached.prefix_cache.clear()
    seen: list[PrefillRequest] = []
    for batch in scenario.batches:
        requests = [PrefillRequest(np.concatenate([PREFIX, states[i], rng.integers(1000, 100000, size=12 + k)
                                                  .astype(np.int32)]), (START, START + len(states[i])),
                                   scenario.partition(i))
                    for k, i in enumerate(batch)]
        results = cached.prefill_cached(requests)
        expected = plain.prefill_many([r.tokens for r in requests])
        for k, (req, result, full) in enumerate(zip(requests, results, expected, strict=True)):
            # a prefix is only reused from a prompt of its partition decoded before, or earlier in the same batch
            known = max((common(req.tokens, other.tokens) for other in seen + requests[:k]
                         if other.partition == req.partition), default=0)
            assert result.reused <= known, (k, result.reused, known)
            assert result.hidden.shape == (len(req.tokens) - result.reused, cached.n_embd)
            np.testing.assert_allclose(result.hidden, full[result.reused:], rtol=0, atol=TOL,
                                       err_msg=f"prompt {k} of batch {batch}, reused {result.reused}")
        seen += requests
