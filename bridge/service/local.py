"""The decision service outside a server: one loaded model, its worker thread and an event loop of its own, so
that the CLI's decide, eval, calibrate and drift take the very path a server request takes."""

from __future__ import annotations

import asyncio
from typing import Any

from ..config.registry import ServerSpec
from ..model.clef_model import ClefModel
from ..model.worker import InferenceWorker
from .coalesce import Coalescer
from .decision import Decision, DecisionService
from .systemone import decide_systemone


class LocalService:
    """A context manager: decide(body) blocks until the model answers; every body goes to this one model, whatever
    its `model` field names (the field is still validated)."""

    def __init__(self, model: ClefModel, server: ServerSpec = ServerSpec()):
        self.model = model
        self.server = server
        self._loop: asyncio.AbstractEventLoop | None = None
        self._worker = InferenceWorker(model, server.max_queue)
        # no deadline: a command waits for its answer as long as the model takes
        self.service = DecisionService(server, Coalescer(0), None, {model.name: self._worker},
                                       {model.name: model.name})

    def __enter__(self) -> LocalService:
        self._loop = asyncio.new_event_loop()
        self._worker.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self._worker.stop()
        self.service.decoders.close()
        self._loop.run_until_complete(self._loop.shutdown_default_executor())
        self._loop.close()

    def decide(self, body: Any) -> Decision:
        """A request body (its media inlined as the server takes them) decided as the server decides it."""
        return self._loop.run_until_complete(decide_systemone(self.service, body, self.model.name))
