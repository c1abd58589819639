"""Fine-tunes served as LoRA adapters over ONE loaded backbone, against Cloudflare's code with the adapter applied as
clef-finetune applies it (PEFT's PeftModel.from_pretrained over the base, the checkpoint's head).

Two fine-tunes (tests/fixturegen_lora.py: random non-zero A and B on every module clef-finetune targets) and the
base are loaded from one registry by one process; each answers within F32_TOLERANCE of its own reference, and
interleaved traffic across the three never changes an answer.
"""

from __future__ import annotations

import asyncio
from types import SimpleNamespace

import numpy as np
import pytest
from clef_bridge.bridge.config.registry import Registry, ServerSpec, model_spec
from clef_bridge.bridge.llama.adapters import BackboneView
from clef_bridge.bridge.model.worker import InferenceWorker
from clef_bridge.bridge.server.app import backbone_sharing
from clef_bridge.bridge.service.coalesce import Coalescer
from clef_bridge.bridge.service.decision import DecisionService
from clef_bridge.bridge.service.systemone import decide_systemone
from clef_bridge.bridge.service.models import load_models
from clef_bridge.head.answer import systemone_answers

from . import fixturegen_lora
from .corpus import varied_requests
from .reference import assert_same_answers, reference
from .test_end_to_end import F32_TOLERANCE, our_probabilities, reference_answers, reference_probabilities

pytestmark = pytest.mark.slow

REQUESTS = varied_requests()[:10]
NAMES = ("base", "claims", "routing")


@pytest.fixture(scope="module")
def lfx():
    return fixturegen_lora.build()


@pytest.fixture(scope="module")
def served(lfx):
    fx = lfx.base
    keys = {"n_ctx": 8192, "max_length": 8192}
    specs = {"base": model_spec("base", fx.gguf_f32, fx.head, **keys)}
    for name in NAMES[1:]:
        specs[name] = model_spec(name, fx.gguf_f32, lfx.head(name), lora=lfx.adapter(name), **keys)
    models = load_models(Registry(fx.root / "models.toml", "base", specs))
    yield {name: loaded.model for name, loaded in models.items()}
    for loaded in models.values():
        loaded.model.close()


def oracle_for(lfx, name: str):
    """Cloudflare's ClefModel over the base with this fine-tune's PEFT adapter and head (the base's own head for
    "base")."""
    torch = pytest.importorskip("torch")
    pytest.importorskip("peft")
    from clef_bridge.head.config import config_path_for, load_config
    from peft import PeftModel
    from safetensors.torch import load_file
    from transformers import AutoTokenizer, Qwen3_5ForConditionalGeneration

    fx, ref = lfx.base, reference()
    tokenizer = AutoTokenizer.from_pretrained(fx.tokenizer_dir)
    backbone = Qwen3_5ForConditionalGeneration.from_pretrained(fx.hf_model, dtype=torch.float32).eval()
    head_path = fx.head if name == "base" else lfx.head(name)
    if name != "base":
        backbone = PeftModel.from_pretrained(backbone, lfx.adapter(name)).eval()
    head = ref.JointSchemaHead(**vars(load_config(config_path_for(head_path))))
    head.load_state_dict(load_file(str(head_path)), strict=True)
    model = ref.ClefModel(backbone, head.float()).eval()
    return SimpleNamespace(ref=ref, tokenizer=tokenizer, model=model, processor=SimpleNamespace(tokenizer=tokenizer))


def test_the_three_models_share_one_backbone(served, lfx):
    views = [m.backbone for m in served.values()]
    assert all(isinstance(v, BackboneView) for v in views)
    assert len({id(v.shared) for v in views}) == 1
    assert [v.adapter is None for v in views] == [True, False, False]
    spec = model_spec("claims", lfx.base.gguf_f32, lfx.head("claims"), lora=lfx.adapter("claims"))
    assert backbone_sharing(spec, served["claims"].backbone) == {  # what /v1/models says of it
        "x_lora": {"adapter": "adapter", "scale": 1.0}, "x_backbone_shared_with": ["base", "routing"]}


@pytest.mark.parametrize("name", NAMES)
def test_each_fine_tune_matches_its_own_peft_reference(lfx, served, name):
    oracle = oracle_for(lfx, name)
    worst, moved = 0.0, 0.0
    base_oracle = oracle_for(lfx, "base") if name != "base" else None
    for request in REQUESTS:
        ref_encoded, ref_probs = reference_probabilities(oracle, request)
        ours, probs, got = our_probabilities(served[name], request, with_answers=True)
        assert ours.input_ids.tolist() == list(ref_encoded.input_ids)
        worst = max(worst, max(float(np.abs(p - rp).max()) for p, rp in zip(probs, ref_probs)))
        assert_same_answers(got, reference_answers(oracle, request, ref_encoded, ref_probs), F32_TOLERANCE)
        if base_oracle is not None:  # the adapter must matter, or matching its reference proves nothing
            _, base_probs = reference_probabilities(base_oracle, request)
            moved = max(moved, max(float(np.abs(p - bp).max()) for p, bp in zip(probs, base_probs)))
    print(f"{name}: max |prob diff| vs its PEFT reference = {worst:.2e}" + (f"; vs the base {moved:.2e}" if moved
                                                                              else ""))
    assert worst <= F32_TOLERANCE
    assert base_oracle is None or moved > 20 * F32_TOLERANCE
    if name != "base":  # the adapter itself moves the backbone's hidden states, not only the fine-tune's head
        ids = our_probabilities(served[name], REQUESTS[0])[0].input_ids
        tuned, plain = served[name].backbone.prefill(ids), served["base"].backbone.prefill(ids)
        assert np.abs(tuned - plain).max() > 0.1 * np.abs(plain).max()


def test_interleaved_traffic_never_changes_another_models_answer(served):
    alone = {(name, i): our_probabilities(served[name], r, with_answers=True)[2]
             for name in NAMES for i, r in enumerate(REQUESTS)}
    workers = {name: InferenceWorker(model, 64) for name, model in served.items()}
    service = DecisionService(ServerSpec(), Coalescer(0), None, workers, {n: n for n in NAMES})

    async def traffic():
        order = [(name, i) for i in range(len(REQUESTS)) for name in NAMES] * 2
        np.random.default_rng(3).shuffle(order)
        decisions = await asyncio.gather(*(decide_systemone(service, dict(REQUESTS[i], model=name), name)
                                           for name, i in order))
        return list(zip(order, decisions))

    for worker in workers.values():
        worker.start()
    try:
        results = asyncio.run(traffic())
    finally:
        for worker in workers.values():
            worker.stop()
    for key, decision in results:
        assert_same_answers(systemone_answers(decision.answers), alone[key], 1e-4)
    assert served["base"].backbone.shared.switches >= 3


def test_the_shared_prefix_cache_never_hands_one_adapters_prefix_to_another(served):
    from clef_bridge.bridge.llama.prefix_cache import PrefillRequest

    tokens = np.random.default_rng(5).integers(1000, 100000, size=300).astype(np.int32)
    request = PrefillRequest(tokens, (10, 290))
    cache = served["base"].backbone.prefix_cache
    cache.clear()
    def prefill(name):
        done = served[name].backbone.prefill_cached([request])[0]
        if done.ticket:  # the head's rows the model would attach (the cache serves hits once they are there)
            cache.attach(done.ticket, [np.zeros(1, np.float32) for _ in done.new_segments])
        return done

    first, other, again = prefill("claims"), prefill("routing"), prefill("claims")
    assert first.reused == 0 and other.reused == 0  # same tokens, another adapter: a miss
    assert again.reused > 0  # its own checkpoint: a hit
    full = served["claims"].backbone.prefill(tokens)
    np.testing.assert_allclose(again.hidden, full[again.reused:], rtol=0, atol=1e-4)
    np.testing.assert_allclose(other.hidden, served["routing"].backbone.prefill(tokens), rtol=0, atol=1e-4)
    cache.clear()


def test_the_server_says_which_models_share_the_backbone(lfx, served):
    from clef_bridge.bridge.server.app import banner

    from .serverkit import RunningServer

    fx = lfx.base
    specs = {"base": model_spec("base", fx.gguf_f32, fx.head, n_ctx=8192, max_length=8192),
             "claims": model_spec("claims", fx.gguf_f32, lfx.head("claims"), lora=lfx.checkpoints["claims"],
                                  lora_scale=0.5, n_ctx=8192, max_length=8192)}
    with RunningServer(Registry(fx.root / "models.toml", "base", specs)) as srv:
        models = {m["name"]: m for m in srv.request("GET", "/v1/models").json()["models"]}
        lines = banner(srv.app, "http://x")
        answer = srv.post(dict(REQUESTS[0], model="claims")).json()["answers"]
    assert models["claims"]["x_lora"] == {"adapter": "tiny-lora-claims", "scale": 0.5}
    assert models["claims"]["x_backbone_shared_with"] == ["base"] and "x_lora" not in models["base"]
    assert any("ONE loaded backbone shared with base" in line for line in lines)
    assert any(line.strip().startswith("lora ") and "scale 0.5" in line for line in lines)
    full = our_probabilities(served["claims"], REQUESTS[0], with_answers=True)[2]
    def numbers(a: dict) -> list[float]:
        return [a["noul"]] if "noul" in a else list(a["probabilities"].values())

    moved = max(abs(x - y) for q in answer for x, y in zip(numbers(answer[q]), numbers(full[q])))
    assert moved > 1e-3  # half the adapter is not the whole adapter: lora_scale reaches llama.cpp
