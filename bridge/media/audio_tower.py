"""Qwen3-Omni's audio path in numpy (CuPy-ready): Whisper log-mel features and the audio tower
(transformers' Qwen3OmniMoeAudioEncoder), weights read from the projector GGUF's a.* / mm.a.* tensors.

Why not llama.cpp: mtmd's qwen3a pads every clip to whole 100-frame chunks plus one frame, so it makes more
rows than the reference (1.0 s: 26 rows for the reference's 13) and its rows differ for clips that are not
whole seconds; this path is the reference's own arithmetic (float32), like the head in head/model.py: pure
functions over arrays of one module (numpy, or CuPy with the weights on the GPU), shapes in the comments.

The reference's processor treats the clips of one request as a batch: WhisperFeatureExtractor pads them with
zeros to the longest one, so a shorter clip's last frames and its frame count depend on the longest clip
(request_frames); each clip then goes through the tower on its own.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

import numpy as np

from ...head.model import array_module, gelu, layer_norm, linear, softmax

SAMPLE_RATE = 16000  # the reference resamples every clip to 16 kHz mono float32
N_FFT, HOP = 400, 160  # Whisper's STFT: 25 ms windows every 10 ms
N_WINDOW = 50  # Qwen3-Omni's audio config: the tower convolves 2 x 50 = 100-frame chunks (1 s) on their own
N_WINDOW_INFER = 800  # ... and attends within windows of 800 frames (8 chunks)
TOKENS_PER_CHUNK = 13  # a whole 100-frame chunk after three stride-2 convolutions
# torch.stft reflects N_FFT // 2 samples at each end, which needs more samples than that: shorter clips make the
# reference fail, and would make no token
MIN_AUDIO_SAMPLES = N_FFT // 2 + 1


# --- how many frames and tokens ---------------------------------------------------------------------

def request_frames(lengths: Sequence[int]) -> list[int]:
    """Mel frames per clip of one request, as the reference's feature attention mask counts them.

    The extractor pads the clips to the longest (n samples): n // 160 frames each; a clip of m samples keeps
    the frames that start inside it, ceil(m / 160), at most n // 160 (so the longest keeps m // 160).
    """
    if not lengths:
        return []
    longest = max(lengths) // HOP
    return [min(-(-m // HOP), longest) for m in lengths]


def tokens_for_frames(frames: int, n_window: int = N_WINDOW) -> int:
    """transformers' _get_feat_extract_output_lengths: 13 tokens per whole chunk, three stride-2 convolutions
    over the rest (0 frames: 0 tokens)."""
    chunk = 2 * n_window
    f = (frames % chunk - 1) // 2 + 1
    return ((f - 1) // 2 + 1 - 1) // 2 + 1 + (frames // chunk) * TOKENS_PER_CHUNK


def audio_tokens(lengths: Sequence[int]) -> list[int]:
    """The <|audio_pad|> tokens the reference's processor writes for each clip of a request (sample counts)."""
    return [tokens_for_frames(f) for f in request_frames(lengths)]


# --- features ---------------------------------------------------------------------------------------

def _hz_to_mel(f: np.ndarray) -> np.ndarray:  # slaney: linear below 1 kHz, logarithmic above
    return np.where(f >= 1000.0, 15.0 + np.log(np.maximum(f, 1e-10) / 1000.0) * (27.0 / np.log(6.4)), 3.0 * f / 200.0)


def _mel_to_hz(m: np.ndarray) -> np.ndarray:
    return np.where(m >= 15.0, 1000.0 * np.exp(np.log(6.4) / 27.0 * (m - 15.0)), 200.0 * m / 3.0)


def mel_filters(n_mel: int) -> np.ndarray:
    """transformers' mel_filter_bank(201, n_mel, 0, 8000, 16000, norm="slaney", mel_scale="slaney"): [201, n_mel]."""
    fft_freqs = np.linspace(0, SAMPLE_RATE // 2, 1 + N_FFT // 2)  # [201]
    edges = _mel_to_hz(np.linspace(_hz_to_mel(np.float64(0.0)), _hz_to_mel(np.float64(8000.0)), n_mel + 2))
    slopes = edges[None, :] - fft_freqs[:, None]  # [201, n_mel + 2]
    width = np.diff(edges)  # [n_mel + 1]
    bank = np.maximum(0, np.minimum(-slopes[:, :-2] / width[:-1], slopes[:, 2:] / width[1:]))  # [201, n_mel]
    return bank * (2.0 / (edges[2:] - edges[:-2]))[None, :]


def log_mel(samples, padded: int, filters) -> Any:
    """WhisperFeatureExtractor's features of one clip zero-padded to `padded` samples: [n_mel, padded // 160]
    float32 (torch.stft, centered with reflection, the last frame dropped, log10, floor at max - 8, scaled)."""
    xp = array_module(samples)
    x = xp.zeros(padded, dtype=xp.float32)
    x[:len(samples)] = samples
    x = xp.pad(x, (N_FFT // 2, N_FFT // 2), mode="reflect")  # [padded + 400]
    n_frames = padded // HOP
    idx = xp.arange(N_FFT)[None, :] + HOP * xp.arange(n_frames)[:, None]  # [frames, 400]: the last frame dropped
    window = (0.5 - 0.5 * xp.cos(2 * math.pi * xp.arange(N_FFT) / N_FFT)).astype(xp.float32)  # periodic Hann
    spectrum = xp.fft.rfft((x[idx] * window).astype(xp.float64), axis=-1)  # [frames, 201]
    mel = (spectrum.real ** 2 + spectrum.imag ** 2) @ filters  # [frames, n_mel]
    log_spec = xp.log10(xp.maximum(mel, 1e-10))
    log_spec = xp.maximum(log_spec, log_spec.max() - 8.0)
    return ((log_spec + 4.0) / 4.0).T.astype(xp.float32)  # [n_mel, frames]


def request_features(clips: Sequence[Any], filters) -> list[Any]:
    """Each clip's features as the reference's processor makes them for one request: [n_mel, frames_i]."""
    padded = max(len(c) for c in clips)
    return [log_mel(c, padded, filters)[:, :f] for c, f in zip(clips, request_frames([len(c) for c in clips]))]


# --- the tower --------------------------------------------------------------------------------------

def conv2d_s2(x, weight, bias):
    """nn.Conv2d(kernel 3, stride 2, padding 1): [B, C, H, W] -> [B, O, ceil(H/2), ceil(W/2)], as one matmul."""
    xp = array_module(x)
    b, c, h, w = x.shape
    ho, wo = (h + 1) // 2, (w + 1) // 2
    xp_ = xp.pad(x, ((0, 0), (0, 0), (1, 2), (1, 2)))
    cols = xp.stack([xp_[:, :, kh:kh + 2 * ho:2, kw:kw + 2 * wo:2] for kh in range(3) for kw in range(3)],
                    axis=-1)  # [B, C, Ho, Wo, 9]
    cols = cols.transpose(0, 2, 3, 1, 4).reshape(b * ho * wo, c * 9)  # [B Ho Wo, C 9]
    out = cols @ weight.reshape(weight.shape[0], c * 9).T + bias.reshape(1, -1)  # [B Ho Wo, O]
    return out.reshape(b, ho, wo, -1).transpose(0, 3, 1, 2)  # [B, O, Ho, Wo]


def windowed_attention(y, windows: Sequence[tuple[int, int]], q, k, v, out, heads: int):
    """Qwen3OmniMoeAudioAttention: full attention inside each window only: [T, d] -> [T, d]."""
    xp = array_module(y)
    t, d = y.shape
    hd = d // heads
    qs = (linear(y, **q) * np.float32(1 / math.sqrt(hd))).reshape(t, heads, hd).transpose(1, 0, 2)  # [h, T, hd]
    ks = linear(y, **k).reshape(t, heads, hd).transpose(1, 0, 2)
    vs = linear(y, **v).reshape(t, heads, hd).transpose(1, 0, 2)
    o = xp.empty_like(qs)
    for s, e in windows:
        o[:, s:e] = softmax(qs[:, s:e] @ ks[:, s:e].transpose(0, 2, 1)) @ vs[:, s:e]  # [h, n, hd]
    return linear(xp.ascontiguousarray(o.transpose(1, 0, 2)).reshape(t, d), **out)


def encoder_layer(h, windows, ln1, ln2, attn_q, attn_k, attn_v, attn_out, ffn_up, ffn_down, heads: int, eps: float):
    """Pre-LN transformer layer (Qwen3OmniMoeAudioEncoderLayer): [T, d] -> [T, d]."""
    h = h + windowed_attention(layer_norm(h, **ln1, eps=eps), windows, attn_q, attn_k, attn_v, attn_out, heads)
    return h + linear(gelu(linear(layer_norm(h, **ln2, eps=eps), **ffn_up)), **ffn_down)


def attention_windows(tokens: int, width: int, n_window: int = N_WINDOW,
                      n_window_infer: int = N_WINDOW_INFER) -> list[tuple[int, int]]:
    """transformers' get_audio_cu_seqlens for one clip: windows of (the request's longest chunk's tokens) x 8."""
    size = tokens_for_frames(width, n_window) * (n_window_infer // (2 * n_window))
    bounds = list(range(0, tokens, size)) + [tokens]
    return list(zip(bounds, bounds[1:]))


def audio_tower(features, p: dict[str, Any], heads: int, eps: float, width: int, n_window: int = N_WINDOW):
    """One clip's features [n_mel, L] -> its rows for the backbone [tokens_for_frames(L), output width].

    width: the frames every chunk is zero-padded to before the convolutions, the longest chunk of ALL the
    request's clips (the reference batches them): a padded chunk's last token sees the padding's convolved bias.
    """
    xp = array_module(features)
    n_mel, frames = features.shape
    chunk = 2 * n_window
    lengths = [chunk] * (frames // chunk) + ([frames % chunk] if frames % chunk else [])
    x = xp.zeros((len(lengths), 1, n_mel, width), dtype=xp.float32)  # [B, 1, n_mel, width]
    for i, n in enumerate(lengths):
        x[i, 0, :, :n] = features[:, i * chunk:i * chunk + n]
    for k in (1, 2, 3):
        x = gelu(conv2d_s2(x, p[f"a.conv2d.{k}.weight"], p[f"a.conv2d.{k}.bias"]))  # [B, c, f, t] at the end
    b, c, f, t = x.shape
    x = linear(x.transpose(0, 3, 1, 2).reshape(b, t, c * f), p["a.conv_out.weight"])  # [B, t, d]
    x = x + p["a.position_embd.weight"][:t]  # sinusoids, counted from 0 in every chunk
    h = xp.concatenate([x[i, :tokens_for_frames(n, n_window)] for i, n in enumerate(lengths)])  # [T, d]
    windows = attention_windows(h.shape[0], width, n_window)
    i = 0
    while f"a.blk.{i}.ln1.weight" in p:
        layer = {name: {k: p[f"a.blk.{i}.{name}.{k}"] for k in ("weight", "bias") if f"a.blk.{i}.{name}.{k}" in p}
                 for name in ("ln1", "ln2", "attn_q", "attn_k", "attn_v", "attn_out", "ffn_up", "ffn_down")}
        h = encoder_layer(h, windows, **layer, heads=heads, eps=eps)
        i += 1
    h = layer_norm(h, p["a.post_ln.weight"], p["a.post_ln.bias"], eps)
    h = gelu(linear(h, p["mm.a.mlp.1.weight"], p["mm.a.mlp.1.bias"]))  # proj1, GELU
    return linear(h, p["mm.a.mlp.2.weight"], p["mm.a.mlp.2.bias"])  # proj2: [T, output width]


class AudioTowerError(ValueError):
    """The projector's audio tensors are missing or not Qwen3-Omni's."""


AUDIO_KEYS = ("clip.audio.attention.head_count", "clip.audio.attention.layer_norm_epsilon", "clip.audio.num_mel_bins")


@dataclass(frozen=True)
class AudioTower:
    """Qwen3-Omni's audio encoder and its projection, on one array module (numpy, or CuPy on a GPU)."""

    params: dict[str, Any]  # GGUF names (a.*, mm.a.*), float32, in torch's shapes
    heads: int
    eps: float
    filters: Any  # [201, n_mel] float64 mel filter bank

    @classmethod
    def from_gguf(cls, path: str | Path, xp: Any = np) -> "AudioTower":
        """The tower from a projector GGUF holding Qwen3-Omni's audio encoder (F32, F16 or quantized tensors)."""
        from ..gguf.reader import read_gguf, tensor_float32

        info = read_gguf(path)
        missing = [k for k in AUDIO_KEYS if k not in info.metadata]
        names = [n for n in info.tensors if n.startswith(("a.", "mm.a."))]
        need = ("a.conv2d.1.weight", "a.conv_out.weight", "a.position_embd.weight", "a.post_ln.weight",
                "mm.a.mlp.2.weight")
        if missing or any(n not in info.tensors for n in need):
            raise AudioTowerError(f"{path}: no Qwen3-Omni audio encoder (missing {missing or [n for n in need]}); "
                                  "use the mmproj GGUF that llama.cpp's converter writes for Qwen3-Omni")
        params = {n: xp.asarray(tensor_float32(info, info.tensors[n])) for n in names}
        filters = xp.asarray(mel_filters(int(info.metadata["clip.audio.num_mel_bins"])))
        return cls(params, int(info.metadata["clip.audio.attention.head_count"]),
                   float(info.metadata["clip.audio.attention.layer_norm_epsilon"]), filters)

    @property
    def width(self) -> int:
        """The width of the rows it hands the backbone (the backbone's n_embd)."""
        return int(self.params["mm.a.mlp.2.weight"].shape[0])

    def encode(self, clips: Sequence[np.ndarray]) -> list[np.ndarray]:
        """The clips of one request (float32 16 kHz mono) -> each one's rows, float32 [audio_tokens(...)[i], width]
        on the host."""
        xp = array_module(self.filters)
        feats = request_features([xp.asarray(c, dtype=xp.float32) for c in clips], self.filters)
        width = min(2 * N_WINDOW, max(f.shape[1] for f in feats))  # the request's longest chunk
        rows = [audio_tower(f, self.params, self.heads, self.eps, width).astype(xp.float32) for f in feats]
        return [r if xp is np else xp.asnumpy(r) for r in rows]
