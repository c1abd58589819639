"""Bad requests, bad heads and bad registries raise typed errors that name the problem."""

from __future__ import annotations

import json
from dataclasses import replace

import numpy as np
import pytest
from clef_bridge.bridge.config.registry import RegistryError, UnknownModel, load_registry, name_table, resolve
from clef_bridge.head.config import HeadConfig, load_config
from clef_bridge.head.encoder import EncodeOptions, encode
from clef_bridge.head.errors import ClefError, ContextLengthExceeded, HeadConfigError, HeadWeightsError, RequestInvalid
from clef_bridge.head.schema import Limits, parse_request
from clef_bridge.head.weights import load_state_dict, save_state_dict

from .randomhead import random_state_dict

pytestmark = pytest.mark.unit


def byte_tokenize(text: str, parse_special: bool) -> list[int]:
    return list(text.encode("utf-8"))


def body(**questions):
    return {"model": "m", "state": "s", "questions": questions}


def problems(raw) -> list:
    with pytest.raises(RequestInvalid) as info:
        parse_request(raw)
    return [(".".join(map(str, p.loc)), p.msg, p.type) for p in info.value.problems]


def test_unknown_question_type():
    [(loc, msg, kind)] = problems(body(q={"type": "maybe"}))
    assert loc == "body.questions.q.type" and "noul, choice, score" in msg and "'maybe'" in msg


@pytest.mark.parametrize("criteria, fragment", [
    ({}, "2 to 255 options (max_options), got 0"), ({"only": "one"}, "got 1"), ([], "got 0"),
    ("a,b", "must be an object"), ({"a": 1, "b": "x"}, "string, an object, an array or null"),
    (["a", "b", "a"], "named twice"), (["a", 3], "option name must be a string"),  # laya-serve's list form
])
def test_choice_criteria(criteria, fragment):
    found = problems(body(c={"type": "choice", "criteria": criteria}))
    assert any(loc.startswith("body.questions.c.criteria") and fragment in msg for loc, msg, _ in found), found


@pytest.mark.parametrize("criteria, fragment", [
    ([], "2 to 10 levels (max_levels), got 0"), (["x"], "got 1"), ([str(i) for i in range(11)], "got 11"),
    ({"0": "low"}, "must be an array"), ("low,high", "must be an array"), ([1, 2], "a level must be"),
])
def test_score_criteria(criteria, fragment):
    found = problems(body(s={"type": "score", "criteria": criteria}))
    assert any(fragment in msg for _, msg, _ in found), found


@pytest.mark.parametrize("criteria, fragment", [
    ("yes", "null or an object"), ([True], "null or an object"), ({"maybe": "x"}, "only 'true' and 'false'"),
    ({"true": 5}, "a criterion must be"),
])
def test_noul_criteria(criteria, fragment):
    found = problems(body(n={"type": "noul", "criteria": criteria}))
    assert any(fragment in msg for _, msg, _ in found), found


def test_missing_criteria_and_every_problem_reported():
    found = problems({"model": 3, "questions": {"a": {"type": "choice"}, "b": "not an object",
                                                "c": {"type": "score", "criteria": []}}})
    locs = [loc for loc, _, _ in found]
    assert locs == ["body.model", "body.state", "body.questions.a.criteria", "body.questions.b",
                    "body.questions.c.criteria"]


@pytest.mark.parametrize("raw", [
    None, [], "text", 3, {"model": "m", "state": "s"}, {"model": "m", "state": "s", "questions": {}},
    {"model": "m", "state": "s", "questions": []}, {"model": "", "state": "s", "questions": {"q": {"type": "noul"}}},
    {"model": "m", "state": 3.5, "questions": {"q": {"type": "noul"}}},
    {"model": "m", "state": None, "questions": {"q": {"type": "noul"}}},
    {"model": "m", "state": "s", "questions": {"q": {"type": "noul", "instructions": 7}}},
    {"model": "m", "state": "s", "questions": {"q": {"type": None}}},
    {"model": "m", "state": "s", "questions": {"": {"type": "noul"}}},
    {"model": "m", "state": "s", "images": ["data:image/png;base64,AAAA"], "questions": {"q": {"type": "noul"}}},
    {"model": "m", "state": "s", "questions": {f"q{i}": {"type": "noul"} for i in range(65)}},
    {"model": "m", "state": "s", "questions": {"q": {"type": "choice", "criteria": {str(i): "" for i in range(256)}}}},
])
def test_malformed_bodies_raise_request_invalid(raw):
    with pytest.raises(RequestInvalid) as info:
        parse_request(raw)
    assert info.value.problems and all(p.msg and p.loc[0] == "body" for p in info.value.problems)


def test_parse_request_reads_text_only():
    """Images are taken out of the body by bridge.assets first; a body that still holds some is refused, not
    answered without them."""
    [(loc, msg, kind)] = problems({"model": "m", "state": "s", "images": ["x"], "questions": {"q": {"type": "noul"}}})
    assert loc == "body.images" and kind == "images_not_supported" and "text only" in msg


def test_limits_are_configurable():
    raw = body(**{f"q{i}": {"type": "noul"} for i in range(3)})
    with pytest.raises(RequestInvalid, match=r"at most 2 questions per request \(max_questions\)"):
        parse_request(raw, Limits(max_questions=2))
    assert len(parse_request(raw, Limits(max_questions=3)).questions) == 3


def test_over_length_is_refused_with_counts():
    request = parse_request(body(q={"type": "noul", "instructions": "Is it?"}) | {"state": "x" * 5000})
    with pytest.raises(ContextLengthExceeded) as info:
        encode(request, byte_tokenize, EncodeOptions(max_length=1000))
    assert info.value.limit == 1000 and info.value.n_tokens > 5000
    assert "1000" in str(info.value) and str(info.value.n_tokens) in str(info.value)


def test_truncation_is_opt_in_and_keeps_the_schema():
    request = parse_request(body(q={"type": "noul", "instructions": "Is it?"}) | {"state": "x" * 5000})
    encoded = encode(request, byte_tokenize, EncodeOptions(max_length=1000, truncate_state=True))
    assert len(encoded.input_ids) == 1000 and encoded.state_tokens_dropped > 4000
    tiny = EncodeOptions(max_length=50, truncate_state=True)
    with pytest.raises(ContextLengthExceeded, match="schema alone"):
        encode(request, byte_tokenize, tiny)


def test_unencodable_text_is_a_request_error():
    with pytest.raises(RequestInvalid, match="unpaired surrogate") as info:
        parse_request(body(q={"type": "noul", "instructions": "bad \ud800 surrogate"}))
    assert [p.loc for p in info.value.problems] == [("body", "questions", "q", "instructions")]
    valid = parse_request(body(q={"type": "noul", "instructions": "fine"}))
    bypassed = replace(valid, questions=(replace(valid.questions[0], instructions="bad \ud800 surrogate"),))
    with pytest.raises(RequestInvalid, match="cannot be encoded"):  # the encoder refuses what skips validation
        encode(bypassed, byte_tokenize)


TINY = HeadConfig(hidden_size=16, width=8, routing_layers=1, layers=1, heads=2, feedforward=16)


def test_missing_unexpected_and_misshapen_tensors_in_one_error(tmp_path):
    flat = random_state_dict(TINY)
    del flat["residual_gate"]
    flat["surprise.weight"] = np.zeros(3, np.float32)
    flat["layers.0.linear1.weight"] = np.zeros((5, 8), np.float32)
    path = tmp_path / "joint_head.safetensors"
    save_state_dict(path, flat)
    with pytest.raises(HeadWeightsError) as info:
        load_state_dict(path, TINY)
    text = str(info.value)
    assert len(info.value.problems) == 3
    assert "missing tensor residual_gate" in text and "unexpected tensor surprise.weight" in text
    assert "layers.0.linear1.weight: shape [5, 8], config implies [16, 8]" in text


def test_head_for_another_config(tmp_path):
    path = tmp_path / "joint_head.safetensors"
    save_state_dict(path, random_state_dict(TINY))
    bigger = HeadConfig(hidden_size=32, width=8, routing_layers=2, layers=1, heads=2, feedforward=16)
    with pytest.raises(HeadWeightsError) as info:
        load_state_dict(path, bigger)
    assert any("missing tensor evidence_layers.1" in p for p in info.value.problems)
    assert any("hidden_norm.weight: shape [16], config implies [32]" in p for p in info.value.problems)


@pytest.mark.parametrize("content, fragment", [
    (b"\x01\x00", "shorter than"), (b"\xff" * 8 + b"{}", "does not fit"),
    (b"\x02\x00\x00\x00\x00\x00\x00\x00{x", "JSON"),
])
def test_corrupt_safetensors(tmp_path, content, fragment):
    path = tmp_path / "joint_head.safetensors"
    path.write_bytes(content)
    with pytest.raises(HeadWeightsError, match=fragment):
        load_state_dict(path, TINY)


def test_truncated_safetensors(tmp_path):
    path = tmp_path / "joint_head.safetensors"
    save_state_dict(path, random_state_dict(TINY))
    path.write_bytes(path.read_bytes()[:-100])
    with pytest.raises(HeadWeightsError, match="outside the"):
        load_state_dict(path, TINY)


@pytest.mark.parametrize("raw, fragment", [
    ({"hidden_size": 16, "width": 8, "routing_layers": 1, "layers": 1, "heads": 2}, "missing key 'feedforward'"),
    ({"hidden_size": 16, "width": 8, "routing_layers": 1, "layers": 1, "heads": 3, "feedforward": 4},
     "divisible by 'heads'"),
    ({"hidden_size": "16", "width": 8, "routing_layers": 1, "layers": 1, "heads": 2, "feedforward": 4},
     "'hidden_size' must be a positive integer"),
    ({"hidden_size": 16, "width": 8, "routing_layers": 1, "layers": 1, "heads": 2, "feedforward": 4, "x": 1},
     "unknown key 'x'"),
    ([1, 2], "expected a JSON object"),
])
def test_bad_head_config(tmp_path, raw, fragment):
    path = tmp_path / "joint_head_config.json"
    path.write_text(json.dumps(raw))
    with pytest.raises(HeadConfigError, match=fragment):
        load_config(path)


def test_missing_head_config_names_where_it_comes_from(tmp_path):
    with pytest.raises(HeadConfigError, match="Cloudflare/clef-flash"):
        load_config(tmp_path / "joint_head_config.json")


def _registry(tmp_path, text):
    path = tmp_path / "models.toml"
    path.write_text(text)
    return path


def test_registry_resolves_relative_paths_aliases_and_latest(tmp_path):
    reg = load_registry(_registry(tmp_path, 'default = "b"\n[models.a]\ngguf = "a.gguf"\nhead = "h/a.st"\n'
                                  '[models.b]\ngguf = "/abs/b.gguf"\nhead = "b.st"\naliases = ["bee"]\n'
                                  'temperature = 0.5\n'))
    assert reg.models["a"].gguf == tmp_path / "a.gguf" and reg.models["a"].head_path == tmp_path / "h" / "a.st"
    assert reg.models["b"].answer.temperature == {"noul": 0.5, "choice": 0.5, "score": 0.5}
    names = name_table(reg, {"a": 4096, "b": 64})
    assert resolve(names, "jev-latest") == "b" and resolve(names, "jev-preview") == "b" and resolve(names, "bee") == "b"
    assert resolve(names, "clef-flash") == "a"  # Cloudflare's name for the hidden-4096 model
    with pytest.raises(UnknownModel) as info:
        resolve(names, "clef")
    assert "'clef'" in str(info.value) and "bee" in str(info.value) and "jev-latest" in str(info.value)


def test_cloudflare_names_prefer_the_default_and_yield_to_explicit_ones(tmp_path):
    reg = load_registry(_registry(tmp_path, 'default = "b"\n[models.a]\ngguf = "a.gguf"\n'
                                  '[models.b]\ngguf = "b.gguf"\n[models.c]\ngguf = "c.gguf"\naliases = ["clef"]\n'))
    names = name_table(reg, {"a": 4096, "b": 4096, "c": 4096})
    assert names["clef-flash"] == "b" and names["clef"] == "c"
    assert "clef-flash" not in name_table(reg, {"a": 64, "b": 64, "c": 64})  # no model of that width


def test_registry_lists_every_problem_with_its_key(tmp_path):
    with pytest.raises(RegistryError) as info:
        load_registry(_registry(tmp_path, '[models.a]\ngguf = "a"\nn_ctx = "big"\nconfidence = "max"\n'
                                          '[models.b]\nhead = "h"\n[server]\nmax_queue = 0\n'))
    text = str(info.value)
    assert "4 problem(s)" in text
    for key in ("models.a.n_ctx", "models.a.confidence", "models.b.gguf", "server.max_queue"):
        assert key in text


@pytest.mark.parametrize("text, fragment", [
    ('[models.a]\ngguf = "a"\nhead = "h"\nn_ctxx = 5\n', "models.a.n_ctxx: unknown key"),
    ('[models.a]\nhead = "h"\n', "models.a.gguf: missing"),
    ('[models.a]\ngguf = "a"\nhead = "h"\nn_ctx = "big"\n', "models.a.n_ctx: wrong type"),
    ('[models.a]\ngguf = "a"\nhead = "h"\nn_ctx = true\n', "models.a.n_ctx: wrong type"),
    ('[models.a]\ngguf = "a"\nhead = "h"\nconfidence = "max"\n', "must be one of ['reference', 'jev']"),
    ('[models.a]\ngguf = "a"\nhead = "h"\nn_ctx = 100\nmax_length = 200\n', "exceeds n_ctx"),
    ('[models.a]\ngguf = "a"\nhead = "h"\ntemperature = {choice = 0}\n', "between 0.01 and 100"),
    ('[models.a]\ngguf = "a"\nhead = "h"\ntemperature = {yesno = 1}\n', "unknown question type"),
    ('default = "z"\n[models.a]\ngguf = "a"\nhead = "h"\n', "default = 'z'"),
    ('[models.a]\ngguf = "a"\nhead = "h"\naliases = ["jev-latest"]\n', "used twice"),
    ('nonsense = 1\n[models.a]\ngguf = "a"\nhead = "h"\n', "unknown top-level key"),
    ('default = "a"\n', "no models"),
    ('[models.a\n', "cannot parse"),
])
def test_registry_errors(tmp_path, text, fragment):
    with pytest.raises(RegistryError) as info:
        load_registry(_registry(tmp_path, text))
    assert fragment in str(info.value)


def test_every_domain_error_is_a_clef_error():
    for cls in (RequestInvalid, ContextLengthExceeded, HeadWeightsError, HeadConfigError, RegistryError, UnknownModel):
        assert issubclass(cls, ClefError)
