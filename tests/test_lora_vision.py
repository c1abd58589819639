"""A fine-tune of a model that takes images, served as a LoRA adapter beside its base over ONE backbone (bridge/llama/
adapters.py): an image request decodes through the projector's path (mtmd, decode_media), not the text prefill's,
and must run its own model's adapter whichever model ran last. Both models share the base's head, so their answers
differ by the adapter alone; tests/test_lora_serving.py compares text-only fine-tunes with PEFT's."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest
from clef_bridge.bridge.config.registry import Registry, ServerSpec, model_spec
from clef_bridge.bridge.model.worker import InferenceWorker
from clef_bridge.bridge.service.coalesce import Coalescer
from clef_bridge.bridge.service.decision import DecisionService
from clef_bridge.bridge.service.systemone import decide_systemone
from clef_bridge.bridge.service.models import load_models

from . import fixturegen_lora
from .fixturegen_vision import encoded, picture
from .test_service import with_media

pytestmark = pytest.mark.integration

PNG = encoded(picture(96, 64, seed=11), "PNG")
BODY = {"state": "a photo of the incident", "questions": {
    "urgent": {"type": "noul", "instructions": "Is it urgent?"},
    "team": {"type": "choice", "instructions": "Which team?", "criteria": {"ops": "Operations", "sec": "Security",
                                                                           "fin": "Finance"}}}}
TEXT = {"state": "a text-only request", "questions": BODY["questions"]}
SAME = 1e-5  # one model's answer to one request, whatever ran before it (f32 GGUFs; measured 0)
MOVED = 1e-3  # the adapter's effect on the image request's logits must be far larger


@pytest.fixture(scope="module")
def service():
    vision, checkpoint = fixturegen_lora.build_vision()
    keys = {"n_ctx": 8192, "max_length": 8192, "mmproj": vision.mmproj_f32}
    specs = {"base": model_spec("base", vision.gguf_f32, vision.head, **keys),
             "tuned": model_spec("tuned", vision.gguf_f32, vision.head, lora=checkpoint / "adapter", **keys)}
    models = load_models(Registry(vision.base.root / "models.toml", "base", specs))
    workers = {name: InferenceWorker(loaded.model, 8) for name, loaded in models.items()}
    for worker in workers.values():
        worker.start()
    yield DecisionService(ServerSpec(), Coalescer(0), None, workers, {n: n for n in workers}), models
    for worker in workers.values():
        worker.stop()
    for loaded in models.values():
        loaded.model.close()


def logits(service: DecisionService, model: str, body: dict) -> np.ndarray:
    decision = asyncio.run(decide_systemone(service, dict(body, model=model), model))
    return np.concatenate([z for _, z in decision.logits])


def image(service: DecisionService, model: str, after: str) -> np.ndarray:
    """model's logits for the image request, right after `after` answered a text request (its adapter set last)."""
    logits(service, after, TEXT)
    return logits(service, model, with_media(BODY, images=PNG))


def test_an_image_request_runs_its_own_models_adapter_after_another_models_request(service):
    decisions, models = service
    shared = models["tuned"].model.backbone.shared
    assert shared is models["base"].model.backbone.shared and models["tuned"].model.projector is not None
    alone = {name: image(decisions, name, after=name) for name in ("tuned", "base")}
    moved = float(np.abs(alone["tuned"] - alone["base"]).max())
    assert moved > MOVED, "the adapter must move the image request's answer, or matching proves nothing"
    after_other = {"tuned": image(decisions, "tuned", after="base"), "base": image(decisions, "base", after="tuned")}
    print(f"the adapter moves the image request's logits by {moved:.3f}")
    for name in ("tuned", "base"):
        worst = float(np.abs(after_other[name] - alone[name]).max())
        assert worst <= SAME, f"{name}'s image answer moved by {worst:.2e} after the other model's request"
