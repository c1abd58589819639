"""Provenance without a local record: sampled tensors of a GGUF against the official safetensors release.

A few rows of the output embedding and of the feed-forward matrices of three layers are dequantized
from the GGUF and compared (cosine per row) with the same rows of the release's safetensors, read
with HTTP range requests through huggingface_hub (about a megabyte for Clef-flash, never the whole
checkpoint). A quantized copy of the release keeps every row nearly parallel; another model, or a
fine-tune whose changes exceed the quantization noise, does not.
"""

from __future__ import annotations

import json
import os
import struct
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from ..bridge.config.provenance import FINGERPRINT_ROWS
from ..bridge.gguf.reader import GGUFInfo, read_gguf, tensor_rows
from ..bridge.llama.embedding import OutputEmbedding
from ..head.errors import Category, ClefError

# Measured on the test backbones against their transformers checkpoint (tests/test_verify.py prints it):
# min row cosine F32 1.0, Q8_0 0.99998, Q4_K_M 0.9985; a fine-tune of the same base with inner weights
# changed by 25% 0.971; another backbone of the same shape about -0.2.
MIN_RELEASE_COSINE = 0.985
BLOCK_ROWS = 8
# GGUF tensor -> the transformers name in a Qwen3.5 checkpoint; the converter copies these unchanged
# (norm weights are shifted by one on the way, so they are not compared)
MATRICES = {"ffn_down": "mlp.down_proj", "ffn_up": "mlp.up_proj", "ffn_gate": "mlp.gate_proj"}
DECODERS = {"BF16": lambda raw: (np.frombuffer(raw, "<u2").astype(np.uint32) << 16).view(np.float32),
            "F16": lambda raw: np.frombuffer(raw, "<f2").astype(np.float32),
            "F32": lambda raw: np.frombuffer(raw, "<f4").astype(np.float32)}


class VerifyError(ClefError):
    category = Category.CONFIG
    error_type = "verify_error"


@dataclass(frozen=True)
class Sample:
    gguf_tensor: str
    release_tensor: str
    rows: tuple[int, ...]
    min_cosine: float


@dataclass(frozen=True)
class Verification:
    repo: str
    revision: str
    samples: tuple[Sample, ...]
    bytes_read: int
    gguf: str = ""
    notes: tuple[str, ...] = field(default=())

    @property
    def min_cosine(self) -> float:
        return min(s.min_cosine for s in self.samples)

    @property
    def ok(self) -> bool:
        return self.min_cosine >= MIN_RELEASE_COSINE

    def to_dict(self) -> dict[str, Any]:
        return {"repo": self.repo, "revision": self.revision, "gguf": self.gguf, "accepted": self.ok,
                "min_cosine": round(self.min_cosine, 5), "threshold": MIN_RELEASE_COSINE,
                "bytes_read": self.bytes_read, "samples": [vars(s) for s in self.samples]}


class _Remote:
    """Byte ranges of files in one hub repository, through huggingface_hub's URLs, session and headers."""

    def __init__(self, repo: str, revision: str | None, endpoint: str | None):
        from huggingface_hub import get_session
        from huggingface_hub.utils import build_hf_headers

        self.repo, self.revision, self.endpoint = repo, revision or "main", endpoint
        self.session, self.headers, self.bytes_read = get_session(), build_hf_headers(), 0

    def get(self, filename: str, start: int | None = None, end: int | None = None) -> bytes | None:
        """The bytes [start, end] of a file (the whole file without a range); None when it does not exist."""
        from huggingface_hub import hf_hub_url

        url = hf_hub_url(self.repo, filename, revision=self.revision, endpoint=self.endpoint)
        headers = dict(self.headers, **({"Range": f"bytes={start}-{end}"} if start is not None else {}))
        try:
            response = self.session.get(url, headers=headers, follow_redirects=True)
        except Exception as exc:  # noqa: BLE001 - the client's own transport errors
            raise VerifyError(f"cannot reach {self.endpoint or 'huggingface.co'} for {self.repo}: {exc}",
                              fix="check the network, or skip the verification") from None
        if response.status_code == 404:
            return None
        if response.status_code not in (200, 206):
            raise VerifyError(f"{self.repo}/{filename}: HTTP {response.status_code}",
                              fix="log in with `hf auth login` if the release repository is gated")
        data = response.content
        if start is not None and response.status_code == 200:  # a server that ignores Range
            data = data[start:end + 1]
        self.bytes_read += len(data)
        return data


def _release_layout(remote: _Remote) -> dict[str, tuple[str, dict[str, Any], int]]:
    """tensor name -> (shard file, its header entry, absolute offset of the shard's data section)."""
    index = remote.get("model.safetensors.index.json")
    shards = sorted(set(json.loads(index)["weight_map"].values())) if index else ["model.safetensors"]
    layout = {}
    for shard in shards:
        prefix = remote.get(shard, 0, 7)
        if prefix is None:
            raise VerifyError(f"{remote.repo} has no {shard}: it holds no transformers checkpoint to compare with",
                              fix="pass the repository of the released model (e.g. Cloudflare/clef-flash)")
        (n,) = struct.unpack("<Q", prefix)
        header = json.loads(remote.get(shard, 8, 8 + n - 1))
        for name, entry in header.items():
            if name != "__metadata__":
                layout[name] = (shard, entry, 8 + n)
    return layout


def _release_rows(remote: _Remote, layout, name: str, rows: list[int]) -> np.ndarray:
    shard, entry, data_start = layout[name]
    if entry["dtype"] not in DECODERS:
        raise VerifyError(f"{name} is {entry['dtype']} in the release; expected BF16, F16 or F32")
    width = entry["shape"][1]
    itemsize = 2 if entry["dtype"] in ("BF16", "F16") else 4
    out = []
    for row in rows:
        start = data_start + entry["data_offsets"][0] + row * width * itemsize
        out.append(DECODERS[entry["dtype"]](remote.get(shard, start, start + width * itemsize - 1)))
    return np.stack(out)  # [n, width]


def _gguf_rows(info: GGUFInfo, name: str, rows: list[int]) -> np.ndarray:
    from gguf import GGMLQuantizationType as Q
    from gguf.quants import dequantize

    tensor = info.tensors[name]
    raw = np.asarray(tensor_rows(info, tensor)[rows])
    if tensor.type == Q.F32:
        return raw.view(np.float32).reshape(len(rows), -1)
    return dequantize(raw, tensor.type).reshape(len(rows), -1).astype(np.float32)


def _cosines(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    return (a * b).sum(1) / np.maximum(np.linalg.norm(a, axis=1) * np.linalg.norm(b, axis=1), 1e-12)


def _text_prefix(layout: dict) -> str:
    """'model.language_model.' (Qwen3_5ForConditionalGeneration) or 'model.' (a text-only checkpoint)."""
    for prefix in ("model.language_model.", "model."):
        if f"{prefix}layers.0.mlp.down_proj.weight" in layout:
            return prefix
    raise VerifyError("the release checkpoint has no Qwen3.5 feed-forward weights (layers.0.mlp.down_proj)")


def verify_against(gguf: Path, repo: str, revision: str | None = None) -> Verification:
    """Compare sampled rows of the GGUF with the same rows of the release's safetensors checkpoint."""
    info = read_gguf(gguf)
    n_layers = info.arch_key("block_count")
    if not isinstance(n_layers, int):
        raise VerifyError(f"{gguf}: no block_count; not a Qwen3.5 backbone")
    remote = _Remote(repo, revision, os.environ.get("HF_ENDPOINT"))
    layout = _release_layout(remote)
    prefix = _text_prefix(layout)
    embedding = OutputEmbedding(gguf, max_rows=0)
    ids = [(i * 7919 + 13) % embedding.n_vocab for i in range(FINGERPRINT_ROWS)]  # the fingerprint's rows
    pairs = [(embedding.tensor_name, "lm_head.weight" if embedding.tensor_name == "output.weight"
              else f"{prefix}embed_tokens.weight", ids)]
    for layer in sorted({0, n_layers // 2, n_layers - 1}):
        for ours, theirs in MATRICES.items():
            name = f"blk.{layer}.{ours}.weight"
            n_rows = info.tensors[name].shape[1]
            start = (layer * 7919 + 101) % max(n_rows - BLOCK_ROWS, 1)
            pairs.append((name, f"{prefix}layers.{layer}.{theirs}.weight", list(range(start, start + BLOCK_ROWS))))
    samples = []
    for ours, theirs, rows in pairs:
        if theirs not in layout:
            raise VerifyError(f"the release checkpoint lacks {theirs}")
        cos = _cosines(_gguf_rows(info, ours, rows), _release_rows(remote, layout, theirs, rows))
        samples.append(Sample(ours, theirs, tuple(rows), round(float(cos.min()), 6)))
    return Verification(repo, remote.revision, tuple(samples), remote.bytes_read, str(gguf))
