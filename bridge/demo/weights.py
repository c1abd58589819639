"""What the built-in demos' random models share: the byte-level vocabulary, random float tensors and
quantized blocks, and a random joint head (numpy only; bridge/demo/builtins.py writes the files)."""

from __future__ import annotations

import numpy as np
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType

from ...head.config import HeadConfig
from ...head.weights import expected_shapes

SPECIALS = [("<|endoftext|>", 3), ("<|im_start|>", 3), ("<|im_end|>", 3), ("<think>", 4), ("</think>", 4)]
# the media placeholders of Qwen3.5's and Qwen3-Omni's prompts (head/encoder.py), control tokens as in theirs
MEDIA_SPECIALS = [("<|vision_start|>", 3), ("<|vision_end|>", 3), ("<|image_pad|>", 3), ("<|audio_start|>", 3),
                  ("<|audio_end|>", 3), ("<|audio_pad|>", 3), ("<|video_pad|>", 3)]
MERGES = ["Ġ t", "Ġ a", "h e", "i n", "t h", "e r", "Ġ s", "o n", "r e", "Ġ o", "a n", "e s"]

Vocab = tuple[list[str], list[int], list[str]]  # tokens, token types, merges


def byte_level_vocab() -> Vocab:
    """GPT-2 style byte-level tokens, a few merges, the special tokens the prompt uses and the media
    placeholders."""
    printable = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + \
        list(range(ord("®"), ord("ÿ") + 1))
    chars, extra = {}, 0
    for b in range(256):
        if b in printable:
            chars[b] = chr(b)
        else:
            chars[b] = chr(256 + extra)
            extra += 1
    tokens = [chars[b] for b in range(256)] + [m.replace(" ", "") for m in MERGES]
    types = [1] * len(tokens)
    for text, kind in SPECIALS + MEDIA_SPECIALS:
        tokens.append(text)
        types.append(kind)
    return tokens, types, list(MERGES)


def random_tensor(kind: str, shape: tuple[int, ...], scale: float, rng: np.random.Generator) -> np.ndarray:
    """float32 values of a plausible scale for one tensor_specs entry."""
    if kind == "w":
        return (scale * rng.standard_normal(shape)).astype(np.float32)
    if kind == "norm":
        return (1.0 + 0.1 * rng.standard_normal(shape)).astype(np.float32)
    if kind == "ssm_a":
        return -np.exp(rng.uniform(-1, 1, shape)).astype(np.float32)
    return (0.1 * rng.standard_normal(shape)).astype(np.float32)


# Random quantized blocks: (bytes per block, offset of the f16 scale d, offset of a second f16 (dmin) or
# None, the weight std per unit of d). Q4_K's w = d*sc*q - dmin*m (dmin = 7.5 d centres it), Q6_K's
# w = d*sc*(q - 32), Q8_0's w = d*q; random bytes give the quants and sub-block scales.
BLOCKS = {GGMLQuantizationType.Q8_0: (34, 0, None, 73.0), GGMLQuantizationType.Q4_K: (144, 0, 2, 243.0),
          GGMLQuantizationType.Q6_K: (210, 208, None, 1350.0)}
POOL_BYTES = 64 << 20  # random bytes made once; each tensor copies a stretch of them from a random offset


def more_bits(i: int, n: int) -> bool:
    return i < n // 8 or i >= 7 * n // 8 or (i - n // 8) % 3 == 2  # llama.cpp's use_more_bits


def random_blocks(qtype: GGMLQuantizationType, rows: int, cols: int, pool: np.ndarray,
                  rng: np.random.Generator) -> np.ndarray:
    """A [rows, cols] matrix of random qtype blocks (weights of std ~1/sqrt(cols)): uint8 [rows, row bytes]."""
    size, at, second, spread = BLOCKS[qtype]
    per_row = cols // GGML_QUANT_SIZES[qtype][0]
    start = int(rng.integers(0, len(pool)))
    raw = np.resize(pool[start:], rows * per_row * size).reshape(rows * per_row, size)  # a copy, repeated as needed
    raw[:, at:at + 2] = np.float16(1 / (np.sqrt(cols) * spread)).reshape(1).view(np.uint8)
    if second is not None:
        raw[:, second:second + 2] = np.float16(7.5 / (np.sqrt(cols) * spread)).reshape(1).view(np.uint8)
    return raw.reshape(rows, per_row * size)


DEMO_SCALARS = {"prior_logit_scale": 1.0, "joint_logit_scale": 2.0, "residual_gate": 0.5}


def random_head(cfg: HeadConfig, seed: int, scalars: dict[str, float] = DEMO_SCALARS) -> dict[str, np.ndarray]:
    """Float32 weights of a plausible scale for every tensor the config implies.

    The released scalars are trained; zeros would make the joint path vanish, so they get weight.
    """
    rng = np.random.default_rng(seed)
    out = {}
    for name, shape in sorted(expected_shapes(cfg).items()):
        if name in scalars:
            out[name] = np.float32(scalars[name]).reshape(())
        elif len(shape) == 2:
            out[name] = (rng.standard_normal(shape) / np.sqrt(shape[1])).astype(np.float32)
        elif name.endswith("weight"):  # norm gains around one
            out[name] = (1.0 + 0.1 * rng.standard_normal(shape)).astype(np.float32)
        else:
            out[name] = (0.02 * rng.standard_normal(shape)).astype(np.float32)
    return out
