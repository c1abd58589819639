"""Provenance: sha256 pins (streamed, cached by size and mtime) and pairing records.

A pairing record (`clef-bridge pair`) holds the head's sha256, a fingerprint of the backbone (a
deterministic sample of dequantized output.weight rows and the output norm) and canary probes (fixed
requests with their probabilities). A quantized copy of the right backbone keeps the fingerprint's
rows nearly parallel and the canaries close; a different backbone of the same shape does not.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

import numpy as np

from ...head.answer import softmax64
from ...head.schema import parse_request
from ..gguf.lora import lora_digest
from ..gguf.reader import GGUFInfo, read_gguf
from ..host.paths import cache_dir
from ..host.progress import Progress
from ..llama.embedding import OutputEmbedding
from ..media.request import IMAGE, Media

PAIR_VERSION = 2  # 2 adds the canaries' hidden states (version 1 records are still read)
FINGERPRINT_ROWS = 16
FINGERPRINT_DIMS = 256
# Measured on tests/fixturegen's backbones (tests/test_integrity.py prints the tiny ones):
#   backbone        F16      Q8_0     Q4_K_M   other backbone, same shape
#   row cosine      1.0000   1.0000   0.9998   -0.19
#   norm diff       0        0        0        0.37
#   canary max|dp|  0.0003   0.0078   0.0382   0.0875   (hidden-1024 bench backbone; tiny: <= 0.011)
# llama.cpp keeps norms in F32 and output.weight at Q6_K or better in every preset, so the
# fingerprint stays parallel under quantization; the canaries move with the quantization's coarseness.
MIN_ROW_COSINE = 0.98
MAX_NORM_DIFF = 0.05
MAX_CANARY_DIFF = 0.06
WARN_CANARY_DIFF = 0.03
# The canaries' last-layer hidden states (sampled tokens and dims), compared by mean (1 - cosine) per
# token: the backbone's inner layers show there even when the head's probabilities barely move.
# Measured on the tiny backbones (tests/test_integrity.py prints them):
#   F16 0.0000, Q8_0 0.0000, Q4_K_M 0.0013; a fine-tune of the same base (inner weights changed by
#   25%, embeddings/lm_head/final norm identical) 0.0121; another backbone ~0.97.
MAX_STATE_DRIFT = 0.006
WARN_STATE_DRIFT = 0.003
STATE_TOKENS = 32
STATE_DIMS = 256

CANARY_REQUESTS = [
    {"model": "canary", "state": "The invoice was paid twice and the customer wants the money back today.",
     "questions": {"refund": {"type": "noul", "instructions": "Does the customer ask for a refund?"},
                   "team": {"type": "choice", "instructions": "Which team?",
                            "criteria": {"billing": "payments and refunds", "tech": "bugs and outages",
                                         "sales": "pricing and upgrades"}},
                   "anger": {"type": "score", "instructions": "How upset is the customer?",
                             "criteria": ["calm", "annoyed", "angry", "furious"]}}},
    {"model": "canary", "state": {"message": "Can you add dark mode to the mobile app?", "plan": "free"},
     "questions": {"kind": {"type": "choice", "instructions": "What kind of message is it?",
                            "criteria": {"bug": None, "feature": None, "question": None, "praise": None}},
                   "urgent": {"type": "noul", "instructions": "Is it urgent?"}}},
]


# --- hashing ----------------------------------------------------------------------------------

def sha256_file(path: str | Path, progress: bool | None = None) -> str:
    """Streamed sha256, remembered per (path, size, mtime) so a multi-GB file is hashed once."""
    path = Path(path).resolve()
    stat = path.stat()
    key = f"{path}|{stat.st_size}|{stat.st_mtime_ns}"
    cache_file = cache_dir() / "sha256.json"
    try:
        cache = json.loads(cache_file.read_text())
    except (OSError, ValueError):
        cache = {}
    if key in cache:
        return cache[key]
    digest = hashlib.sha256()
    bar = Progress(f"sha256 {path.name}", stat.st_size, progress if stat.st_size > 64 * 2**20 else False)
    with path.open("rb") as f:
        while chunk := f.read(8 * 2**20):
            digest.update(chunk)
            bar.update(len(chunk))
    bar.close()
    cache[key] = digest.hexdigest()
    try:
        cache_file.parent.mkdir(parents=True, exist_ok=True)
        tmp = cache_file.with_suffix(".tmp")
        tmp.write_text(json.dumps(cache))
        tmp.replace(cache_file)
    except OSError:
        pass  # a read-only cache only costs a re-hash next time
    return cache[key]


# --- fingerprints --------------------------------------------------------------------------------

def _vector(info: GGUFInfo, name: str) -> np.ndarray | None:
    t = info.tensors.get(name)
    if t is None or len(t.shape) != 1 or getattr(t.type, "name", "") not in ("F32", "F16"):
        return None
    dtype = np.float32 if t.type.name == "F32" else np.float16
    return np.fromfile(info.path, dtype=dtype, count=t.shape[0], offset=info.data_start + t.offset).astype(np.float32)


def fingerprint(gguf: str | Path, info: GGUFInfo | None = None) -> dict[str, Any]:
    """Deterministic sample of the backbone: output-embedding rows and the final norm's weights."""
    info = info or read_gguf(gguf)
    emb = OutputEmbedding(gguf, max_rows=0, info=info)
    ids = [(i * 7919 + 13) % emb.n_vocab for i in range(FINGERPRINT_ROWS)]
    dims = np.linspace(0, emb.n_embd - 1, min(FINGERPRINT_DIMS, emb.n_embd)).astype(int)
    rows = emb.dequantize(np.array(ids))[:, dims]
    norm = _vector(info, "output_norm.weight")
    return {"row_ids": ids, "dims": dims.tolist(), "rows": np.round(rows, 6).tolist(),
            "output_norm": None if norm is None else np.round(norm[dims], 6).tolist()}


def compare_fingerprints(recorded: dict[str, Any], current: dict[str, Any]) -> tuple[float, float]:
    """(smallest cosine between recorded and current rows, largest relative norm-weight difference)."""
    a, b = np.array(recorded["rows"]), np.array(current["rows"])
    if a.shape != b.shape or recorded["row_ids"] != current["row_ids"]:
        return -1.0, float("inf")
    cos = (a * b).sum(1) / np.maximum(np.linalg.norm(a, axis=1) * np.linalg.norm(b, axis=1), 1e-12)
    norm_diff = 0.0
    if recorded["output_norm"] is not None and current["output_norm"] is not None:
        x, y = np.array(recorded["output_norm"]), np.array(current["output_norm"])
        norm_diff = float(np.abs(x - y).max() / max(np.abs(x).max(), 1e-12))
    return float(cos.min()), norm_diff


# --- canaries ---------------------------------------------------------------------------------------

def canary_probabilities(model: Any) -> list[dict[str, list[float]]]:
    """Unrounded probabilities of the canary requests through a loaded ClefModel."""
    out = []
    for request in CANARY_REQUESTS:
        probs = {}
        for question, logits in model.uncached_logits(model.prepare(parse_request(request, model.limits))):
            probs[question.id] = np.round(softmax64(logits), 6).tolist()
        out.append(probs)
    return out


def _sampled(hidden: np.ndarray) -> dict[str, Any]:
    """Hidden states [t, H] at evenly spaced tokens and dims, as a record keeps them."""
    tokens = np.unique(np.linspace(0, len(hidden) - 1, min(STATE_TOKENS, len(hidden))).astype(int))
    dims = np.unique(np.linspace(0, hidden.shape[1] - 1, min(STATE_DIMS, hidden.shape[1])).astype(int))
    return {"tokens": tokens.tolist(), "dims": dims.tolist(),
            "rows": np.round(hidden[np.ix_(tokens, dims)], 6).tolist()}


def canary_states(model: Any) -> list[dict[str, Any]]:
    """The canary requests' last-layer hidden states at sampled tokens and dims, through a loaded ClefModel."""
    return [_sampled(model.backbone.prefill(model.prepare(parse_request(request, model.limits)).encoded.input_ids))
            for request in CANARY_REQUESTS]


def canary_picture(factor: int) -> np.ndarray:
    """uint8 [8f, 8f, 3]: a fixed synthetic picture already at a processor size (no decoder, no resize)."""
    y, x = np.mgrid[0:8 * factor, 0:8 * factor]
    return np.stack([x * 255 // (8 * factor - 1), y * 255 // (8 * factor - 1), (x ^ y) & 255], -1).astype(np.uint8)


def image_canary(model: Any) -> dict[str, Any] | None:
    """The first canary request with canary_picture(), through the loaded projector, sampled hidden states of
    every token (the image's included); None for a model without a projector."""
    if model.projector is None:
        return None
    picture = Media({IMAGE: (canary_picture(model.projector.geometry.factor),)})
    prepared = model.prepare(parse_request(CANARY_REQUESTS[0], model.limits), picture)
    [item] = model.prefill_batch([prepared])
    return _sampled(item.hidden)


def state_drift(recorded: list[dict[str, Any]], current: list[dict[str, Any]]) -> float:
    """Mean over the sampled tokens of 1 - cosine(recorded, current); 1.0 when the samples do not line up."""
    drifts = []
    for a, b in zip(recorded, current, strict=True):
        x, y = np.array(a["rows"]), np.array(b["rows"])
        if a["tokens"] != b["tokens"] or a["dims"] != b["dims"] or x.shape != y.shape:
            return 1.0
        cos = (x * y).sum(1) / np.maximum(np.linalg.norm(x, axis=1) * np.linalg.norm(y, axis=1), 1e-12)
        drifts.append(1.0 - cos)
    return float(np.concatenate(drifts).mean())


def canary_difference(recorded: list[dict[str, list[float]]], current: list[dict[str, list[float]]]) -> float:
    worst = 0.0
    for a, b in zip(recorded, current, strict=True):
        for qid in a:
            worst = max(worst, float(np.abs(np.array(a[qid]) - np.array(b[qid])).max()))
    return worst


def pair_record(gguf: str | Path, head: str | Path, model: Any, lora: str | Path | None = None) -> dict[str, Any]:
    """What `clef-bridge pair` writes: enough to recognise this backbone and head later (and the LoRA adapter the
    model runs, whose canaries these are).

    head: the safetensors head, or the clef GGUF itself when the head is embedded in it.
    """
    return {
        **({"lora_sha256": lora_digest(lora)} if lora is not None else {}),
        "version": PAIR_VERSION,
        "head_sha256": sha256_file(head),
        "head_config": vars(model.head.config),
        "gguf_name": Path(gguf).name,
        "gguf_sha256": sha256_file(gguf),
        "fingerprint": fingerprint(gguf),
        "canaries": canary_probabilities(model),
        "canary_states": canary_states(model),
        **({"image_canary": canary} if (canary := image_canary(model)) is not None else {}),
        "tolerances": {"min_row_cosine": MIN_ROW_COSINE, "max_norm_diff": MAX_NORM_DIFF,
                       "max_canary_diff": MAX_CANARY_DIFF, "warn_canary_diff": WARN_CANARY_DIFF,
                       "max_state_drift": MAX_STATE_DRIFT, "warn_state_drift": WARN_STATE_DRIFT},
    }


def default_pair_path(gguf: str | Path) -> Path:
    gguf = Path(gguf)
    return gguf.with_name(f"{gguf.stem}.pair.json")
