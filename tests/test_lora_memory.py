"""Memory for fine-tunes: `fit` and the loader's plan count one base plus N adapters plus N heads; the 16 GB picture
of docs/fine-tunes.md comes from these plans (Clef-flash's published shapes, bridge/config/presets.py)."""

from __future__ import annotations

import pytest
from clef_bridge.bridge.config.memory_plan import GIB, lora_bytes, lora_linears, plan_inputs
from clef_bridge.bridge.config.presets import arch_preset
from clef_bridge.head.config import HeadConfig
from clef_bridge.tools.fit import fit

pytestmark = pytest.mark.unit


def flash_fit(adapters: int, rank: int, quant: str = "Q8_0", head_on_gpu: bool = False):
    return fit(None, "clef-flash", quant, 16 * GIB, 16384, 1, 512, head_on_gpu, adapters=adapters, lora_rank=rank)


def test_clef_flash_has_every_clef_finetune_target_per_layer():
    arch = arch_preset("clef-flash", "Q8_0")
    linears = lora_linears(arch)
    assert len(linears) == arch.n_full * 7 + (arch.n_layer - arch.n_full) * 8
    assert lora_bytes(arch, 256) == 4 * lora_bytes(arch, 64) > 2 * GIB  # float32 A and B


def test_adapters_and_their_heads_add_to_the_plan():
    base, three = flash_fit(0, 64, head_on_gpu=True), flash_fit(3, 64, head_on_gpu=True)
    assert three.adapter_bytes == 3 * lora_bytes(arch_preset("clef-flash", "Q8_0"), 64)
    assert three.plan.head_bytes == 3 * base.plan.head_bytes + three.adapter_bytes
    assert three.plan.total_bytes > base.plan.total_bytes + three.adapter_bytes


def test_plan_inputs_count_heads_and_adapters():
    cfg = HeadConfig(hidden_size=64, width=32, routing_layers=1, layers=1, heads=2, feedforward=64)
    one = plan_inputs(cfg, "cuda", "f32", None)
    two = plan_inputs(cfg, "cuda", "f32", None, heads=2, adapter_bytes=1000)
    assert two.head_bytes == 2 * one.head_bytes and two.beside_bytes == two.head_bytes + 1000
    assert plan_inputs(cfg, "cpu", "f32", None, heads=3, adapter_bytes=7).beside_bytes == 7


@pytest.mark.parametrize("rank, most", [(16, 38), (64, 9), (256, 2)])
def test_the_16_gb_picture_of_the_docs(rank, most):
    assert flash_fit(most, rank).ok and not flash_fit(most + 1, rank).ok
