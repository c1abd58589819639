"""Span means and option routing without Python loops equal the per-span and per-question loops
they replaced, on numpy and on the strict CuPy stand-in, edge cases included."""

from __future__ import annotations

import math

import numpy as np
import pytest
from clef_bridge.head.model import option_summaries, span_means

from .strictcupy import StrictCuPy

pytestmark = pytest.mark.unit

TOLERANCE = 1e-5  # relative to the values' scale; float32 sums in another order


def loop_span_means(x, spans):
    return np.stack([x[s:e].mean(axis=0) for s, e in spans.tolist()])


def loop_summaries(options, base, counts):
    out, start = [], 0
    for q, n in enumerate(counts):
        opts = options[start:start + n]
        route = (opts * base[q]).sum(-1) / np.float32(math.sqrt(options.shape[-1]))
        p = np.exp(route - route.max())
        out.append((p / p.sum()) @ opts)
        start += n
    return np.stack(out)


def spans_from(lengths, gaps):
    """Spans of these lengths with these gaps before each (and the rows after the last)."""
    starts = np.cumsum(gaps[:-1]) + np.concatenate([[0], np.cumsum(lengths)[:-1]])
    return np.stack([starts, starts + lengths], axis=1), int(sum(lengths) + sum(gaps))


def span_cases():
    rng = np.random.default_rng(0)
    n = 40
    yield "random", spans_from(rng.integers(1, 12, n), rng.integers(0, 5, n + 1))
    yield "single-token", spans_from(np.ones(n, int), rng.integers(0, 3, n + 1))
    yield "adjacent, from row 0 to the last row", spans_from(rng.integers(1, 6, n), np.zeros(n + 1, int))
    yield "one span", spans_from(np.array([7]), np.array([3, 2]))
    yield "one row", spans_from(np.array([1]), np.array([0, 0]))
    yield "one long span among short ones", spans_from(np.array([1, 300, 1, 2]), np.array([5, 0, 1, 0, 9]))
    questions, rows = spans_from(rng.integers(1, 12, n), rng.integers(0, 5, n + 1))
    yield "two kinds interleaved, as question and option spans", (np.concatenate([questions[::4], questions]), rows)


CASES = dict(span_cases())


def on(xp, *arrays):
    return [a if xp is np else xp.asarray(a) for a in arrays]


def host(xp, x):
    return x if xp is np else xp.asnumpy(x)


@pytest.mark.parametrize("device", [False, True], ids=["numpy", "stand-in"])
@pytest.mark.parametrize("case", list(CASES))
def test_span_means_equal_the_loop(case, device):
    spans, rows = CASES[case]
    rng = np.random.default_rng(1)
    x = (rng.standard_normal((rows, 96)) * 3 + 5).astype(np.float32)  # an offset, as LayerNorm biases give
    xp = StrictCuPy() if device else np
    (dx,) = on(xp, x)
    got = host(xp, span_means(dx, spans))
    want = loop_span_means(x, spans)
    assert got.shape == want.shape == (len(spans), 96) and got.dtype == np.float32
    np.testing.assert_allclose(got, want, rtol=TOLERANCE, atol=TOLERANCE * np.abs(want).max())
    if len(spans) > 1:  # the spans really differ, so a mix-up of rows would show
        assert np.abs(want[0] - want[1]).max() > 0.1


@pytest.mark.parametrize("device", [False, True], ids=["numpy", "stand-in"])
@pytest.mark.parametrize("counts, scale", [
    ([2], 1.0),  # one question, the fewest options
    ([2, 2, 2], 1.0),
    ([2, 7, 5, 5], 1.0),
    ([255, 3, 2], 1.0),
    ([3, 4, 2], 40.0),  # routing scores in the hundreds: a shared shift would underflow other questions
], ids=["one-question", "pairs", "router", "255-options", "large-scores"])
def test_option_summaries_equal_the_per_question_loop(counts, scale, device):
    rng = np.random.default_rng(2)
    w = 64
    options = rng.standard_normal((sum(counts), w)).astype(np.float32)
    base = (rng.standard_normal((len(counts), w)) * scale).astype(np.float32)
    base[0] *= -1  # question 0's scores have the opposite sign to the others'
    option_question = np.repeat(np.arange(len(counts)), counts)
    xp = StrictCuPy() if device else np
    d_options, d_base, d_oq = on(xp, options, base, option_question)
    got = host(xp, option_summaries(d_options, d_base, d_oq))
    want = loop_summaries(options, base, counts)
    assert got.shape == want.shape == (len(counts), w) and np.isfinite(got).all()
    np.testing.assert_allclose(got, want, rtol=TOLERANCE, atol=TOLERANCE)
    if scale > 1:  # the weights are sharp, not uniform: the test sees which option wins
        assert np.abs(want[0] - options[:counts[0]].mean(0)).max() > 0.5
