"""bench-head's pieces: the 255-option layout, weights rounded as a file holds them, runs in turns."""

from __future__ import annotations

import numpy as np
import pytest
from clef_bridge.head.weights import load_state_dict, save_state_dict

from benchmarks.__main__ import main
from benchmarks.bench_head import rounded, schema_layout, turns_ms

from .randomhead import random_state_dict
from .test_head_device import TINY

pytestmark = pytest.mark.unit


def test_options_put_one_choice_after_a_state_of_the_given_length():
    layout, total = schema_layout(750, 255)
    assert layout.question_spans.tolist()[0][0] == 750  # the state fills the 750 tokens before the question
    assert len(layout.option_spans) == 255 and layout.types.tolist() == [1] and layout.option_spans[-1, 1] < total
    router, tokens = schema_layout(750, None)
    assert tokens == 750 and len(router.option_spans) == 19 and len(router.types) == 4


def test_weights_are_rounded_as_the_file_holds_them(tmp_path):
    flat = random_state_dict(TINY, seed=1)
    for dtype in ("BF16", "F16"):
        save_state_dict(tmp_path / f"{dtype}.safetensors", flat, dtype)
        stored = load_state_dict(tmp_path / f"{dtype}.safetensors", TINY)
        ours = rounded(flat, dtype)
        assert all(np.array_equal(ours[k], stored[k]) for k in flat)
        assert any(not np.array_equal(ours[k], flat[k]) for k in flat)


def test_turns_alternate_the_sides():
    calls = []
    times = turns_ms([lambda: calls.append("a"), lambda: calls.append("b")], 3)
    assert calls == ["a", "b"] * 4  # a warm-up call each, then three turns
    assert [len(t) for t in times] == [3, 3] and all(t >= 0 for ts in times for t in ts)


def test_cli_rejects_an_unknown_head_dtype(capsys):
    with pytest.raises(SystemExit) as exited:
        main(["bench-head", "--head-dtype", "int8"])
    assert exited.value.code == 2
    assert "invalid choice" in capsys.readouterr().err
