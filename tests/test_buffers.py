"""bridge/llama/buffers.py: which tensors `--n-cpu-moe N` keeps in host memory (the override array, which needs
llama.cpp's library, is tests/test_buffers_llama.py's)."""

from __future__ import annotations

import re

import pytest
from clef_bridge.bridge.llama.buffers import cpu_experts, expert_pattern, is_expert_tensor, overridden

pytestmark = pytest.mark.unit


@pytest.mark.parametrize("name", ["blk.0.ffn_up_exps.weight", "blk.12.ffn_down_exps.weight",
                                  "blk.3.ffn_gate_exps.weight", "blk.3.ffn_gate_up_exps.weight",
                                  "blk.7.ffn_down_chexps.weight"])
def test_expert_matrices_are_expert_tensors(name):
    assert is_expert_tensor(name)


@pytest.mark.parametrize("name", ["blk.0.ffn_up.weight", "blk.0.ffn_up_shexp.weight", "blk.0.ffn_gate_inp.weight",
                                  "blk.0.attn_q.weight", "token_embd.weight"])
def test_dense_shared_and_router_tensors_are_not(name):
    assert not is_expert_tensor(name)


def test_the_pattern_takes_the_first_blocks_only():
    pattern = re.compile(expert_pattern(2))
    assert pattern.search("blk.0.ffn_up_exps.weight") and pattern.search("blk.1.ffn_down_exps.weight")
    for other in ("blk.2.ffn_up_exps.weight", "blk.10.ffn_up_exps.weight", "blk.11.ffn_gate_exps.weight",
                  "blk.1.ffn_up.weight"):
        assert not pattern.search(other), other


def test_no_blocks_means_no_overrides_and_unresolved_counts_are_refused():
    assert cpu_experts(0) is None
    for bad in ("auto", True, 1.5):
        with pytest.raises(ValueError, match="resolved to a number"):
            cpu_experts(bad)
    with pytest.raises(ValueError, match="0 or more"):
        cpu_experts(-1)


def test_the_load_log_tells_where_each_tensor_went():
    log = ("llama_model_load: tensor blk.0.ffn_up_exps.weight (12 MiB q4_K) buffer type overridden to CPU\n"
           "load_tensors: tensor blk.1.ffn_down_exps.weight (3 MiB q6_K) buffer type overridden to CUDA_Host\n"
           "load_tensors: offloaded 2/2 layers to GPU\n")
    assert overridden(log) == {"blk.0.ffn_up_exps.weight": "CPU", "blk.1.ffn_down_exps.weight": "CUDA_Host"}
