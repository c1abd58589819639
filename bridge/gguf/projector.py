"""The projector GGUF (mmproj) as a file: where it is, what its header says, whether it fits.

Read through the GGUF header only (no llama.cpp), so `check` and `fit` can judge a projector without
loading it; bridge/llama/vision.py loads it into llama.cpp.

Qwen3-Omni's converter writes ONE projector with a vision encoder (qwen3vl_merger with deepstack layers) and an
audio encoder (qwen3a). llama.cpp's mtmd refuses that file ("mismatch between vision and audio mmproj": the
deepstack vision rows are (1 + k) x n_embd wide, the audio rows n_embd), so ensure_vision_projector writes its
vision half once into the cache; the audio half is read straight from the combined file by the numpy audio
tower (bridge/media/audio_tower.py).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
from gguf import GGUFValueType as V

from ...head.errors import Category, ClefError
from ..catalogue.architectures import (
    AUDIO_ARCHITECTURES,
    DEEPSTACK_ARCHITECTURES,
    QWEN35,
    QWEN35_IMAGE_TOKENS,
    image_tokens,
)
from .clef_split import CachedFile, copied, ensure_cached
from .reader import GGUFInfo, read_gguf, read_raw
from .writer import OutTensor, WriteResult, encode_value, write_gguf

QWEN35_PROJECTOR = "qwen3vl_merger"  # Qwen3-VL's, Qwen3.5's and Qwen3-Omni's merger; Qwen3.5's has no deepstack
OMNI_AUDIO_PROJECTOR = "qwen3a"  # Qwen3-Omni's audio encoder
AUDIO_TENSORS = ("a.", "mm.a.")  # the audio encoder's tensors in a combined projector; vision: v.* and mm.*
MAX_IMAGE_TOKENS = QWEN35_IMAGE_TOKENS[1]
PROJECTOR_HOME = ("community GGUF repositories of Qwen3.5 ship it as mmproj-*.gguf (llama.cpp's converter writes "
                  "one with --mmproj): put it beside the backbone GGUF or set mmproj = \"...\" in the models.toml "
                  "entry")


class ProjectorError(ClefError):
    """The vision projector (mmproj GGUF) cannot be loaded or does not fit this backbone."""

    category = Category.UNAVAILABLE
    error_type = "projector_error"


@dataclass(frozen=True)
class ProjectorInfo:
    """What the validator and fit need from an mmproj GGUF's metadata (read without loading it)."""

    projector_type: str  # the vision projector's
    n_embd: int  # width of the embeddings it hands the backbone (per deepstack level)
    patch_size: int
    merge: int  # spatial merge: merge x merge patches make one token
    deepstack: bool  # Qwen3-VL and Qwen3-Omni feed extra layers; Qwen3.5 does not
    weight_bytes: int  # what llama.cpp loads for the vision tower (a combined file's vision tensors only)
    width: int = 0  # the vision tower's own width and feed-forward width (for the compute estimate)
    feedforward: int = 0
    deepstack_layers: int = 0  # vision layers whose features the backbone takes besides the last one's
    audio_type: str = ""  # the audio encoder in the same file (Qwen3-Omni's qwen3a); "" for none
    audio_width: int = 0  # width of the audio rows it hands the backbone
    audio_bytes: int = 0  # the audio encoder's weights
    audio_float32_bytes: int = 0  # the audio encoder as bridge/media/audio_tower.py holds it (float32)

    @property
    def combined(self) -> bool:
        """Vision and audio in one file, which mtmd refuses: ensure_vision_projector splits the vision half out."""
        return bool(self.audio_type)


def _is_audio(name: str) -> bool:
    return name.startswith(AUDIO_TENSORS)


def projector_info(path: str | Path) -> ProjectorInfo:
    gguf = read_gguf(path)
    meta = gguf.metadata
    if meta.get("general.architecture") != "clip" or not meta.get("clip.has_vision_encoder", False):
        raise ProjectorError(f"{path}: not a vision projector GGUF (general.architecture "
                             f"{meta.get('general.architecture')!r}); use the mmproj-*.gguf of this model")
    audio = bool(meta.get("clip.has_audio_encoder", False))
    sizes = [(t.n_bytes or 0, _is_audio(t.name)) for t in gguf.tensors.values()]
    vision_bytes = sum(n for n, a in sizes if not a) if audio else gguf.file_size - gguf.data_start
    layers = np.asarray(meta.get("clip.vision.is_deepstack_layers", False), dtype=bool)
    return ProjectorInfo(projector_type=str(meta.get("clip.projector_type") or meta.get("clip.vision.projector_type")
                                            or ""),
                         n_embd=int(meta.get("clip.vision.projection_dim", 0)),
                         patch_size=int(meta.get("clip.vision.patch_size", 0)),
                         merge=int(meta.get("clip.vision.spatial_merge_size", 2)),
                         deepstack=bool(layers.any()),
                         weight_bytes=vision_bytes,
                         width=int(meta.get("clip.vision.embedding_length", 0)),
                         feedforward=int(meta.get("clip.vision.feed_forward_length", 0)),
                         deepstack_layers=int(layers.sum()),
                         audio_type=str(meta.get("clip.audio.projector_type", "")) if audio else "",
                         audio_width=int(meta.get("clip.audio.projection_dim", 0)) if audio else 0,
                         audio_bytes=sum(n for n, a in sizes if a),
                         audio_float32_bytes=4 * sum(t.n_elements for t in gguf.tensors.values() if _is_audio(t.name)))


def pairing_problems(info: ProjectorInfo, n_embd: int, architecture: str = QWEN35.name) -> list[str]:
    """Why this projector cannot feed a backbone of this architecture and width n_embd (empty: it can).

    Qwen3.5 (qwen35, qwen35moe, clef) takes a qwen3vl_merger without deepstack layers; Qwen3-Omni's thinker
    (qwen3vlmoe) one with them, and Qwen3-Omni's qwen3a audio encoder if the file has one.
    """
    problems = []
    omni = architecture in DEEPSTACK_ARCHITECTURES
    if info.projector_type != QWEN35_PROJECTOR or info.deepstack != omni:
        kind = f"{info.projector_type}{' with deepstack layers' if info.deepstack else ' without deepstack layers'}"
        want = "Clef-omni (qwen3vlmoe) needs Qwen3-Omni's" if omni else "Qwen3.5 needs"
        problems.append(f"projector type {kind}; {want} {QWEN35_PROJECTOR} "
                        f"{'with' if omni else 'without'} deepstack layers")
    if info.n_embd != n_embd:
        problems.append(f"projector output width {info.n_embd} != backbone width {n_embd}: it belongs to "
                        "another model")
    if info.audio_type and architecture not in AUDIO_ARCHITECTURES:
        problems.append(f"it holds an audio encoder ({info.audio_type}): a Qwen3-Omni projector, for Clef-omni "
                        "(qwen3vlmoe) backbones only")
    elif info.audio_type and info.audio_type != OMNI_AUDIO_PROJECTOR:
        problems.append(f"audio projector type {info.audio_type}; Clef-omni needs {OMNI_AUDIO_PROJECTOR}")
    elif info.audio_type and info.audio_width != n_embd:
        problems.append(f"audio projector output width {info.audio_width} != backbone width {n_embd}: it belongs "
                        "to another model")
    return problems


# --- the vision half of a combined projector ------------------------------------------------------

def _vision_plan(info: GGUFInfo) -> tuple[list[tuple[str, bytes]], list[OutTensor]]:
    """The keys and tensors of a combined projector's vision half: what mtmd loads as a vision-only projector.

    Keys: all but clip.audio.* and the per-encoder projector types; clip.projector_type names the vision one
    and clip.has_audio_encoder is false. Tensors: v.* and mm.* but mm.a.*, copied as stored (F16 stays F16).
    """
    kvs = []
    for key in info.fields:
        if key.startswith("clip.audio.") or key in ("clip.vision.projector_type", "clip.has_audio_encoder"):
            continue
        kvs.append((key, read_raw(info, key)))
    kvs.append(("clip.projector_type", encode_value(V.STRING, str(info.metadata["clip.vision.projector_type"]))))
    kvs.append(("clip.has_audio_encoder", encode_value(V.BOOL, False)))
    return kvs, copied(info, [n for n in info.tensors if not _is_audio(n)])


def write_vision_projector(src: str | Path, out: str | Path) -> WriteResult:
    """Write the vision half of a combined (vision + audio) projector as a projector of its own."""
    info = read_gguf(src)
    if "clip.vision.projector_type" not in info.metadata:
        raise ProjectorError(f"{src}: no clip.vision.projector_type: not a combined vision + audio projector")
    kvs, tensors = _vision_plan(info)
    return write_gguf(out, kvs, tensors, info.alignment, progress=False)


def ensure_vision_projector(src: str | Path, cache_root: str | Path) -> tuple[Path, CachedFile]:
    """The vision half of a combined projector from the cache, written once (and again when src changes)."""
    return ensure_cached(src, cache_root, ".vision.gguf", write_vision_projector)


def max_image_tokens(architecture: str | None) -> int:
    """The most tokens one image makes for a backbone of this architecture (its reference's image size)."""
    return image_tokens(architecture)[1]


def compute_bytes(info: ProjectorInfo, max_tokens: int = MAX_IMAGE_TOKENS) -> int:
    """llama.cpp's vision compute buffer for the largest image (flash attention on, as Projector runs it):
    per patch the float32 input pixels (3 x patch^2) plus the widest layer's live activations (the
    feed-forward's two [ff] tensors and about six [width] ones). It matches the 38.4 MiB llama.cpp
    reports for the tiny test tower's 8,464-patch warm-up within 9% (the only size it reports); about
    4 GiB at 16,384 tokens for a tower of Qwen3-VL's size (width 1152, ff 4304)."""
    patches = max_tokens * info.merge**2
    return patches * (3 * info.patch_size**2 + 6 * info.width + 2 * info.feedforward) * 4


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
