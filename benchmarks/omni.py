"""What serving Clef-omni's way costs, measured: `python -m benchmarks omni [--json]`.

- lm_head: qwen3vlmoe gives per-token hidden states only with every token an output, and then llama.cpp runs
  lm_head on every token; the cb_eval stop after `result_norm` skips it. Timed on the tiny Clef-omni (vocabulary
  151,936, the real one's; hidden 64): body only (the last token an output), every token an output with the stop,
  and with lm_head running; llama.cpp's own output and compute buffer sizes per chunk size.
- the projector split: the vision half of a combined projector written into the cache (time and bytes), on the
  tiny projector and on one padded with a large vision tensor (the copy's throughput).
- the numpy audio tower: seconds of CPU per second of audio, on the tiny tower and on one of Qwen3-Omni's shape
  (32 layers of width 1280, 480-channel convolutions, random weights: ~2.5 GB of float32).
- latency of a Clef-omni-shaped request (qwen3vlmoe, MoE) against a Clef-flash-shaped one (qwen35, hybrid) on the
  tiny models, the same request, prefix cache off: text, and Clef-omni with an image and with audio.
- video (benchmarks/omni_video.py): decoding and resizing per second of clip, tokens per second, the vision
  tower's and the backbone's GFLOP per second of video at Qwen3-Omni's shape.
"""

from __future__ import annotations

import math
import re
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from clef_bridge.bridge.llama.native import lc


@dataclass
class OmniBench:
    threads: int
    lm_head: list[dict[str, Any]] = field(default_factory=list)
    split: list[dict[str, Any]] = field(default_factory=list)
    audio: list[dict[str, Any]] = field(default_factory=list)
    latency: list[dict[str, Any]] = field(default_factory=list)
    video: list[dict[str, Any]] = field(default_factory=list)
    vision: dict[str, Any] = field(default_factory=dict)  # a frame pair through a tower of Qwen3-Omni's shape
    notes: list[str] = field(default_factory=list)


def _best_ms(fn, repeats: int) -> float:
    """The fastest of the runs: on a shared machine the others measure the neighbours."""
    from clef_bridge.tools.bench import timed_ms

    return min(timed_ms(fn, repeats))


BUFFER = re.compile(r"(\w+)\s+(output|compute) buffer size =\s+([\d.]+) MiB")


def lm_head(gguf: Path, tokens: int, chunks: tuple[int, ...], repeats: int, threads: int) -> list[dict[str, Any]]:
    from clef_bridge.bridge.llama import log as llama_log
    from clef_bridge.bridge.llama.backbone import BackboneOptions
    from clef_bridge.bridge.llama.omni import OmniBackbone

    ids = np.random.default_rng(0).integers(0, 150000, tokens).astype(np.int32)
    out = []
    for chunk in chunks:
        row: dict[str, Any] = {"chunk": chunk, "tokens": tokens}
        for skip in (True, False):
            options = BackboneOptions(n_ctx=tokens, n_ubatch=chunk, n_seq_max=1, n_threads=threads)
            with llama_log.capture() as lines, OmniBackbone(gguf, options, deepstack=2, skip_lm_head=skip) as bb:
                key = "skip" if skip else "run"
                row[f"{key}_ms_per_1k"] = round(_best_ms(lambda: bb.prefill(ids), repeats) * 1000 / tokens, 1)
                if skip:
                    row["body_ms_per_1k"] = round(_best_ms(lambda: _body_only(bb, ids), repeats) * 1000 / tokens, 1)
                    # llama.cpp logs the output buffer at its first size (one output) and grows it to n_outputs x
                    # n_vocab floats on the first decode, unlogged: that size is computed here
                    row["host_logits_mib"] = round(chunk * bb.n_vocab * 4 / 2**20, 2)
                    for device, kind, mib in BUFFER.findall("".join(lines)):
                        if kind == "compute":
                            row["compute_buffer_mib"] = row.get("compute_buffer_mib", 0) + float(mib)
        out.append(row)
    return out


def _body_only(bb, ids: np.ndarray) -> None:
    """The same decodes with only each chunk's last token an output: the backbone's cost without per-token rows."""
    bb.drop_all()
    for s in range(0, len(ids), bb.chunk):
        bb._batch.fill_chunks([(0, s, ids[s:s + bb.chunk])])
        if lc.llama_decode(bb._ctx, bb._batch.struct) != 0:
            raise RuntimeError("llama_decode failed")
    lc.llama_synchronize(bb._ctx)
    bb.drop_all()


def projector_split(mmproj: Path, pad_mb: int) -> list[dict[str, Any]]:
    from clef_bridge.bridge.gguf.projector import ensure_vision_projector
    from clef_bridge.bridge.gguf.reader import read_gguf, read_raw
    from clef_bridge.bridge.gguf.writer import OutTensor, write_gguf
    from gguf import GGMLQuantizationType as Q

    out = []
    with tempfile.TemporaryDirectory() as tmp:
        big = Path(tmp) / "padded-mmproj.gguf"
        info = read_gguf(mmproj)
        tensors = [OutTensor(t.name, t.shape, int(t.type), t.n_bytes,
                             np.fromfile(mmproj, np.uint8, t.n_bytes, offset=info.data_start + t.offset).tobytes())
                   for t in info.tensors.values()]
        n = pad_mb * 2**20 // 2
        tensors.append(OutTensor("v.bench_padding.weight", (n,), int(Q.F16), 2 * n, bytes(2 * n)))
        write_gguf(big, [(k, read_raw(info, k)) for k in info.fields], tensors, info.alignment, progress=False)
        for src in (mmproj, big):
            path, done = ensure_vision_projector(src, Path(tmp) / "cache")
            out.append({"source": src.name, "source_bytes": src.stat().st_size, "written_bytes": done.bytes,
                        "seconds": round(done.seconds, 3), "mb_per_s": round(done.bytes / 1e6 / done.seconds, 1),
                        "reuse_seconds": round(ensure_vision_projector(src, Path(tmp) / "cache")[1].seconds, 4)})
    return out


# Qwen3-Omni-30B-A3B's audio encoder (config.json thinker_config.audio_config)
REAL_AUDIO = dict(layers=32, d=1280, heads=20, ffn=5120, conv=480, mel=128, out=2048, positions=1500)


def real_shaped_tower():
    """Qwen3-Omni's audio tower shape with random float32 weights (what matters for speed)."""
    from clef_bridge.bridge.media.audio_tower import AudioTower, mel_filters

    c = REAL_AUDIO
    rng = np.random.default_rng(0)

    def w(*shape):
        return (rng.standard_normal(shape, dtype=np.float32) / math.sqrt(shape[-1])).astype(np.float32)

    freq = (((c["mel"] + 1) // 2 + 1) // 2 + 1) // 2  # mel bins after three stride-2 convolutions
    p = {"a.conv2d.1.weight": w(c["conv"], 1, 3, 3), "a.conv2d.2.weight": w(c["conv"], c["conv"], 3, 3),
         "a.conv2d.3.weight": w(c["conv"], c["conv"], 3, 3), "a.conv_out.weight": w(c["d"], c["conv"] * freq),
         "a.position_embd.weight": w(c["positions"], c["d"]), "a.post_ln.weight": np.ones(c["d"], np.float32),
         "a.post_ln.bias": np.zeros(c["d"], np.float32), "mm.a.mlp.1.weight": w(c["d"], c["d"]),
         "mm.a.mlp.1.bias": np.zeros(c["d"], np.float32), "mm.a.mlp.2.weight": w(c["out"], c["d"]),
         "mm.a.mlp.2.bias": np.zeros(c["out"], np.float32)}
    for k in (1, 2, 3):
        p[f"a.conv2d.{k}.bias"] = np.zeros(c["conv"], np.float32)
    for i in range(c["layers"]):
        q = f"a.blk.{i}."
        for name, shape in (("attn_q", (c["d"], c["d"])), ("attn_k", (c["d"], c["d"])), ("attn_v", (c["d"], c["d"])),
                            ("attn_out", (c["d"], c["d"])), ("ffn_up", (c["ffn"], c["d"])),
                            ("ffn_down", (c["d"], c["ffn"]))):
            p[q + name + ".weight"], p[q + name + ".bias"] = w(*shape), np.zeros(shape[0], np.float32)
        for ln in ("ln1", "ln2"):
            p[q + ln + ".weight"], p[q + ln + ".bias"] = np.ones(c["d"], np.float32), np.zeros(c["d"], np.float32)
    return AudioTower(p, c["heads"], 1e-5, mel_filters(c["mel"]))


def audio_tower(mmproj: Path, seconds: tuple[float, ...], real: bool, repeats: int) -> list[dict[str, Any]]:
    from clef_bridge.bridge.media.audio_tower import AudioTower, audio_tokens

    from tests.omni_cases import tone

    towers = [("tiny (2 layers, width 32)", AudioTower.from_gguf(mmproj))]
    if real:
        towers.append(("Qwen3-Omni's shape (32 layers, width 1280)", real_shaped_tower()))
    out = []
    for name, tower in towers:
        for s in seconds:
            clip = tone(s, 1)
            ms = _best_ms(lambda: tower.encode([clip]), repeats if "tiny" in name else 1)  # noqa: B023 - called here
            out.append({"tower": name, "seconds_of_audio": s, "tokens": audio_tokens([len(clip)])[0],
                        "ms": round(ms, 1), "cpu_s_per_audio_s": round(ms / 1e3 / s, 3)})
    return out


def latency(repeats: int, threads: int) -> list[dict[str, Any]]:
    from clef_bridge.bridge.config.registry import model_spec
    from clef_bridge.bridge.media.images import decode, sniff
    from clef_bridge.bridge.media.request import AUDIO, IMAGE, Media
    from clef_bridge.bridge.model.loading import load_checked
    from clef_bridge.head.schema import parse_request

    from tests import fixturegen, fixturegen_omni
    from tests.deciding import score_batch
    from tests.fixturegen_vision import encoded, picture
    from tests.omni_cases import cases, tone

    fx, ofx = fixturegen.build(), fixturegen_omni.build()
    body = cases()["text"].body
    keys = dict(prefix_cache_mb=0, n_ctx=8192, max_length=8192, n_threads=threads)
    flash = load_checked(model_spec("flash-shaped", fx.gguf_f32, fx.head, **keys)).model
    with tempfile.TemporaryDirectory() as tmp, _cache_in(tmp):
        omni = load_checked(model_spec("omni-shaped", ofx.gguf_f32, ofx.head, mmproj=ofx.mmproj_f32, **keys)).model
    loc = ("body", "images", 0)
    png = encoded(picture(300, 200, seed=1), "PNG")
    pixels = [decode(png, sniff(png, loc), loc, omni.geometry)]
    shapes = [("Clef-flash-shaped (qwen35, 4 hybrid layers)", flash, (), ()),
              ("Clef-omni-shaped (qwen3vlmoe, 3 MoE layers)", omni, (), ()),
              ("Clef-omni-shaped + 1 image (300x200)", omni, pixels, ()),
              ("Clef-omni-shaped + 1.7 s of audio", omni, (), (tone(1.7, 3),))]
    out = []
    try:
        for name, model, images, audio in shapes:
            runs = []
            for _ in range(repeats + 1):  # the first is a warm-up
                t0 = time.perf_counter()
                media = Media({IMAGE: tuple(images), AUDIO: tuple(audio)})
                decision = score_batch(model, [model.prepare(parse_request(body, model.limits), media)])[0]
                runs.append((time.perf_counter() - t0, decision))
            seconds, best = min(runs[1:], key=lambda r: r[0])
            t = best.timings  # the best run's stages
            out.append({"request": name, "input_tokens": best.input_tokens, "best_ms": round(seconds * 1e3, 1),
                        "median_ms": round(float(np.median([r[0] for r in runs[1:]])) * 1e3, 1),
                        "backbone_ms": round(t.backbone * 1e3, 1), "head_ms": round(t.head * 1e3, 1),
                        "vision_ms": round(t.vision * 1e3, 1), "audio_ms": round(t.audio * 1e3, 1)})
    finally:
        flash.close()
        omni.close()
    return out


class _cache_in:
    """CLEF_BRIDGE_CACHE pointed at a folder while a model loads (its projector's vision half goes there)."""

    def __init__(self, folder: str):
        self.folder, self.saved = folder, None

    def __enter__(self):
        import os

        self.saved = os.environ.get("CLEF_BRIDGE_CACHE")
        os.environ["CLEF_BRIDGE_CACHE"] = self.folder

    def __exit__(self, *exc):
        import os

        if self.saved is None:
            os.environ.pop("CLEF_BRIDGE_CACHE", None)
        else:
            os.environ["CLEF_BRIDGE_CACHE"] = self.saved


def run(tokens: int = 4096, repeats: int = 3, real_tower: bool = True, pad_mb: int = 512, threads: int = 1
        ) -> OmniBench:
    """threads: llama.cpp's threads. 1 by default: on a shared machine llama.cpp's spinning thread barriers make
    multi-threaded timings swing by 10x (measured: the same 379-token prefill 60 ms to 1.8 s with 2 threads)."""
    from tests import fixturegen_omni

    ofx = fixturegen_omni.build()
    result = OmniBench(threads=threads)
    result.lm_head = lm_head(ofx.gguf_f32, tokens, (512, 128), repeats, threads)
    result.split = projector_split(ofx.mmproj_f32, pad_mb)
    result.audio = audio_tower(ofx.mmproj_f32, (1.0, 5.0, 30.0), real_tower, repeats)
    result.latency = latency(repeats + 2, threads)
    from .omni_video import real_vision_pair, video_costs

    result.video = video_costs()
    result.vision = real_vision_pair(max(threads, 2)) if real_tower else {}
    vocab, hidden = 151936, 2048
    result.notes.append(f"lm_head at Clef-omni's shape: 2 x {hidden} x {vocab} = {2 * hidden * vocab / 1e9:.2f} GFLOP "
                        f"per token, {2 * hidden * vocab * 1000 / 1e12:.2f} TFLOP per 1k tokens, skipped by the stop")
    return result
