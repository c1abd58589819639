"""Random projector GGUFs (mmproj) for the built-in demos, from numpy and gguf: the keys, tensor names, shapes
and types llama.cpp's converter writes (convert_hf_to_gguf.py --mmproj), so mtmd and the bridge read them as
they read a real model's.

- Qwen3.5's (the demo): `clip.projector_type qwen3vl_merger`, no deepstack layers.
- Qwen3-Omni's (the Clef-omni demo): ONE file with the vision encoder (`clip.vision.projector_type
  qwen3vl_merger` with deepstack layers) and the audio encoder (`clip.audio.projector_type qwen3a`), no
  `clip.projector_type`; the audio tower's convolutions in F16, as the converter stores them even with
  --outtype f32.

Shapes below are numpy's (the reverse of the ggml shapes gguf-py's reader prints).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
from gguf import GGUFWriter
from gguf.utility import size_label

from ..gguf.writer import quiet_gguf_py

QWEN3VL_MERGER, QWEN3_AUDIO = "qwen3vl_merger", "qwen3a"
IMAGE_MEAN = IMAGE_STD = (0.5, 0.5, 0.5)  # Qwen3.5's and Qwen3-Omni's preprocessor


@dataclass(frozen=True)
class VisionDims:
    """Qwen3-VL's vision tower and merger, as Qwen3.5 and Qwen3-Omni use it."""

    width: int = 32
    ff: int = 64
    blocks: int = 1
    heads: int = 2
    patch: int = 16
    merge: int = 2
    image_size: int = 128  # (image_size / patch)^2 learned positions; llama.cpp resizes them to each image's grid
    deepstack: tuple[bool, ...] = ()  # per block: its merged features also feed the backbone (Qwen3-Omni); () none

    @property
    def levels(self) -> int:
        return sum(self.deepstack)


@dataclass(frozen=True)
class AudioDims:
    """Qwen3-Omni's audio encoder (Whisper-like: three stride-2 convolutions, pre-LN layers, a 2-layer projection)."""

    width: int = 32  # d_model
    ff: int = 64
    blocks: int = 2
    heads: int = 2
    mel_bins: int = 128
    conv: int = 16  # downsample_hidden_size: channels of the convolutions
    positions: int = 1500  # max_source_positions: sinusoids, stored as a tensor

    @property
    def conv_out(self) -> int:
        """Width of conv_out's input: the channels times the mel bins left after three stride-2 convolutions."""
        bins = self.mel_bins
        for _ in range(3):
            bins = (bins + 1) // 2
        return self.conv * bins


# kind: "w" a matrix (std 1/sqrt(fan-in)), "norm" a gain around one, "bias" small, "pos" learned positions,
# "sin" Whisper's sinusoids; dtype "F32" or "F16"
Spec = tuple[str, tuple[int, ...], str]


def _linear(name: str, rows: int, cols: int) -> dict[str, Spec]:
    return {f"{name}.bias": ("bias", (rows,), "F32"), f"{name}.weight": ("w", (rows, cols), "F32")}


def _norm(name: str, n: int) -> dict[str, Spec]:
    return {f"{name}.bias": ("bias", (n,), "F32"), f"{name}.weight": ("norm", (n,), "F32")}


def vision_specs(v: VisionDims, out: int) -> dict[str, Spec]:
    """name -> spec of the vision encoder and its merger(s) feeding a backbone of width `out`."""
    w, merged = v.width, v.width * v.merge**2
    specs: dict[str, Spec] = {}
    for i in range(v.blocks):
        p = f"v.blk.{i}."
        specs |= _linear(p + "attn_out", w, w) | _linear(p + "attn_qkv", 3 * w, w) | _linear(p + "ffn_up", v.ff, w)
        specs |= _linear(p + "ffn_down", w, v.ff) | _norm(p + "ln1", w) | _norm(p + "ln2", w)
    merger = _linear("mm.0", merged, merged) | _linear("mm.2", out, merged)
    # the converter's order follows each model's modules: Qwen3-Omni's merger lists its norm first
    specs |= (_norm("v.post_ln", w) | merger) if v.levels else (merger | _norm("v.post_ln", w))
    for k in range(v.levels):
        p = f"v.deepstack.{k}."
        specs |= _norm(p + "norm", merged) | _linear(p + "fc1", merged, merged) | _linear(p + "fc2", out, merged)
    patch = ("w", (w, 3, v.patch, v.patch), "F32")  # Conv3d's two temporal slices, one tensor each
    positions = (v.image_size // v.patch) ** 2
    return specs | {"v.patch_embd.bias": ("bias", (w,), "F32"), "v.patch_embd.weight": patch,
                    "v.patch_embd.weight.1": patch, "v.position_embd.weight": ("pos", (positions, w), "F32")}


def audio_specs(a: AudioDims, out: int) -> dict[str, Spec]:
    """name -> spec of Qwen3-Omni's audio encoder and its projection to a backbone of width `out`."""
    d, c = a.width, a.conv
    specs: dict[str, Spec] = {"a.position_embd.weight": ("sin", (a.positions, d), "F32")}
    for k, channels in ((1, 1), (2, c), (3, c)):
        specs |= {f"a.conv2d.{k}.bias": ("bias", (c, 1, 1), "F32"),
                  f"a.conv2d.{k}.weight": ("w", (c, channels, 3, 3), "F16")}
    specs["a.conv_out.weight"] = ("w", (d, a.conv_out), "F16")
    for i in range(a.blocks):
        p = f"a.blk.{i}."
        specs |= _linear(p + "ffn_up", a.ff, d) | _linear(p + "ffn_down", d, a.ff) | _norm(p + "ln2", d)
        for name in ("attn_k", "attn_out", "attn_q", "attn_v"):
            specs |= _linear(p + name, d, d)
        specs |= _norm(p + "ln1", d)
    return specs | _norm("a.post_ln", d) | _linear("mm.a.mlp.1", d, d) | _linear("mm.a.mlp.2", out, d)


def sinusoids(length: int, channels: int, max_timescale: float = 10000.0) -> np.ndarray:
    """Whisper's and Qwen3-Omni's fixed audio positions (SinusoidsPositionEmbedding): [length, channels]."""
    increment = np.float32(-np.log(max_timescale) / (channels // 2 - 1))
    inv = np.exp(increment * np.arange(channels // 2, dtype=np.float32))
    scaled = (np.arange(length, dtype=np.float32)[:, None] * inv[None, :]).astype(np.float64)
    return np.concatenate([np.sin(scaled), np.cos(scaled)], axis=1).astype(np.float32)


def _values(kind: str, shape: tuple[int, ...], rng: np.random.Generator) -> np.ndarray:
    if kind == "w":
        return rng.standard_normal(shape, dtype=np.float32) / np.float32(np.sqrt(np.prod(shape[1:])))
    if kind == "norm":
        return 1.0 + 0.1 * rng.standard_normal(shape, dtype=np.float32)
    if kind == "sin":
        return sinusoids(*shape)
    return 0.02 * rng.standard_normal(shape, dtype=np.float32)  # biases, learned positions


def write_projector(path: Path, out: int, seed: int, vision: VisionDims, audio: AudioDims | None = None,
                    name: str = "clef-bridge demo") -> Path:
    """A random projector GGUF feeding a backbone of width `out`: vision alone (Qwen3.5's layout) or vision and
    audio in one file (Qwen3-Omni's). Deterministic per seed."""
    specs = (audio_specs(audio, out) if audio else {}) | vision_specs(vision, out)
    with quiet_gguf_py():  # gguf-py's INFO lines would land in serve's banner (the demo is written on first serve)
        _write(GGUFWriter(str(path), "clip"), specs, out, seed, vision, audio, name)
    return path


def _write(writer: GGUFWriter, specs: dict[str, Spec], out: int, seed: int, vision: VisionDims,
           audio: AudioDims | None, name: str) -> None:
    writer.add_type("mmproj")
    writer.add_name(name)
    writer.add_size_label(size_label(sum(int(np.prod(s)) for _, s, _ in specs.values()), 0, 0, 0))
    writer.add_file_type(0)  # the converter's F32 file (its F16 audio convolutions included)
    writer.add_clip_has_vision_encoder(True)
    writer.add_vision_projection_dim(out)
    writer.add_vision_image_size(vision.image_size)
    writer.add_vision_patch_size(vision.patch)
    writer.add_vision_embedding_length(vision.width)
    writer.add_vision_feed_forward_length(vision.ff)
    writer.add_vision_block_count(vision.blocks)
    writer.add_vision_head_count(vision.heads)
    writer.add_vision_image_mean(list(IMAGE_MEAN))
    writer.add_vision_image_std(list(IMAGE_STD))
    if audio:
        writer.add_clip_has_audio_encoder(True)
        writer.add_audio_projection_dim(out)
        writer.add_audio_embedding_length(audio.width)
        writer.add_audio_feed_forward_length(audio.ff)
        writer.add_audio_block_count(audio.blocks)
        writer.add_audio_head_count(audio.heads)
        writer.add_audio_num_mel_bins(audio.mel_bins)
        writer.add_audio_attention_layernorm_eps(1e-5)
    else:
        writer.add_clip_projector_type(QWEN3VL_MERGER)
    writer.add_vision_use_gelu(True)
    writer.add_vision_spatial_merge_size(vision.merge)
    writer.add_vision_attention_layernorm_eps(1e-6)
    writer.add_vision_is_deepstack_layers(list(vision.deepstack) or [False] * vision.blocks)
    if audio:
        writer.add_clip_vision_projector_type(QWEN3VL_MERGER)
        writer.add_clip_audio_projector_type(QWEN3_AUDIO)
    writer.add_quantization_version(2)
    rng = np.random.default_rng(seed)
    for tensor, (kind, shape, dtype) in specs.items():
        values = _values(kind, shape, rng)
        writer.add_tensor(tensor, values.astype(np.float16) if dtype == "F16" else values)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
