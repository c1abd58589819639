"""What needs llama.cpp's library beside a model: bridge/llama/buffers.py's override array against llama-cpp-python's
structs and ggml's CPU buffer type, and bridge/llama/log.py's callback installed."""

from __future__ import annotations

import llama_cpp as lc
import pytest
from clef_bridge.bridge.llama import log
from clef_bridge.bridge.llama.buffers import cpu_experts, expert_pattern

pytestmark = pytest.mark.integration  # loads llama.cpp's library: not for `-m unit`, which runs without it


def test_the_override_array_points_at_the_cpu_buffer_type_and_ends_in_null():
    overrides = cpu_experts(3)
    assert overrides.patterns == (expert_pattern(3).encode(),)
    first, last = overrides.array
    assert first.pattern == overrides.patterns[0] and first.buft
    assert last.pattern is None and not last.buft  # the terminator
    mparams = lc.llama_model_default_params()
    overrides.apply(mparams)
    assert mparams.tensor_buft_overrides  # set


def test_install_routes_llama_cpps_log_here_with_the_verbosity(monkeypatch):
    calls = []
    monkeypatch.setattr(log.lc.load(), "llama_log_set", lambda callback, user: calls.append(callback))
    monkeypatch.setattr(log._SINK, "verbose", False)
    log.install(verbose=True)
    assert calls == [log._callback()] and log._SINK.verbose is True
