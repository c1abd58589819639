"""python -m benchmarks lora on the tiny fixtures: it runs, the adapter path equals the merged GGUF's, and the
memory picture holds (base + 3 adapters well under 3 merged models)."""

from __future__ import annotations

import json

import pytest

pytestmark = pytest.mark.slow


def test_the_lora_benchmark_runs_on_the_tiny_fixtures(capsys):
    from benchmarks.__main__ import main

    assert main(["lora", "--tokens", "32", "--batch", "2", "--repeats", "1", "--threads", "2", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["merged_rel_diff"] < 1e-3  # run-time LoRA = clef-finetune's merge, through llama.cpp both ways
    assert out["switches"] == [16, 2]  # alternating batches switch every time; grouped ones twice
    memory = out["memory"]
    assert memory["base_plus_3_adapters_bytes"] < 0.4 * memory["three_merged_bytes"]
    flash = memory["clef_flash_q8_0_gib"]
    assert flash["base_plus_3_r64"] < 16 < flash["three_merged"]
