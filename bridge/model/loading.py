"""The one checked way to load a model, for `serve` and every command.

Integrity checks (bridge/config/integrity.py) inspect the files and return findings; this module acts on
them: it refuses a failing pair before loading anything heavy, runs the pairing record's canaries
on the loaded model, and returns the model together with the warnings it is served with.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np

from ...head.answer import AnswerOptions
from ...head.config import HeadConfig, config_path_for, load_config
from ...head.encoder import DEFAULT_MAX_LENGTH, EncodeOptions
from ...head.errors import HeadConfigError
from ...head.schema import Limits
from ...head.weights import load_state_dict, params_from
from ..catalogue.architectures import architecture, image_tokens
from ..config.integrity import CheckReport, ModelRefused, check_all, check_canaries, check_image_canary, check_projector
from ..config.memory_plan import placement_for, plan_inputs, projector_sizes
from ..config.provenance import canary_probabilities, canary_states, image_canary
from ..config.registry import ModelSpec
from ..demo.builtins import DEMO_GGUF_NAMES
from ..gguf.clef_split import ensure_backbone
from ..gguf.lora import converted_lora, lora_file_bytes
from ..gguf.projector import ensure_vision_projector, projector_info
from ..gguf.reader import read_gguf
from ..host.gpu import head_device, host_rows_for, release_cached
from ..host.paths import cache_dir
from ..llama.adapters import BackbonePool
from ..llama.backbone import Backbone
from ..llama.embedding import OutputEmbedding
from ..llama.omni import OmniBackbone
from ..llama.options import BackboneOptions
from ..llama.protocol import BackboneProtocol
from ..llama.vision import Projector, ProjectorOptions
from ..media.audio_tower import AudioTower
from .clef_model import ClefModel, Head

log = logging.getLogger("clef_bridge.loading")


@dataclass(frozen=True)
class Loaded:
    """A checked model, the report of its checks, and the warnings it is served with."""

    model: ClefModel
    report: CheckReport
    warnings: tuple[str, ...]


def array_module_for(device: str) -> Any:
    if device == "cpu":
        return np
    try:
        import cupy
    except ImportError:
        raise HeadConfigError("head_device = \"cuda\" needs CuPy", fix="pip install 'clef-bridge[cuda]', or set "
                              "head_device = \"cpu\" in models.toml") from None
    return cupy


def materialize(spec: ModelSpec) -> None:
    """Build the files of a built-in model if they are not there yet."""
    if spec.builtin:
        from ..demo.builtins import builtin_folder, make_demo

        make_demo(builtin_folder(spec.builtin, spec.gguf))


def inspect_spec(spec: ModelSpec) -> CheckReport:
    """Every static check of a models.toml entry (files, pins, pairing record), without loading it."""
    materialize(spec)
    report = check_all(spec.gguf, spec.head_path, spec.pair, spec.gguf_sha256, spec.head_sha256,
                       want_record=not spec.builtin, lora=spec.lora)
    check_projector(report, spec.gguf, spec.mmproj)
    return report


def open_projector(spec: ModelSpec, report: CheckReport, backbone: BackboneProtocol) -> Projector | None:
    """The entry's checked vision projector on the backbone's device, or None when it has none. Qwen3-Omni's
    combined vision + audio projector loads as its vision half, written once into the cache (mtmd refuses the
    combined file)."""
    path = report.facts.mmproj
    if path is None:
        return None
    low, high = image_tokens(report.facts.architecture)
    options = ProjectorOptions(min_tokens=low, max_tokens=high, n_threads=spec.backbone.n_threads,
                               verbose=spec.backbone.verbose)
    if projector_info(path).combined:
        vision, done = ensure_vision_projector(path, cache_dir() / "projectors")
        if done.action == "converted":
            log.info("wrote the vision half of %s to %s (%.1f MB in %.2f s; mtmd refuses a projector holding vision "
                     "and audio; the audio tower reads the combined file)", path.name, vision, done.bytes / 1e6,
                     done.seconds)
        else:
            log.info("using the vision half of %s written earlier: %s", path.name, vision)
        path = vision
    return Projector(path, backbone, options)


def reference_spec(spec: ModelSpec, reference: str) -> ModelSpec:
    """An entry with its reference's defaults where the entry leaves the key unset (Clef-omni's: max_length
    64,000 tokens and an n_ctx that holds it, and its media layout, a "\\n" after each medium)."""
    length = DEFAULT_MAX_LENGTH[reference]
    if "max_length" in spec.keys:
        length = spec.encode.max_length
    elif "n_ctx" in spec.keys:
        length = min(length, spec.backbone.n_ctx)
    n_ctx = spec.backbone.n_ctx if spec.keys & {"n_ctx", "max_length"} else length
    return replace(spec, backbone=replace(spec.backbone, n_ctx=n_ctx),
                   encode=replace(spec.encode, max_length=length, media_layout=reference))


def open_backbone(report: CheckReport, path: Path, options: BackboneOptions, host_rows) -> Backbone:
    """Qwen3.5's backbone, or Qwen3-Omni's thinker with its projector's deepstack count (options: the entry's,
    placed on the GPU by its memory plan)."""
    arch = architecture(report.facts.architecture)
    if arch is None or not arch.every_token_output:  # Qwen3.5's hook hands over the hidden states it needs
        return Backbone(path, options, host_rows)
    mmproj = report.facts.mmproj
    deepstack = projector_info(mmproj).deepstack_layers if mmproj is not None else 0
    if deepstack:  # the converter writes 0 for Qwen3-Omni: the projector's count is the one the thinker uses
        log.info("loading %s with qwen3vlmoe.n_deepstack_layers = %d, the count of %s (the GGUF says %s)",
                 path.name, deepstack, mmproj.name, report.info.arch_key("n_deepstack_layers") if report.info else "?")
    if options.prefix_cache and options.prefix_cache.max_mb > 0:
        log.info("prefix cache on %s: qwen3vlmoe keeps KV cells only, so a checkpoint holds no state and a hit "
                 "shares the cached cells", path.name)
    return OmniBackbone(path, options, host_rows, deepstack)


def backbone_file(gguf: Path, given: str | None = None) -> Path:
    """The qwen35 GGUF llama.cpp loads: the file itself, or a clef GGUF's backbone, written once into the cache
    (given: the GGUF's architecture, when the caller read its header already)."""
    arch = architecture(given or read_gguf(gguf).architecture)
    if arch is None or not arch.loads_as:
        return gguf
    path, done = ensure_backbone(gguf, cache_dir() / "backbones")
    if done.action == "converted":
        log.info("wrote the qwen35 backbone of %s to %s (%.2f GB in %.1f s; llama-cpp-python cannot load arch clef, "
                 "so the backbone is kept apart; the head is read from the clef GGUF)", gguf.name, path,
                 done.bytes / 1e9, done.seconds)
        for old in done.superseded:
            log.info("removed %s: its clef GGUF changed", old)
    else:
        log.info("using the qwen35 backbone of %s converted earlier: %s (%.2f GB)", gguf.name, path, done.bytes / 1e9)
    return path


def _head_weights(report: CheckReport) -> tuple[HeadConfig, dict[str, np.ndarray], dict[str, float]]:
    """The head's config, torch-named float32 weights and GGUF temperatures (a clef GGUF's own, or none)."""
    if report.embedded is not None:
        head = report.embedded
        return head.config, head.state_dict, head.temperatures
    config = load_config(config_path_for(report.head_path))
    return config, load_state_dict(report.head_path, config), {}


def answer_options(configured: AnswerOptions, gguf_temperatures: dict[str, float]) -> AnswerOptions:
    """models.toml's answer options with the GGUF's temperature keys under them: models.toml wins key by key.

    A GGUF bucket key (choice.3_5) still wins over a models.toml type key (choice) for its bucket: the
    lookup takes the bucket first, whichever side it came from.
    """
    return replace(configured, temperature=gguf_temperatures | configured.temperature)


def open_model(spec: ModelSpec, report: CheckReport, limits: Limits = Limits(), pool: BackbonePool | None = None,
               group: tuple[ModelSpec, ...] = ()) -> tuple[ClefModel, list[str]]:
    """Load the backbone and head of an entry whose static checks passed (report); memory-plan warnings.

    The memory plan reads the GPU's free memory before this head is uploaded and counts the head
    once; CuPy's cached blocks go back to the driver first, so they count as free for llama.cpp.
    pool: backbones shared with other entries (the same GGUF and backbone options: one backbone, each entry's own
    LoRA adapter); an entry with `lora` always gets a view of a pool's backbone. group: the entries sharing its
    backbone (itself included), whose heads and adapters the memory plan counts.
    """
    config, flat, temperatures = _head_weights(report)
    device = head_device(spec.head_device)
    if spec.head_device == "auto":
        log.info("model %s: its head runs on the %s (head_device \"auto\")", spec.name,
                 "GPU through CuPy" if device == "cuda" else "CPU: no CuPy or no CUDA device")
    if spec.head_dtype != "f32" and device != "cuda":
        raise HeadConfigError(f"model {spec.name}: head_dtype = \"{spec.head_dtype}\" needs the head on a GPU, and "
                              "head_device \"auto\" found no CuPy with a CUDA device",
                              fix="pip install 'clef-bridge[cuda]' on a machine with an NVIDIA GPU, or drop head_dtype")
    xp = array_module_for(device)
    path = backbone_file(spec.gguf, report.facts.architecture)
    arch = architecture(report.facts.architecture)
    if arch is not None and arch.reference != EncodeOptions.media_layout:  # the default is the dense reference's
        spec = reference_spec(spec, arch.reference)
    release_cached(xp)
    mmproj = report.facts.mmproj
    info = projector_info(mmproj) if mmproj is not None else None  # its header, read once for the plan and tower
    sizes = projector_sizes(info, report.facts.architecture) if info is not None else None
    group = group or (spec,)
    inputs = plan_inputs(config, device, spec.head_dtype, sizes,
                         heads=sum(head_device(s.head_device) == device for s in group) or 1,
                         adapter_bytes=sum(lora_file_bytes(s.lora) for s in group if s.lora is not None))
    placed, warnings = placement_for(path, spec.backbone, inputs.beside_bytes, vision_bytes=inputs.media_bytes)
    head = Head(config, params_from(flat, xp, spec.head_dtype), xp)
    lora = converted_lora(spec.lora, path) if spec.lora is not None else None
    if lora is not None and pool is None:
        pool = BackbonePool()
    if pool is None:
        backbone = open_backbone(report, path, placed, host_rows_for(xp))
    else:
        backbone = pool.view((path, spec.backbone), lambda: open_backbone(report, path, placed, host_rows_for(xp)),
                             spec.name, lora, spec.lora_scale)
    try:
        embedding = OutputEmbedding(spec.gguf, info=report.info)
        projector = open_projector(spec, report, backbone)
        # Qwen3-Omni's audio encoder runs in numpy/CuPy, on the head's device, from the combined projector
        tower = AudioTower.from_gguf(mmproj, xp) if info is not None and info.audio_type else None
    except BaseException:
        backbone.close()
        raise
    answer = answer_options(spec.answer, temperatures)
    return ClefModel(spec.name, backbone, embedding, head, spec.encode, answer, limits, projector, tower), warnings


def load_checked(spec: ModelSpec, limits: Limits = Limits(), pool: BackbonePool | None = None,
                 group: tuple[ModelSpec, ...] = ()) -> Loaded:
    """A model only if its pair passes every check, canaries included; raises ModelRefused otherwise (pool, group:
    see open_model)."""
    report = inspect_spec(spec)
    if not report.accepted:
        raise ModelRefused(spec.name, report)
    model, warnings = open_model(spec, report, limits, pool, group)
    report.embedded = None  # a clef GGUF's head now lives in the model: the report need not hold a host copy
    if report.record is not None:
        try:
            check_canaries(report, report.record, canary_probabilities(model), canary_states(model))
            check_image_canary(report, report.record, image_canary(model))
        except BaseException:
            model.close()
            raise
        if not report.accepted:
            model.close()
            raise ModelRefused(spec.name, report)
    warnings += [f"{f.code}: {f.message}" for f in report.warnings]
    if not spec.builtin and report.info is not None and report.info.metadata.get("general.name") in DEMO_GGUF_NAMES:
        # a file made from the demo (joined, split, copied) keeps what the demo's answers say of themselves
        warnings.append(f"demo: {spec.gguf.name} is the built-in demo's backbone (general.name "
                        f"{report.info.metadata['general.name']!r}): RANDOM weights, its answers are meaningless")
    return Loaded(model, report, tuple(warnings))
