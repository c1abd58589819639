"""The one checked way to load a model, for `serve` and every command.

Integrity checks (bridge/integrity.py) inspect the files and return findings; this module acts on
them: it refuses a failing pair before loading anything heavy, runs the pairing record's canaries
on the loaded model, and returns the model together with the warnings it is served with.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np

from ..head.config import config_path_for, load_config
from ..head.errors import HeadConfigError
from ..head.schema import Limits
from ..head.weights import load_params
from .backbone import Backbone
from .embedding import OutputEmbedding
from .fit import gpu_layers_for
from .integrity import ModelRefused, Report, check_all, check_canaries
from .mmproj import check_projector, projector_for, vision_bytes
from .pipeline import ClefModel, Head
from .provenance import canary_probabilities, canary_states
from .registry import ModelSpec
from .vision import Projector, ProjectorOptions

log = logging.getLogger("clef_bridge.loading")


@dataclass(frozen=True)
class Loaded:
    """A checked model, the report of its checks, and the warnings it is served with."""

    model: ClefModel
    report: Report
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
    if spec.builtin == "demo":
        from .demo import make_demo

        make_demo(spec.gguf.parent)


def inspect_spec(spec: ModelSpec) -> Report:
    """Every static check of a models.toml entry (files, pins, pairing record), without loading it."""
    materialize(spec)
    report = check_all(spec.gguf, spec.head, spec.pair, spec.gguf_sha256, spec.head_sha256,
                       want_record=not spec.builtin)
    check_projector(report, spec.gguf, spec.mmproj)
    return report


def open_projector(spec: ModelSpec, backbone: Backbone) -> Projector | None:
    """The entry's vision projector on the backbone's device, or None when it has none."""
    path = projector_for(spec.gguf, spec.mmproj)
    options = ProjectorOptions(n_threads=spec.backbone.n_threads, verbose=spec.backbone.verbose)
    return Projector(path, backbone, options) if path is not None else None


def open_model(spec: ModelSpec, head_path: Path, limits: Limits = Limits()) -> tuple[ClefModel, list[str]]:
    """Load the backbone and head of an entry that passed its static checks; memory-plan warnings."""
    config = load_config(config_path_for(head_path))
    xp = array_module_for(spec.head_device)
    head = Head(config, load_params(head_path, config, xp), xp)
    n_gpu_layers, warnings = gpu_layers_for(spec.gguf, spec.backbone, spec.head_device == "cuda", config.hidden_size,
                                            vision_bytes(projector_for(spec.gguf, spec.mmproj)))
    backbone = Backbone(spec.gguf, replace(spec.backbone, n_gpu_layers=n_gpu_layers))
    try:
        embedding = OutputEmbedding(spec.gguf)
        projector = open_projector(spec, backbone)
    except BaseException:
        backbone.close()
        raise
    return ClefModel(spec.name, backbone, embedding, head, spec.encode, spec.answer, limits, projector), warnings


def load_checked(spec: ModelSpec, limits: Limits = Limits()) -> Loaded:
    """A model only if its pair passes every check, canaries included; raises ModelRefused otherwise."""
    report = inspect_spec(spec)
    if not report.accepted:
        raise ModelRefused(spec.name, report)
    model, warnings = open_model(spec, Path(report.head), limits)
    if report.record is not None:
        try:
            check_canaries(report, report.record, canary_probabilities(model), canary_states(model))
        except BaseException:
            model.close()
            raise
        if not report.accepted:
            model.close()
            raise ModelRefused(spec.name, report)
    warnings += [f"{f.code}: {f.message}" for f in report.warnings]
    return Loaded(model, report, tuple(warnings))
