"""What a second of video costs Clef-omni: decoding (the reference's load_video), the frames at the tower's size,
the tokens it adds to the prompt, and the vision tower's arithmetic at Qwen3-Omni's shape (a random real-shaped
projector would need a real-shaped backbone beside it in mtmd: the FLOPs are counted, not timed)."""

from __future__ import annotations

import tempfile
import time
from pathlib import Path
from typing import Any

# Qwen3-Omni-30B-A3B's vision tower (thinker_config.vision_config): 27 blocks of width 1152, MLP 4304, patch 16
VISION_BLOCKS, VISION_WIDTH, VISION_FF, PATCH = 27, 1152, 4304, 16
ACTIVE_PARAMS = 3.3e9  # the thinker's text model per token (MoE: about 3 B active)


def tower_gflop(patches: int) -> float:
    """The vision tower's multiply-adds x 2 for one frame pair: per block the attention and MLP projections on every
    patch plus full attention over the pair's patches."""
    per_patch = 2 * VISION_BLOCKS * (4 * VISION_WIDTH ** 2 + 2 * VISION_WIDTH * VISION_FF)
    attention = 2 * 2 * VISION_BLOCKS * patches ** 2 * VISION_WIDTH
    return (per_patch * patches + attention) / 1e9


def video_costs(seconds: float = 10.0) -> list[dict[str, Any]]:
    """Synthetic H.264 + AAC clips (noisy frames: a worst case for the decoder) of common sizes, decoded as the
    reference does, planned as the prompt holds them."""
    from clef_bridge.bridge.media.video import decode
    from clef_bridge.bridge.model.video_prompt import video_prompt

    from tests.fixturegen_video import Clip, write_clip

    out = []
    with tempfile.TemporaryDirectory() as folder:
        for name, (w, h, fps) in {"480p 30 fps": (854, 480, 30), "720p 30 fps": (1280, 720, 30),
                                  "1080p 30 fps": (1920, 1080, 30)}.items():
            path = Path(folder) / f"{h}.mp4"
            write_clip(Clip("mp4", ".mp4", "libx264", "aac", w, h, fps, seconds, seed=h), path)
            data = path.read_bytes()
            t0 = time.perf_counter()
            clip = decode(data, ("bench",))
            t1 = time.perf_counter()
            plan = video_prompt([clip], [], 32, 2)
            t2 = time.perf_counter()
            t, gh, gw = plan.grids[0]
            tokens = len(plan.layouts[0])
            out.append({"clip": name, "seconds": seconds, "bytes": len(data),
                        "decode_ms_per_s": round((t1 - t0) * 1e3 / seconds, 1),
                        "resize_ms_per_s": round((t2 - t1) * 1e3 / seconds, 1),
                        "frame": f"{plan.frames[0].shape[2]}x{plan.frames[0].shape[1]}",
                        "tokens_per_s": round(tokens / seconds, 1),
                        "tower_gflop_per_s": round(tower_gflop(gh * gw) * t / seconds),
                        "prefill_gflop_per_s": round(2 * ACTIVE_PARAMS * tokens / seconds / 1e9)})
    return out


def real_vision_pair(threads: int, repeats: int = 2) -> dict[str, Any]:
    """One frame pair of a 16:9 clip (672 x 384 at the tower: 1,008 patches, 252 tokens) through mtmd with a vision
    tower of Qwen3-Omni's shape (random weights, ~2.2 GB of float32) beside a one-layer backbone of its width."""
    import numpy as np
    from clef_bridge.bridge.demo.mmproj import VisionDims, write_projector
    from clef_bridge.bridge.demo.moe import MoeDims, write_qwen3vlmoe_gguf
    from clef_bridge.bridge.llama.backbone import BackboneOptions
    from clef_bridge.bridge.llama.omni import OmniBackbone
    from clef_bridge.bridge.llama.vision import Projector

    with tempfile.TemporaryDirectory() as folder:
        gguf = write_qwen3vlmoe_gguf(Path(folder) / "b.gguf", MoeDims(hidden=2048, layers=1, heads=16, kv_heads=4,
                                     head_dim=128, experts=2, experts_used=1, expert_ff=64, deepstack=3), 0)
        vision = VisionDims(width=VISION_WIDTH, ff=VISION_FF, blocks=VISION_BLOCKS, heads=16, patch=PATCH, merge=2,
                            image_size=768, deepstack=tuple(i in (8, 16, 24) for i in range(VISION_BLOCKS)))
        mmproj = write_projector(Path(folder) / "p.gguf", 2048, 0, vision)
        frames = np.random.default_rng(0).integers(0, 255, (2, 384, 672, 3), dtype=np.uint8)
        with OmniBackbone(gguf, BackboneOptions(n_ctx=4096, n_threads=threads), deepstack=3) as backbone:
            with Projector(mmproj, backbone) as projector:
                best = min(_timed(lambda: projector.encode_frames(frames)) for _ in range(repeats))
    return {"frames": "672x384 pair", "patches": 1008, "tokens": 252, "seconds": round(best, 2),
            "seconds_per_video_second": round(best, 2), "gflop": round(tower_gflop(1008))}


def _timed(fn) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0
