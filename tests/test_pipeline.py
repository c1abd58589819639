"""The pipeline from a models.toml entry, the `decide` command, and options on answers."""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest
from clef_bridge.bridge.config.integrity import ModelRefused
from clef_bridge.head.answer import jev_choice_confidence, jev_score_confidence
from clef_bridge.head.config import HeadConfig
from clef_bridge.head.errors import ContextLengthExceeded
from clef_bridge.head.weights import save_state_dict

from .conftest import open_spec, tiny_spec
from .corpus import varied_requests
from .deciding import prepare, respond
from .randomhead import random_state_dict

pytestmark = pytest.mark.integration

ROUTER = varied_requests()[22]


def _registry(tmp_path, fx, extra=""):
    path = tmp_path / "models.toml"
    path.write_text(f'default = "tiny"\n[models.tiny]\ngguf = "{fx.gguf_f32}"\nhead = "{fx.head}"\n'
                    f'n_ctx = 4096\nmax_length = 4096\n{extra}')
    return path


def test_decide_command_prints_the_response(tmp_path, fx, tiny_model):
    request = tmp_path / "request.json"
    request.write_text(json.dumps(ROUTER))
    done = subprocess.run([sys.executable, "-m", "clef_bridge.tools.cli", "decide", "--models",
                           str(_registry(tmp_path, fx)), "--model", "tiny", str(request)],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout) == respond(tiny_model, ROUTER)


def test_decide_command_errors_go_to_stderr(tmp_path, fx):
    request = tmp_path / "request.json"
    request.write_text(json.dumps({"model": "tiny", "state": "s", "questions": {"q": {"type": "maybe"}}}))
    registry = _registry(tmp_path, fx)
    done = subprocess.run([sys.executable, "-m", "clef_bridge.tools.cli", "decide", "--models", str(registry),
                           str(request)], capture_output=True, text=True, timeout=300)
    assert done.returncode == 1 and done.stdout == "" and "type must be one of" in done.stderr
    done = subprocess.run([sys.executable, "-m", "clef_bridge.tools.cli", "decide", "--models", str(registry),
                           "--model", "clef", str(request)], capture_output=True, text=True, timeout=300)
    assert done.returncode == 2 and "'clef' is not served here" in done.stderr


def test_head_for_another_backbone_is_refused(tmp_path, fx):
    cfg = HeadConfig(hidden_size=128, width=32, routing_layers=1, layers=1, heads=2, feedforward=64)
    head = tmp_path / "joint_head.safetensors"
    save_state_dict(head, random_state_dict(cfg))
    (tmp_path / "joint_head_config.json").write_text(json.dumps(vars(cfg)))
    with pytest.raises(ModelRefused, match="pair.hidden_size: the head expects hidden_size 128 .* embedding length "
                       "is 64"):
        open_spec(tiny_spec(fx, head=head))


def test_over_length_request_through_the_model(fx):
    model = open_spec(tiny_spec(fx, max_length=120, n_ctx=512))
    try:
        with pytest.raises(ContextLengthExceeded) as info:
            respond(model, ROUTER)
        assert info.value.limit == 120 and info.value.n_tokens > 120
    finally:
        model.close()


def test_truncation_matches_the_reference(fx, tiny_model):
    from transformers import AutoTokenizer

    from .reference import reference

    request = varied_requests()[21]  # a 400-word state
    model = open_spec(tiny_spec(fx, max_length=300, n_ctx=512, truncate_state=True))
    try:
        ours = prepare(model, request).encoded
        theirs = reference().encode_record(AutoTokenizer.from_pretrained(fx.tokenizer_dir), request, max_length=300)
        assert ours.input_ids.tolist() == list(theirs.input_ids) and len(ours.input_ids) == 300
        assert ours.state_tokens_dropped > 0
        assert respond(model, request)["usage"]["input_tokens"] == 300
    finally:
        model.close()


def test_temperature_sharpens_without_moving_the_argmax(fx, tiny_model):
    cold = open_spec(tiny_spec(fx, temperature={"noul": 0.25, "choice": 0.25, "score": 1.0}))
    try:
        base, sharp = respond(tiny_model, ROUTER)["answers"], respond(cold, ROUTER)["answers"]
    finally:
        cold.close()
    for qid, answer in base.items():
        if answer["type"] == "choice":
            assert sharp[qid]["choice"] == answer["choice"]
            assert sharp[qid]["confidence"] > answer["confidence"]
        if answer["type"] == "score":  # temperature 1.0 for scores: unchanged
            assert sharp[qid] == answer
        if answer["type"] == "noul":
            assert abs(sharp[qid]["noul"] - 0.5) >= abs(answer["noul"] - 0.5)


def test_jev_confidence_formulas():
    assert jev_choice_confidence(np.array([1.0, 0.0, 0.0])) == pytest.approx(1.0)
    assert jev_choice_confidence(np.array([1 / 3] * 3)) == pytest.approx(0.0)
    assert jev_choice_confidence(np.array([0.5, 0.25, 0.25])) == pytest.approx(0.25)
    # score: n=3, D = (1 + 0 + 1)/3; p = [0.2, 0.6, 0.2], k = 1: 1 - 0.4 / (2/3) = 0.4
    assert jev_score_confidence(np.array([0.2, 0.6, 0.2])) == pytest.approx(0.4)
    assert jev_score_confidence(np.array([0.0, 1.0, 0.0])) == pytest.approx(1.0)
    assert jev_score_confidence(np.array([0.5, 0.0, 0.5])) == pytest.approx(0.0)


def test_jev_confidence_mode(fx, tiny_model):
    jev = open_spec(tiny_spec(fx, confidence="jev"))
    try:
        a, b = respond(tiny_model, ROUTER)["answers"], respond(jev, ROUTER)["answers"]
    finally:
        jev.close()
    for qid, answer in a.items():
        if answer["type"] == "choice":
            probs = np.array(list(answer["probabilities"].values()))
            assert b[qid]["confidence"] == pytest.approx(jev_choice_confidence(probs), abs=2e-4)
            assert b[qid]["probabilities"] == answer["probabilities"]
