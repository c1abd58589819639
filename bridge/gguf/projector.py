"""The vision projector GGUF (mmproj) as a file: where it is, what its header says, whether it fits.

Read through the GGUF header only (no llama.cpp), so `check` and `fit` can judge a projector without
loading it; bridge/llama/vision.py loads it into llama.cpp.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ...head.errors import ClefError
from .reader import read_gguf

QWEN35_PROJECTOR = "qwen3vl_merger"  # Qwen3-VL's and Qwen3.5's merger; Qwen3.5's has no deepstack layers
MAX_IMAGE_TOKENS = 16384  # Qwen3.5's preprocessor: at most 16,777,216 pixels, one token per 32x32
PROJECTOR_HOME = ("community GGUF repositories of Qwen3.5 ship it as mmproj-*.gguf (llama.cpp's converter writes "
                  "one with --mmproj): put it beside the backbone GGUF or set mmproj = \"...\" in the models.toml "
                  "entry")


class ProjectorError(ClefError):
    """The vision projector (mmproj GGUF) cannot be loaded or does not fit this backbone."""

    error_type = "projector_error"


@dataclass(frozen=True)
class ProjectorInfo:
    """What the validator and fit need from an mmproj GGUF's metadata (read without loading it)."""

    projector_type: str
    n_embd: int  # width of the embeddings it hands the backbone
    patch_size: int
    merge: int  # spatial merge: merge x merge patches make one token
    deepstack: bool  # Qwen3-VL feeds extra layers; Qwen3.5 does not
    weight_bytes: int  # what llama.cpp loads
    width: int = 0  # the vision tower's own width and feed-forward width (for the compute estimate)
    feedforward: int = 0


def projector_info(path: str | Path) -> ProjectorInfo:
    gguf = read_gguf(path)
    meta = gguf.metadata
    if meta.get("general.architecture") != "clip" or not meta.get("clip.has_vision_encoder", False):
        raise ProjectorError(f"{path}: not a vision projector GGUF (general.architecture "
                             f"{meta.get('general.architecture')!r}); use the mmproj-*.gguf of this model")
    return ProjectorInfo(projector_type=str(meta.get("clip.projector_type", "")),
                         n_embd=int(meta.get("clip.vision.projection_dim", 0)),
                         patch_size=int(meta.get("clip.vision.patch_size", 0)),
                         merge=int(meta.get("clip.vision.spatial_merge_size", 2)),
                         deepstack=bool(np.any(meta.get("clip.vision.is_deepstack_layers", False))),
                         weight_bytes=gguf.file_size - gguf.data_start,
                         width=int(meta.get("clip.vision.embedding_length", 0)),
                         feedforward=int(meta.get("clip.vision.feed_forward_length", 0)))


def pairing_problems(info: ProjectorInfo, n_embd: int) -> list[str]:
    """Why this projector cannot feed a Qwen3.5 backbone of width n_embd (empty: it can)."""
    problems = []
    if info.projector_type != QWEN35_PROJECTOR or info.deepstack:
        kind = f"{info.projector_type}{' with deepstack layers (Qwen3-VL)' if info.deepstack else ''}"
        problems.append(f"projector type {kind}; Qwen3.5 needs {QWEN35_PROJECTOR} without deepstack layers")
    if info.n_embd != n_embd:
        problems.append(f"projector output width {info.n_embd} != backbone width {n_embd}: it belongs to "
                        "another model")
    return problems


def compute_bytes(info: ProjectorInfo, max_tokens: int = MAX_IMAGE_TOKENS) -> int:
    """llama.cpp's vision compute buffer for the largest image (flash attention on, as Projector runs it):
    per patch the float32 input pixels (3 x patch^2) plus the widest layer's live activations (the
    feed-forward's two [ff] tensors and about six [width] ones). It matches the 38.4 MiB llama.cpp
    reports for the tiny test tower's 8,464-patch warm-up within 9% (the only size it reports); about
    4 GiB at 16,384 tokens for a tower of Qwen3-VL's size (width 1152, ff 4304)."""
    patches = max_tokens * info.merge**2
    return patches * (3 * info.patch_size**2 + 6 * info.width + 2 * info.feedforward) * 4


def vision_bytes(path: Path | None, max_tokens: int = MAX_IMAGE_TOKENS) -> int:
    """What a projector adds to the GPU plan: its weights and its compute buffer (0 without one)."""
    if path is None:
        return 0
    info = projector_info(path)
    return info.weight_bytes + compute_bytes(info, max_tokens)


def find_projector(gguf: Path) -> list[Path]:
    """Projector files beside a backbone GGUF: <stem>.mmproj.gguf, or mmproj*.gguf (community repositories'
    names) in the same folder."""
    folder = gguf.parent
    if not folder.is_dir():
        return []
    found = {p for p in folder.glob("mmproj*.gguf")} | {p for p in [gguf.with_name(f"{gguf.stem}.mmproj.gguf")]
                                                         if p.is_file()}
    return sorted(p for p in found if p.is_file() and p != gguf)


def projector_for(gguf: Path, configured: Path | None) -> Path | None:
    """The projector a models.toml entry uses: mmproj when set, else the one file beside the GGUF."""
    if configured is not None:
        return configured
    found = find_projector(gguf)
    if len(found) > 1:
        raise ProjectorError(f"{len(found)} projector files beside {gguf.name}: {', '.join(p.name for p in found)}",
                             fix=f"name one with mmproj = \"{found[0].name}\" in the models.toml entry")
    return found[0] if found else None
