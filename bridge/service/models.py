"""Loading the models a service serves: every entry of a registry, each the one checked way."""

from __future__ import annotations

import logging

from ...head.errors import Category, ClefError
from ..config.integrity import ModelRefused
from ..config.registry import Registry
from ..llama.adapters import BackbonePool
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


def load_models(registry: Registry) -> dict[str, Loaded]:
    """Every model of the registry, each checked (loading.load_checked), or an error naming the one that failed."""
    models: dict[str, Loaded] = {}
    pool, sharing = BackbonePool(), shared_backbones(registry)
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
            for warning in models[name].warnings:
                log.warning("model %s is served with a warning: %s", name, warning)
    except BaseException:
        for loaded in models.values():
            loaded.model.close()
        raise
    return models
