"""Tests' ways into a loaded ClefModel: a body decided through the decision service (the one pipeline the server and
the CLI share), and a body encoded the way the worker encodes it."""

from __future__ import annotations

from typing import Any

from clef_bridge.bridge.config.registry import ServerSpec
from clef_bridge.bridge.media.request import NO_MEDIA, Media
from clef_bridge.bridge.model.clef_model import Prepared, Scored
from clef_bridge.bridge.server.doors.systemone import systemone_body
from clef_bridge.bridge.service.local import LocalService
from clef_bridge.head.answer import systemone_answers
from clef_bridge.head.schema import parse_request


def respond(model: Any, body: Any, server: ServerSpec = ServerSpec()) -> dict[str, Any]:
    """A request body's response through bridge.service, as the server would answer it (without x_ extensions)."""
    with LocalService(model, server) as service:
        return systemone_body(service.decide(body))


def prepare(model: Any, body: Any, media: Media = NO_MEDIA) -> Prepared:
    """A body validated and encoded with its decoded media, no decode in llama.cpp."""
    return model.prepare(parse_request(body, model.limits), media)


def score_batch(model: Any, batch: list[Prepared]) -> list[Scored]:
    """One batched prefill, then the head over the batch: the worker's steps without its thread."""
    return model.score([model.head_input(item) for item in model.prefill_batch(batch)])


def systemone(scored: Scored, body: Any) -> dict[str, Any]:
    """A Scored request's System One body, as the service renders its Decision (the model as the body named it)."""
    return {"model": body["model"], "answers": systemone_answers(scored.answers),
            "usage": {"input_tokens": scored.input_tokens, "output_tokens": 0}}
