"""The vision fixtures, built deterministically into .fixtures/ beside fixturegen's and reused when present.

- a tiny random Qwen3.5 WITH its vision tower (transformers' Qwen3_5ForConditionalGeneration, the
  shared recipe's vision config), whose rotary pairs cover all three M-RoPE axes (head_dim 32, a
  quarter rotary: 4 pairs, sections [2, 1, 1]), so an image token's row and column both reach the
  backbone and a position bug shows up in the hidden states;
- Qwen3.5's published image preprocessor config beside it (the converter reads the mean/std from it);
- llama.cpp's converter: the backbone GGUF (F32) and, with --mmproj, the projector GGUF (F32 and F16).

The joint head is fixturegen's tiny head (hidden 64). Run `python -m tests.fixturegen_vision` by hand;
the vision tests build it on first use (21 s of CPU on 2 cores, 40 s wall on a busy machine, after
fixturegen's own build).
"""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass
from pathlib import Path

from . import fixturegen
from .fixturegen import FIXTURES, SEED, _lock, _log, build_tiny_model, convert, sdist

# Qwen3.5's preprocessor_config.json (Qwen/Qwen3.5-*): 256x256 to 4096x4096 pixels, 16-pixel patches
# merged 2x2 into one token (so 64 to 16,384 tokens per image), mean/std 0.5, bicubic resizing.
QWEN35_IMAGE_PROCESSOR = {
    "size": {"shortest_edge": 65536, "longest_edge": 16777216},
    "patch_size": 16, "temporal_patch_size": 2, "merge_size": 2,
    "image_mean": [0.5, 0.5, 0.5], "image_std": [0.5, 0.5, 0.5],
}
TEXT = {"head_dim": 32}
MROPE = (2, 1, 1)


@dataclass(frozen=True)
class VisionFixtures:
    base: fixturegen.Fixtures
    hf_model: Path  # tiny random Qwen3.5 with its vision tower, transformers format + preprocessor_config.json
    gguf_f32: Path  # its backbone
    mmproj_f32: Path  # its vision projector
    mmproj_f16: Path
    head: Path  # fixturegen's tiny head


def image_processor(**overrides):
    """The reference's image processor, with Qwen3.5's settings (Pillow only, no torchvision)."""
    from transformers import Qwen2VLImageProcessorPil

    return Qwen2VLImageProcessorPil(**(QWEN35_IMAGE_PROCESSOR | overrides))


def reference_processor(tokenizer, **overrides):
    """Qwen3.5's processor class for images only: its video processor needs torchvision, which the
    transformers check of the (absent) video processor's class imports; the image path is untouched."""
    from transformers import Qwen3VLProcessor

    class ImageOnlyProcessor(Qwen3VLProcessor):
        def check_argument_for_proper_class(self, argument_name, argument):
            return None if argument is None else super().check_argument_for_proper_class(argument_name, argument)

    return ImageOnlyProcessor(image_processor=image_processor(**overrides), tokenizer=tokenizer, video_processor=None)


def picture(width: int, height: int, mode: str = "RGB", seed: int = 0):
    """A deterministic test picture (gradients, shapes and noise, so resizing and content matter)."""
    import numpy as np
    from PIL import Image

    rng = np.random.default_rng(seed)
    y, x = np.mgrid[0:height, 0:width].astype(np.float32)
    rgb = np.stack([255 * x / max(width - 1, 1), 255 * y / max(height - 1, 1),
                    127.5 + 127.5 * np.sin((x + 2 * y) / (7 + seed))], axis=-1)
    rgb += rng.normal(0, 20, rgb.shape)
    box = (slice(height // 4, height // 2), slice(width // 3, 2 * width // 3))
    rgb[box] = rng.integers(0, 256, 3)
    img = Image.fromarray(np.clip(rgb, 0, 255).astype(np.uint8), "RGB")
    if mode in ("RGBA", "LA"):
        alpha = np.clip(255 * (x / max(width - 1, 1)) + rng.normal(0, 30, x.shape), 0, 255).astype(np.uint8)
        base = img if mode == "RGBA" else img.convert("L")
        base.putalpha(Image.fromarray(alpha, "L"))
        return base
    if mode == "P":
        img = img.quantize(16, dither=Image.Dither.NONE)
        img.info["transparency"] = 3
        return img
    return img.convert(mode)


def encoded(img, fmt: str, **save) -> bytes:
    import io

    out = io.BytesIO()
    img.save(out, fmt, **save)
    return out.getvalue()


def data_url(data: bytes, mime: str = "image/png") -> str:
    import base64

    return f"data:{mime};base64,{base64.b64encode(data).decode()}"


def build(root: Path = FIXTURES) -> VisionFixtures:
    base = fixturegen.build(root)
    with _lock(root):
        fx = VisionFixtures(base=base, hf_model=root / "tiny-vl-hf", gguf_f32=root / "tiny-vl-f32.gguf",
                            mmproj_f32=root / "tiny-vl-mmproj-f32.gguf", mmproj_f16=root / "tiny-vl-mmproj-f16.gguf",
                            head=base.head)
        if not (fx.hf_model / "preprocessor_config.json").exists():
            _log("building the tiny random Qwen3.5 with its vision tower")
            build_tiny_model(base.tokenizer_dir, fx.hf_model, vocab_size=151936, text=TEXT, mrope=MROPE,
                             seed=SEED + 2)
            image_processor().save_pretrained(fx.hf_model)  # last: its file marks a finished build
        vendor = sdist(root)
        for path, outtype, extra in ((fx.gguf_f32, "f32", ()), (fx.mmproj_f32, "f32", ("--mmproj",)),
                                     (fx.mmproj_f16, "f16", ("--mmproj",))):
            if not path.exists():
                _log(f"converting to {path.name}")
                convert(vendor, fx.hf_model, path.with_suffix(".tmp"), outtype, extra)
                path.with_suffix(".tmp").rename(path)
        return fx


if __name__ == "__main__":
    built = build()
    print(built)
    print(json.dumps(json.loads((built.hf_model / "config.json").read_text())["vision_config"]), file=sys.stderr)
