"""What the aiohttp app holds, as typed web.AppKeys (one place, so middleware and handlers share them)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from aiohttp import web

from ..config.integrity import Facts
from ..config.registry import ModelSpec, Registry
from ..model.loading import Loaded
from ..model.worker import InferenceWorker
from ..service.decision import DecisionService
from .auth import ApiKeys
from .decision_log import DecisionLog
from .pages import Page
from .prometheus import Metrics


@dataclass(frozen=True)
class Served:
    """One loaded model as the server runs it."""

    spec: ModelSpec
    worker: InferenceWorker
    warnings: tuple[str, ...]
    hidden_size: int
    release_date: str  # YYYY-MM-DD, read at load time (no stat() on the event loop)
    facts: Facts  # what the integrity checks found out about the files (architecture, head source, ...)
    head_path: str | None  # the head file served (a clef GGUF's own path when embedded)
    # its shadows that are head-only fine-tunes of it (bridge/service/models.py head_shadows): scored from its
    # requests' own hidden states, one head pass and no prefill
    head_shadows: frozenset[str] = frozenset()


Loader = Callable[[Registry], dict[str, Loaded]]

REGISTRY = web.AppKey("registry", Registry)
METRICS = web.AppKey("metrics", Metrics)
KEYS = web.AppKey("keys", ApiKeys)
LOADER = web.AppKey("loader", Loader)  # type: ignore[type-abstract]
SERVED = web.AppKey("served", dict[str, Served])
NAMES = web.AppKey("names", dict[str, str])  # every accepted model name -> the served model it means
SERVICE = web.AppKey("service", DecisionService)  # the one path from a request to its Decision
PLAYGROUND = web.AppKey("playground", dict[str, Page])  # the playground's files by route name
DECISION_LOG = web.AppKey("decision_log", DecisionLog)  # set only where models.toml names a decision_log
# shadow models' scorings under way (held here so none is garbage-collected mid-run; cancelled at shutdown)
SHADOW_TASKS = web.AppKey("shadow_tasks", set)
