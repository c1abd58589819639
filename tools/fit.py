"""fit: a GPU memory plan for a GGUF (with the head that lies beside it) or for published dimensions."""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from ..bridge.catalogue.releases import CLEF_OMNI, RELEASES
from ..bridge.config.integrity import find_head
from ..bridge.config.memory_plan import (
    Arch,
    Plan,
    arch_from_gguf,
    lora_bytes,
    options_plan,
    plan_inputs,
    projector_sizes,
    serving_plan,
)
from ..bridge.config.presets import ARCHES, arch_preset, omni_projector
from ..bridge.config.registry import model_spec
from ..bridge.gguf.clef_format import CLEF_ARCH
from ..bridge.gguf.projector import projector_for, projector_info
from ..bridge.gguf.reader import GGUFInfo, read_gguf
from ..bridge.llama.options import BackboneOptions, PrefixCacheOptions
from ..head.config import CLEF_FLASH_HEAD, HeadConfig, config_path_for, load_config
from ..head.errors import Category, ClefError
from ..head.weights import stored_bytes


class FitError(ClefError):
    category = Category.USAGE
    error_type = "fit_error"


@dataclass(frozen=True)
class FitReport:
    plan: Plan
    arch: Arch
    vram_bytes: int
    head_on_gpu: bool
    head_dtype: str
    head_bytes_float32: int  # the loaded head's size in float32, wherever it runs
    head_source: str  # where its size comes from
    device: str = ""  # the GPU NVML read, when --vram was not given
    vision_weight_bytes: int = 0  # the vision projector, on the GPU with the backbone (0: none)
    vision_compute_bytes: int = 0  # its compute buffer for the largest image (the backbone's reference's)
    vision_source: str = ""  # the mmproj GGUF counted, or "" without one
    audio_weight_bytes: int = 0  # Clef-omni's audio tower (float32, on the GPU with the head)
    adapters: int = 0  # LoRA fine-tunes served over the one backbone, each with its own head
    lora_rank: int = 0
    adapter_bytes: int = 0  # all of them, float32 (the plan's head_bytes includes them)

    @property
    def ok(self) -> bool:
        return self.plan.fits

    def to_dict(self) -> dict[str, Any]:
        return {**self.plan.summary(), "head_dtype": self.head_dtype, "head_bytes_float32": self.head_bytes_float32,
                "head_source": self.head_source, "device": self.device, "vision_weight_bytes": self.vision_weight_bytes,
                "vision_compute_bytes": self.vision_compute_bytes, "vision_source": self.vision_source or None,
                "audio_weight_bytes": self.audio_weight_bytes, "adapters": self.adapters, "lora_rank": self.lora_rank,
                "adapter_bytes": self.adapter_bytes}


def released_head(hidden: int) -> HeadConfig:
    """The joint head's shape in both releases (Clef-flash's, at the backbone's width)."""
    return HeadConfig(**{**vars(CLEF_FLASH_HEAD), "hidden_size": hidden})


def _embedded_config(info: GGUFInfo) -> HeadConfig | None:
    """A clef GGUF's embedded head's shape, from its keys and tensor shapes (nothing dequantized)."""
    keys = ("clef.embedding_length", "clef.decision.routing_block_count", "clef.decision.block_count")
    memory, up = info.tensors.get("decision.proj_memory.weight"), info.tensors.get("dec.blk.0.ffn_up.weight")
    if info.architecture != CLEF_ARCH or memory is None or up is None or \
            not all(isinstance(info.metadata.get(k), int) for k in keys):
        return None
    hidden, routing, layers = (info.metadata[k] for k in keys)
    heads = info.metadata.get("clef.decision.head_count")
    return HeadConfig(hidden, memory.shape[1], routing, layers, heads if isinstance(heads, int) else 1, up.shape[1])


def head_config(gguf: Path, info: GGUFInfo, hidden: int, head: Path | None = None) -> tuple[HeadConfig, str]:
    """The head given, embedded in a clef GGUF or lying beside the GGUF, else the released head's shape."""
    if head is not None:
        return load_config(config_path_for(head)), str(head)
    embedded = _embedded_config(info)
    if embedded is not None:
        return embedded, f"the head embedded in {gguf.name}"
    head = find_head(gguf)
    if head is not None and config_path_for(head).is_file():
        return load_config(config_path_for(head)), str(head)
    return released_head(hidden), f"the released head's shape at hidden {hidden} (no head beside the GGUF)"


def fit(gguf: Path | None, arch_name: str | None, quant: str, vram: int, ctx: int, parallel: int, ubatch: int,
        head_on_gpu: bool, head_dtype: str = "f32", device: str = "", head: Path | None = None,
        mmproj: Path | None = None, n_cpu_moe: int | str = "auto", adapters: int = 0, lora_rank: int = 64
        ) -> FitReport:
    """The plan; the vision projector counted is mmproj, else the one beside the GGUF (none with --arch alone, but
    Clef-omni's own, vision and audio, from published dimensions). n_cpu_moe: as the models.toml key ("auto": the
    fewest blocks whose experts must stay in host memory). adapters: LoRA fine-tunes at lora_rank over the one
    backbone, each with its own head (as many heads; one without adapters)."""
    if (gguf is None) == (arch_name is None):
        raise FitError("give a GGUF or --arch NAME (not both)")
    if head is not None and gguf is None:
        raise FitError("--head goes with a GGUF (--arch plans the released head)")
    head_device = "cuda" if head_on_gpu else "cpu"
    projector = mmproj if gguf is None else projector_for(gguf, mmproj)
    info = read_gguf(gguf) if gguf is not None else None
    release = RELEASES.get(arch_name or "")
    architecture = info.architecture if info else release.backbone if release else None
    # the largest image of this backbone's reference, as serve plans it (Clef-omni's 1,024 tokens, Qwen3.5's 16,384)
    sizes = projector_sizes(projector_info(projector), architecture) if projector else None
    source = str(projector) if projector else ""
    if arch_name == CLEF_OMNI.name and sizes is None:
        sizes, source = omni_projector(), "Clef-omni's published shape"
    if arch_name is not None:
        try:
            arch = arch_preset(arch_name, quant)
        except KeyError as exc:
            raise FitError(exc.args[0]) from None
        cfg, head_source = released_head(ARCHES[arch_name]["head_hidden"]), f"the released {arch_name} head"
    else:
        arch = arch_from_gguf(info)
        cfg, head_source = head_config(gguf, info, arch.n_embd, head)
    adapter_bytes = adapters * lora_bytes(arch, lora_rank)
    inputs = plan_inputs(cfg, head_device, head_dtype, sizes, max(1, adapters), adapter_bytes)
    if arch_name is not None:
        options = BackboneOptions(n_ctx=ctx, n_seq_max=parallel, n_ubatch=ubatch, n_cpu_moe=n_cpu_moe,
                                  prefix_cache=PrefixCacheOptions(payloads=True))  # models.toml's default cache
        result = options_plan(arch, options, inputs.beside_bytes, vram, inputs.media_bytes)
    else:
        # models.toml's defaults for the rest (the prefix cache's sequences and cells included), as serve has them
        options = model_spec("fit", gguf, n_ctx=ctx, max_length=ctx, n_seq_max=parallel, n_ubatch=ubatch).backbone
        result = serving_plan(gguf, replace(options, n_cpu_moe=n_cpu_moe), inputs.beside_bytes, vram,
                              inputs.media_bytes)  # what serve does with that n_cpu_moe
    return FitReport(result, arch, vram, head_on_gpu, head_dtype, stored_bytes(cfg, "f32"), head_source, device,
                     inputs.vision_weight_bytes, inputs.vision_compute_bytes, source, inputs.audio_weight_bytes,
                     adapters, lora_rank if adapters else 0, adapter_bytes)
