"""End to end against Cloudflare's code: a tiny random Qwen3.5 in transformers + the reference head,
versus the same weights converted to GGUF and run through llama.cpp and our numpy head."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest
from clef_bridge.bridge.model.clef_model import ClefModel
from clef_bridge.head.answer import answers, systemone_answers

from .conftest import open_spec, tiny_spec
from .corpus import varied_requests
from .deciding import prepare, respond
from .reference import assert_same_answers, reference

pytestmark = pytest.mark.slow

F32_TOLERANCE = 2e-3
# f16 rounds each weight by up to 2^-11 (4.9e-4) relative, about 10x the hidden-state error of the
# f32 path (~5e-5); the head's probabilities move far less than that (measured: 7.8e-5), so the f32
# budget holds for f16 too and still catches a real defect (a wrong embedding row moves them by ~0.17).
F16_TOLERANCE = 2e-3
MARGIN = 0.05

REQUESTS = varied_requests()


@pytest.fixture(scope="module")
def oracle(fx):
    torch = pytest.importorskip("torch")
    from clef_bridge.head.config import config_path_for, load_config
    from safetensors.torch import load_file
    from transformers import AutoTokenizer, Qwen3_5ForConditionalGeneration

    ref = reference()
    tokenizer = AutoTokenizer.from_pretrained(fx.tokenizer_dir)
    backbone = Qwen3_5ForConditionalGeneration.from_pretrained(fx.hf_model, dtype=torch.float32).eval()
    head = ref.JointSchemaHead(**vars(load_config(config_path_for(fx.head))))
    head.load_state_dict(load_file(str(fx.head)), strict=True)  # the reference's own loader: bf16 tensors
    model = ref.ClefModel(backbone, head.float()).eval()
    return SimpleNamespace(ref=ref, tokenizer=tokenizer, model=model, processor=SimpleNamespace(tokenizer=tokenizer))


def reference_probabilities(oracle, request):
    """The reference's encoding and unrounded per-question probabilities."""
    import torch

    ref = oracle.ref
    encoded = ref.encode_record(oracle.tokenizer, request, max_length=8192)
    with torch.inference_mode():
        batch = ref.collate_records([encoded], oracle.tokenizer.pad_token_id, torch.device("cpu"))
        logits = oracle.model(batch)[0]
    return encoded, [q.float().softmax(-1).numpy() for q in logits]


def reference_answers(oracle, request, encoded, probs) -> dict:
    """The reference's own systemone_answer of each question, from its unrounded probabilities."""
    return {q.question_id: oracle.ref.systemone_answer(request["questions"][q.question_id],
                                                       dict(zip(q.option_ids, map(float, p))))
            for q, p in zip(encoded.questions, probs, strict=True)}


def our_probabilities(model: ClefModel, request, with_answers: bool = False):
    """Our encoding and unrounded probabilities (and, asked, the answers built from the same logits)."""
    prepared = prepare(model, request)
    hidden = model.backbone.prefill(prepared.encoded.input_ids)
    logits = model.logits(prepared.encoded, hidden)
    bounds = list(prepared.encoded.layout.option_offsets) + [len(logits)]
    probs = []
    for s, e in zip(bounds, bounds[1:]):
        z = np.exp(logits[s:e] - logits[s:e].max())
        probs.append(z / z.sum())
    if with_answers:
        return prepared.encoded, probs, systemone_answers(answers(prepared.request, logits,
                                                                  prepared.encoded.layout.option_offsets,
                                                                  model.answer_options))
    return prepared.encoded, probs


@pytest.fixture(scope="module")
def f16_model(fx):
    model = open_spec(tiny_spec(fx, gguf=fx.gguf_f16))
    yield model
    model.close()


@pytest.fixture(scope="module")
def q8_model(fx):
    model = open_spec(tiny_spec(fx, gguf=fx.gguf_q8_0))
    yield model
    model.close()


def test_corpus_covers_the_contract():
    assert len(REQUESTS) >= 25
    types = {q["type"] for r in REQUESTS for q in r["questions"].values()}
    assert types == {"noul", "choice", "score"}
    sizes = {len(q["criteria"]) for r in REQUESTS for q in r["questions"].values() if q["type"] != "noul"}
    assert {2, 255, 10} <= sizes
    assert max(len(r["questions"]) for r in REQUESTS) >= 10


@pytest.mark.parametrize("index", range(len(REQUESTS)))
def test_f32_gguf_matches_reference(oracle, tiny_model, index):
    request = REQUESTS[index]
    ref_encoded, ref_probs = reference_probabilities(oracle, request)
    ours, probs = our_probabilities(tiny_model, request)

    assert ours.input_ids.tolist() == list(ref_encoded.input_ids)
    assert ours.layout.question_spans.tolist() == [list(q.question_span) for q in ref_encoded.questions]
    assert ours.layout.option_spans.tolist() == [list(s) for q in ref_encoded.questions for s in q.option_spans]
    assert ours.layout.types.tolist() == [q.question_type for q in ref_encoded.questions]
    for p, rp in zip(probs, ref_probs, strict=True):
        assert np.abs(p - rp).max() <= F32_TOLERANCE

    # The whole response, every field: the reference's systemone against ours
    expected = oracle.ref.systemone(oracle.model, oracle.processor, request, max_length=8192)
    got = respond(tiny_model, request)
    assert got["model"] == expected["model"]
    assert got["usage"] == expected["usage"]
    assert_same_answers(got["answers"], expected["answers"], F32_TOLERANCE)


def _max_diff(oracle, model, tolerance):
    """The worst probability difference; every field of every answer checked within tolerance on the way."""
    worst = 0.0
    for request in REQUESTS:
        ref_encoded, ref_probs = reference_probabilities(oracle, request)
        _, probs, got = our_probabilities(model, request, with_answers=True)
        worst = max(worst, max(float(np.abs(p - rp).max()) for p, rp in zip(probs, ref_probs)))
        assert_same_answers(got, reference_answers(oracle, request, ref_encoded, ref_probs), tolerance)
    return worst


def test_f16_gguf_within_tolerance(oracle, f16_model):
    worst = _max_diff(oracle, f16_model, F16_TOLERANCE)
    print(f"f16 GGUF: max |prob diff| vs the reference = {worst:.2e}")
    assert worst <= F16_TOLERANCE


def test_q8_0_gguf_keeps_clear_decisions(oracle, q8_model):
    worst, checked = 0.0, 0
    for request in REQUESTS:
        _, ref_probs = reference_probabilities(oracle, request)
        _, probs = our_probabilities(q8_model, request)
        for p, rp in zip(probs, ref_probs):
            worst = max(worst, float(np.abs(p - rp).max()))
            top2 = np.sort(rp)[-2:]
            if top2[1] - top2[0] > MARGIN:
                checked += 1
                assert p.argmax() == rp.argmax()
    print(f"Q8_0 GGUF: max |prob diff| vs the reference = {worst:.2e}; {checked} clear decisions kept")
    assert checked >= 5
