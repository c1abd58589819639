"""Loading the models a service serves: every entry of a registry, each the one checked way."""

from __future__ import annotations

import logging
from dataclasses import fields, replace
from typing import Mapping

from ...head.errors import Category, ClefError
from ..config.integrity import ModelRefused
from ..config.registry import Registry
from ..llama.adapters import BackbonePool
from ..model.clef_model import ClefModel
from ..model.loading import Loaded, load_checked

log = logging.getLogger("clef_bridge.server")


class ModelLoadError(ClefError):
    category = Category.CONFIG
    error_type = "model_load_error"

    def __init__(self, name: str, cause: ClefError):
        self.name, self.cause = name, cause
        super().__init__(f"model {name!r} failed to load: {cause}", fix=cause.fix)


def shared_backbones(registry: Registry) -> dict[str, tuple[str, ...]]:
    """Each model -> the models that share its backbone (itself included): the entries naming the same GGUF with
    the same backbone options."""
    groups: dict[tuple, list[str]] = {}
    for name, spec in registry.models.items():
        groups.setdefault((spec.gguf, spec.backbone), []).append(name)
    return {name: tuple(group) for group in groups.values() for name in group}


def head_shadows(registry: Registry, models: Mapping[str, ClefModel]) -> dict[str, frozenset[str]]:
    """Each model -> its shadows that are head-only fine-tunes of it (ClefModel.shares_hidden_states: one backbone and
    adapter, the same prompt), which score its requests from their own hidden states; its other shadows prefill."""
    return {name: frozenset(s for s in spec.shadow if s in models and models[s].shares_hidden_states(models[name]))
            for name, spec in registry.models.items() if name in models}


def second_copies(registry: Registry) -> dict[str, str]:
    """Each model whose GGUF an earlier entry loads with other backbone keys, and the warning that says so: it holds
    a second copy of the weights (on a 16 GB card, twice the backbone), where equal keys would share one."""
    first: dict[object, str] = {}
    out = {}
    for name, spec in registry.models.items():
        other = registry.models[first.setdefault(spec.gguf, name)]
        if other is spec or other.backbone == spec.backbone:
            continue
        differ = [f"{f.name} {getattr(spec.backbone, f.name)!r} where {other.name!r} has "
                  f"{getattr(other.backbone, f.name)!r}" for f in fields(spec.backbone)
                  if getattr(spec.backbone, f.name) != getattr(other.backbone, f.name)]
        out[name] = (f"backbone.second_copy: {spec.gguf.name} is loaded a second time for this model, as its backbone "
                     f"keys differ from model {other.name!r}'s ({'; '.join(differ)}): give every entry naming this "
                     "GGUF the same backbone keys (n_ctx, n_ubatch, n_seq_max, kv_type, ...) to share one copy")
    return out


def load_models(registry: Registry) -> dict[str, Loaded]:
    """Every model of the registry, each checked (loading.load_checked), or an error naming the one that failed."""
    models: dict[str, Loaded] = {}
    pool, sharing, copies = BackbonePool(), shared_backbones(registry), second_copies(registry)
    try:
        for name, spec in registry.models.items():
            # the head is named once checked (the banner): a clef GGUF embeds it, a qwen35 one has it beside it
            log.info("loading model %s: %s%s%s", name, spec.gguf, f" + {spec.head_path}" if spec.head_path else "",
                     f" + LoRA {spec.lora} (scale {spec.lora_scale:g})" if spec.lora else "")
            if len(sharing[name]) > 1:
                log.info("model %s shares ONE loaded backbone with %s (%s): each batch runs its own model's adapter",
                         name, ", ".join(n for n in sharing[name] if n != name), spec.gguf.name)
            try:
                models[name] = load_checked(spec, registry.server.limits,
                                            pool if len(sharing[name]) > 1 or spec.lora else None,
                                            tuple(registry.models[n] for n in sharing[name]))
            except ModelRefused:
                raise
            except ClefError as exc:
                raise ModelLoadError(name, exc) from exc
            if name in copies:
                models[name] = replace(models[name], warnings=(*models[name].warnings, copies[name]))
            for warning in models[name].warnings:
                log.warning("model %s is served with a warning: %s", name, warning)
    except BaseException:
        for loaded in models.values():
            loaded.model.close()
        raise
    return models
