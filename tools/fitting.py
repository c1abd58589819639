"""fit: a GPU memory plan for a GGUF (with the head that lies beside it) or for published dimensions."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..bridge.clef_format import CLEF_ARCH
from ..bridge.fit import ARCHES, HEAD_BYTES_PER_PARAM, Arch, Plan, arch_from_gguf, arch_preset, head_params, plan
from ..bridge.gguf_file import GGUFInfo, read_gguf
from ..bridge.integrity import find_head
from ..bridge.mmproj import compute_bytes, projector_for, projector_info
from ..head.config import config_path_for, load_config
from ..head.errors import ClefError


class FitError(ClefError):
    error_type = "fit_error"


@dataclass(frozen=True)
class FitReport:
    plan: Plan
    arch: Arch
    vram_bytes: int
    head_on_gpu: bool
    head_bytes_float32: int  # the loaded head's size, wherever it runs
    head_source: str  # where its size comes from
    vision_weight_bytes: int = 0  # the vision projector, on the GPU with the backbone (0: none)
    vision_compute_bytes: int = 0  # its compute buffer for the largest image (16,384 tokens)
    vision_source: str = ""  # the mmproj GGUF counted, or "" without one

    @property
    def ok(self) -> bool:
        return self.plan.fits

    def to_dict(self) -> dict[str, Any]:
        return {**self.plan.summary(), "head_bytes_float32": self.head_bytes_float32, "head_source": self.head_source,
                "vision_weight_bytes": self.vision_weight_bytes, "vision_compute_bytes": self.vision_compute_bytes,
                "vision_source": self.vision_source or None}


def _embedded_params(info: GGUFInfo) -> int | None:
    """Parameters of a clef GGUF's embedded head, from its keys and tensor shapes (nothing dequantized)."""
    keys = ("clef.embedding_length", "clef.decision.routing_block_count", "clef.decision.block_count")
    memory, up = info.tensors.get("decision.proj_memory.weight"), info.tensors.get("dec.blk.0.ffn_up.weight")
    if info.architecture != CLEF_ARCH or memory is None or up is None or \
            not all(isinstance(info.metadata.get(k), int) for k in keys):
        return None
    hidden, routing, layers = (info.metadata[k] for k in keys)
    return head_params(hidden, memory.shape[1], routing, layers, up.shape[1])


def _head_size(gguf: Path, info: GGUFInfo, hidden: int) -> tuple[int, str]:
    """Parameters of the head embedded in a clef GGUF or lying beside the GGUF, else the released head's."""
    embedded = _embedded_params(info)
    if embedded is not None:
        return embedded, f"the head embedded in {gguf.name}"
    head = find_head(gguf)
    if head is not None and config_path_for(head).is_file():
        cfg = load_config(config_path_for(head))
        return head_params(cfg.hidden_size, cfg.width, cfg.routing_layers, cfg.layers, cfg.feedforward), str(head)
    return head_params(hidden), f"the released head's shape at hidden {hidden} (no head beside the GGUF)"


def fit(gguf: Path | None, arch_name: str | None, quant: str, vram: int, ctx: int, parallel: int, ubatch: int,
        head_on_gpu: bool, mmproj: Path | None = None) -> FitReport:
    """The plan; the vision projector counted is mmproj, else the one beside the GGUF (none with --arch alone)."""
    if (gguf is None) == (arch_name is None):
        raise FitError("give a GGUF or --arch NAME (not both)")
    if arch_name is not None:
        try:
            arch = arch_preset(arch_name, quant)
        except KeyError as exc:
            raise FitError(exc.args[0]) from None
        params, source = head_params(ARCHES[arch_name]["head_hidden"]), f"the released {arch_name} head"
    else:
        info = read_gguf(gguf)
        arch = arch_from_gguf(info)
        params, source = _head_size(gguf, info, arch.n_embd)
    head_bytes = params * HEAD_BYTES_PER_PARAM
    projector = mmproj if gguf is None else projector_for(gguf, mmproj)
    info = projector_info(projector) if projector is not None else None
    weights, compute = (info.weight_bytes, compute_bytes(info)) if info else (0, 0)
    result = plan(arch, vram, ctx, parallel, ubatch, head_bytes=head_bytes if head_on_gpu else 0,
                  vision_bytes=weights + compute)
    return FitReport(result, arch, vram, head_on_gpu, head_bytes, source, weights, compute,
                     str(projector) if projector else "")
