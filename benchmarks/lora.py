"""python -m benchmarks lora: fine-tunes served as run-time LoRA adapters over one backbone, against merged GGUFs.

Three measurements, in this process, on the same token batches:
- adapter vs merged: one batched prefill through the base with the adapter (llama.cpp's two extra matmuls per
  adapted linear) and through the fine-tune merged into a GGUF of its own (clef-finetune's `merge`, converted);
  the base alone for scale; and how far the two fine-tuned paths' hidden states lie apart;
- switching under mixed traffic: batches of two adapters taking turns on the shared context (every batch
  switches, and llama.cpp reserves its graph anew) against the same batches grouped by adapter (one switch);
- memory: the base plus three adapters against three merged GGUFs, from the files, and for Clef-flash from
  the plan's real shapes (bridge/config/presets.py).
Default files: the tiny fixtures (tests/fixturegen_lora.py), whose widths make llama.cpp's per-call overhead
dominate: the ratios there say little about a 9B model; the memory figures for Clef-flash do.
"""

from __future__ import annotations

import statistics
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np
from clef_bridge.bridge.config.memory_plan import GIB, lora_bytes
from clef_bridge.bridge.config.presets import arch_preset
from clef_bridge.bridge.gguf.lora import converted_lora, lora_file_bytes
from clef_bridge.bridge.gguf.reader import read_gguf
from clef_bridge.bridge.llama.adapters import BackbonePool
from clef_bridge.bridge.llama.backbone import Backbone, BackboneOptions
from clef_bridge.tools.bench import median_ms


@dataclass(frozen=True)
class LoraBench:
    gguf: str
    tokens: int  # per sequence
    batch: int  # sequences per prefill
    base_ms: float  # median prefill of the batch: the base alone
    adapter_ms: float  # the base with one adapter
    merged_ms: float  # the merged GGUF
    merged_rel_diff: float  # max |adapter - merged| / max |merged| over the batch's hidden states
    alternating_ms: float  # per batch, two adapters taking turns batch by batch
    grouped_ms: float  # per batch, the same batches grouped by adapter
    switches: tuple[int, int]  # adapter-set changes in one alternating run and one grouped run
    memory: dict[str, Any]

    @property
    def switch_ms(self) -> float:
        """What one adapter switch costs: the alternating run's extra time over the grouped one, per extra switch."""
        extra = self.switches[0] - self.switches[1]
        return round((self.alternating_ms - self.grouped_ms) * 2 * SWITCH_ROUNDS / max(1, extra), 2)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self) | {"switch_ms": self.switch_ms}


SWITCH_ROUNDS = 8  # batches per adapter in the switching runs


def tensor_bytes(path: Path) -> int:
    return sum(t.n_bytes or 0 for t in read_gguf(path).tensors.values())


def memory_picture(base: Path, adapter: Path, merged: Path) -> dict[str, Any]:
    """Base + 3 adapters against 3 merged models: these files', and Clef-flash Q8_0's at rank 64 and 256."""
    arch = arch_preset("clef-flash", "Q8_0")
    flash = sum(t.nbytes for t in arch.tensors)
    gib = lambda n: round(n / GIB, 3)  # noqa: E731
    return {"base_bytes": tensor_bytes(base), "adapter_bytes": lora_file_bytes(adapter),
            "merged_bytes": tensor_bytes(merged),
            "base_plus_3_adapters_bytes": tensor_bytes(base) + 3 * lora_file_bytes(adapter),
            "three_merged_bytes": 3 * tensor_bytes(merged),
            "clef_flash_q8_0_gib": {"base": gib(flash),
                                    **{f"adapter_r{r}": gib(lora_bytes(arch, r)) for r in (64, 256)},
                                    **{f"base_plus_3_r{r}": gib(flash + 3 * lora_bytes(arch, r)) for r in (64, 256)},
                                    "three_merged": gib(3 * flash)}}


def _timed_batches(views: list, order: list[int], batch: list[np.ndarray], repeats: int) -> tuple[float, int]:
    """Median milliseconds per batch of running the batch through views[i] for i in order, and the adapter switches
    of one run."""
    runs, switches = [], 0
    for _ in range(repeats):
        views[order[-1]].prefill_many(batch)  # every run starts where the order ends
        before = views[0].shared.switches
        t0 = time.perf_counter()
        for i in order:
            views[i].prefill_many(batch)
        runs.append((time.perf_counter() - t0) * 1000 / len(order))
        switches = views[0].shared.switches - before
    return statistics.median(runs), switches


def run(gguf: Path | None = None, adapters: tuple[Path, Path] | None = None, merged: Path | None = None,
        tokens: int = 128, batch: int = 4, repeats: int = 3, threads: int = 0) -> LoraBench:
    """gguf, adapters (two), merged (the first adapter merged): the tiny fixtures when not given."""
    if gguf is None:
        from tests import fixturegen_lora

        lf = fixturegen_lora.build()
        gguf, adapters, merged = lf.base.gguf_f32, (lf.adapter("claims"), lf.adapter("routing")), lf.merged("claims")
    loras = [converted_lora(a, gguf) for a in adapters]
    options = BackboneOptions(n_ctx=max(1024, tokens * batch), n_seq_max=batch, n_threads=threads)
    rng = np.random.default_rng(0)
    seqs = [rng.integers(1000, 100000, size=tokens).astype(np.int32) for _ in range(batch)]
    pool = BackbonePool()
    key = (gguf, options)
    views = [pool.view(key, lambda: Backbone(gguf, options), name, lora)
             for name, lora in (("base", None), ("a", loras[0]), ("b", loras[1]))]
    try:
        base_ms = median_ms(lambda: views[0].prefill_many(seqs), repeats)
        adapter_ms = median_ms(lambda: views[1].prefill_many(seqs), repeats)
        tuned = np.concatenate(views[1].prefill_many(seqs))
        with Backbone(merged, options) as whole:
            merged_ms = median_ms(lambda: whole.prefill_many(seqs), repeats)
            reference = np.concatenate(whole.prefill_many(seqs))
        grouped, grouped_switches = _timed_batches(views[1:], [0] * SWITCH_ROUNDS + [1] * SWITCH_ROUNDS, seqs,
                                                   repeats)
        alternating, switches = _timed_batches(views[1:], [0, 1] * SWITCH_ROUNDS, seqs, repeats)
    finally:
        for view in views:
            view.close()
    diff = float(np.abs(tuned - reference).max() / np.abs(reference).max())
    return LoraBench(str(gguf), tokens, batch, round(base_ms, 2), round(adapter_ms, 2), round(merged_ms, 2),
                     diff, round(alternating, 2), round(grouped, 2), (switches, grouped_switches),
                     memory_picture(gguf, loras[0], merged))

