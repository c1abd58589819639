"""The answer math, exactly and without fixtures: p = softmax(z / T) in float64; llama-server's temperature
lookup (the option-count bucket's key before the type's, then 1.0) at every bucket boundary, from models.toml,
from a clef GGUF's keys and from the two merged; every field of an answer from its probabilities.

The expected values are written out from shared/clef-gguf-format.md and shared/clef-reference.md §6, not
computed by the code under test.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from clef_bridge.bridge.config.registry import RegistryError, load_registry
from clef_bridge.bridge.gguf.clef_format import temperature_key
from clef_bridge.bridge.gguf.clef_head import read_embedded_head
from clef_bridge.bridge.model.loading import answer_options
from clef_bridge.head.answer import (
    AnswerOptions,
    NoulAnswer,
    ScoreAnswer,
    answers,
    probabilities,
    softmax64,
    systemone_answer,
    systemone_answers,
)
from clef_bridge.head.answer import answer as typed_answer
from clef_bridge.head.config import HeadConfig
from clef_bridge.head.schema import parse_request

from .fixturegen_clef import write_clef
from .randomhead import random_state_dict

pytestmark = pytest.mark.unit

# llama-server: n <= 2 -> "2", n <= 5 -> "3_5", n <= 10 -> "6_10", else "11"; both sides of every bound
BUCKET_OF = {2: "2", 3: "3_5", 4: "3_5", 5: "3_5", 6: "6_10", 7: "6_10", 10: "6_10", 11: "11", 12: "11", 255: "11"}
SCORE_SIZES = [n for n in BUCKET_OF if n <= 10]  # 2..10 levels
# a distinct temperature per key, so the T that was used names the key it came from
TYPE_T = {"noul": 0.55, "choice": 0.7, "score": 1.9}
BUCKET_T = {"2": 0.25, "3_5": 0.4, "6_10": 2.5, "11": 3.5}
BOTH = TYPE_T | {f"{kind}.{b}": t + i / 100 for i, kind in enumerate(TYPE_T) for b, t in BUCKET_T.items()}
TINY_HEAD = HeadConfig(hidden_size=8, width=4, routing_layers=1, layers=1, heads=2, feedforward=8)


def expected_t(temps: dict[str, float], kind: str, n: int) -> float:
    """llama-server's lookup: <type>.<bucket>, then <type>, then 1.0."""
    bucket_key = f"{kind}.{BUCKET_OF[n]}"
    if bucket_key in temps:
        return temps[bucket_key]
    return temps.get(kind, 1.0)


def exact_softmax(z, t: float) -> list[float]:
    """softmax((z - max z) / T) in Python floats (double), term by term."""
    top = max(float(v) for v in z)
    e = [math.exp((float(v) - top) / t) for v in z]
    return [v / sum(e) for v in e]


def request_with(sizes: dict[str, list[int]]) -> dict:
    """One question per (type, option count): choice options named o0.., score levels l0..; noul has 2."""
    questions = {}
    for kind, ns in sizes.items():
        for n in ns:
            if kind == "choice":
                criteria = {f"o{i:03d}": f"option {i}" for i in range(n)}
            elif kind == "score":
                criteria = [f"level {i}" for i in range(n)]
            else:
                criteria = None
            questions[f"{kind}{n}"] = {"type": kind, "criteria": criteria}
    return {"model": "m", "state": "s", "questions": questions}


ALL_SIZES = {"noul": [2], "choice": list(BUCKET_OF), "score": SCORE_SIZES}


def logits_for(request: dict, seed: int) -> tuple[np.ndarray, np.ndarray, list]:
    parsed = parse_request(request)
    counts = [len(q.options) for q in parsed.questions]
    rng = np.random.default_rng(seed)
    logits = (rng.standard_normal(sum(counts)) * 3).astype(np.float32)  # the head's logits are float32
    offsets = np.cumsum([0] + counts[:-1])
    return logits, offsets, parsed


@pytest.mark.parametrize("t", [0.05, 0.64, 1.0, 1.7, 40.0])
def test_softmax64_is_softmax_of_z_over_t_in_double(t):
    z = (np.random.default_rng(int(t * 100)).standard_normal(37) * 4).astype(np.float32)
    np.testing.assert_allclose(softmax64(z, t), exact_softmax(z, t), rtol=1e-13, atol=0)


@pytest.mark.parametrize("temps", [{}, TYPE_T, {f"{k}.{b}": t for k in TYPE_T for b, t in BUCKET_T.items()},
                                   BOTH, {"choice.3_5": 0.4, "score": 1.9, "score.6_10": 2.5}],
                         ids=["none", "types", "buckets", "both", "some"])
def test_every_question_gets_its_buckets_temperature(temps):
    """The unrounded probabilities of every question size, compared with softmax(z / T) at llama-server's T."""
    request = request_with(ALL_SIZES)
    logits, offsets, parsed = logits_for(request, seed=len(temps))
    got = probabilities(parsed, logits, offsets, AnswerOptions(temperature=temps))
    for q, start, p in zip(parsed.questions, offsets, got, strict=True):
        n = len(q.options)
        t = expected_t(temps, q.type, n)
        assert AnswerOptions(temperature=temps).temperature_for(q.type, n) == t, (q.id, n)
        np.testing.assert_allclose(p, exact_softmax(logits[start:start + n], t), rtol=1e-12, atol=0,
                                   err_msg=f"{q.id}: T = {t}")


@pytest.mark.parametrize("n, bucket", BUCKET_OF.items())
def test_the_bucket_key_wins_over_the_type_key_at_each_size(n, bucket):
    options = AnswerOptions(temperature={"choice": 0.7, f"choice.{bucket}": 0.3})
    assert options.temperature_for("choice", n) == 0.3
    others = {b for b in BUCKET_T if b != bucket}  # a neighbouring bucket's key is not this size's
    assert AnswerOptions(temperature={"choice": 0.7} | {f"choice.{b}": 0.3 for b in others}
                         ).temperature_for("choice", n) == 0.7
    assert AnswerOptions(temperature={f"score.{bucket}": 0.3, "noul": 0.2}).temperature_for("choice", n) == 1.0


def test_answers_carry_the_tempered_probabilities():
    """What is served (rounded to 4 decimals) is softmax(z / T), not z / T^2 or z * T."""
    request = request_with({"noul": [2], "choice": [3, 6], "score": [4, 10]})
    logits, offsets, parsed = logits_for(request, seed=3)
    temps = {"noul": 0.5, "choice.3_5": 0.3, "choice": 2.0, "score": 0.45, "score.6_10": 4.0}
    served = systemone_answers(answers(parsed, logits, offsets, AnswerOptions(temperature=temps)))
    for q, start in zip(parsed.questions, offsets):
        n = len(q.options)
        p = exact_softmax(logits[start:start + n], expected_t(temps, q.type, n))
        a = served[q.id]
        got = [a["noul"], 1 - a["noul"]] if q.type == "noul" else [a["probabilities"][k] for k, _ in q.options]
        assert max(abs(g - w) for g, w in zip(got, p)) <= 5e-5 + 1e-12, q.id


# --- every field of an answer, from probabilities given in prompt order -------------------------

def question(body: dict):
    return parse_request({"model": "m", "state": "s", "questions": {"q": body}}).questions[0]


def answer(q, p: np.ndarray, confidence: str) -> dict:
    """The typed answer in System One's shape, as Jev's and Workers AI's doors serve it."""
    return systemone_answer(typed_answer(q, p, confidence))


def test_noul_answer():
    q = question({"type": "noul"})
    assert typed_answer(q, np.array([0.83337, 0.16663]), "reference") == NoulAnswer("q", 0.8334)
    assert answer(q, np.array([0.83337, 0.16663]), "reference") == {"type": "noul", "noul": 0.8334}


def test_choice_answer_in_request_order_with_reference_and_jev_confidence():
    q = question({"type": "choice", "criteria": {"zeta": "z", "alpha": "a", "mid": None}})
    assert [k for k, _ in q.options] == ["alpha", "mid", "zeta"]  # prompt order: by code point
    p = np.array([0.1, 0.3, 0.6])  # alpha, mid, zeta
    assert answer(q, p, "reference") == {"type": "choice", "choice": "zeta", "confidence": 0.6,
                                         "probabilities": {"zeta": 0.6, "alpha": 0.1, "mid": 0.3}}
    # TypeSafe: (p_max - 1/n) / (1 - 1/n) = (0.6 - 1/3) / (2/3) = 0.4
    assert answer(q, p, "jev")["confidence"] == 0.4
    # a tie goes to the first of the request's order (zeta before mid), as the reference's argmax does
    assert answer(q, np.array([0.2, 0.4, 0.4]), "reference")["choice"] == "zeta"


def test_choice_options_are_prompted_in_code_point_order_and_answered_in_the_requests():
    """The reference sorts a choice's criteria by code point (digits, capitals, small letters, then the rest),
    whatever the request's order; the answer lists them as the request did."""
    keys = ["b", "é", "B", "a", "10", "Z", "9"]
    q = question({"type": "choice", "criteria": dict.fromkeys(keys)})
    assert [k for k, _ in q.options] == ["10", "9", "B", "Z", "a", "b", "é"]
    assert list(answer(q, np.full(7, 1 / 7), "reference")["probabilities"]) == keys


def test_score_answer_expected_level_and_confidences():
    q = question({"type": "score", "criteria": ["bad", "fair", "good", "great"]})
    p = np.array([0.05, 0.15, 0.6, 0.2])
    # score = 0*0.05 + 1*0.15 + 2*0.6 + 3*0.2 = 1.95; reference confidence = max p = 0.6
    assert answer(q, p, "reference") == {
        "type": "score", "score": 1.95, "confidence": 0.6,
        "legend": {"0": "bad", "1": "fair", "2": "good", "3": "great"},
        "probabilities": {"0": 0.05, "1": 0.15, "2": 0.6, "3": 0.2}}
    assert typed_answer(q, p, "reference") == ScoreAnswer(
        "q", 1.95, 0.6, (("0", "bad"), ("1", "fair"), ("2", "good"), ("3", "great")),
        (("0", 0.05), ("1", 0.15), ("2", 0.6), ("3", 0.2)))
    # TypeSafe: mode 2, D = mean |i - 1.5| = 1, sum p_i |i - 2| = 0.1 + 0.15 + 0.2 = 0.45 -> 1 - 0.45 = 0.55
    assert answer(q, p, "jev")["confidence"] == 0.55
    # spread over both ends: 1 - (0.5 * 3) / 1 < 0 -> 0
    assert answer(q, np.array([0.5, 0.0, 0.0, 0.5]), "jev")["confidence"] == 0.0


# --- the keys: models.toml, a clef GGUF, and the two merged ---------------------------------------

def registry_temperatures(tmp_path, value: str) -> AnswerOptions:
    toml = tmp_path / "models.toml"
    toml.write_text(f'[models.m]\ngguf = "m.gguf"\nhead = "h.safetensors"\ntemperature = {value}\n')
    return load_registry(toml).models["m"].answer


def toml_table(temps: dict[str, float]) -> str:
    return "{" + ", ".join(f'"{k}" = {v}' for k, v in temps.items()) + "}"


def test_models_toml_keys_follow_llama_servers_lookup(tmp_path):
    options = registry_temperatures(tmp_path, toml_table(BOTH))
    assert options.temperature == BOTH
    for kind in TYPE_T:
        for n in (SCORE_SIZES if kind == "score" else [2] if kind == "noul" else BUCKET_OF):
            assert options.temperature_for(kind, n) == expected_t(BOTH, kind, n)
    one = registry_temperatures(tmp_path, "0.64")  # a number: every type, no bucket
    assert one.temperature == {"noul": 0.64, "choice": 0.64, "score": 0.64}


@pytest.mark.parametrize("name", ["choice.4", "choice.3-5", "choice.12", "choice.6_11", "rank.2", "choice.2.x"])
def test_a_bucket_llama_server_never_looks_up_is_refused(tmp_path, name):
    with pytest.raises(RegistryError, match="unknown question type"):
        registry_temperatures(tmp_path, toml_table({name: 0.5}))
    with pytest.raises(ValueError, match="bucket one of 2, 3_5, 6_10, 11"):
        temperature_key(name)


def test_gguf_keys_follow_llama_servers_lookup(tmp_path):
    written = {"choice": 0.7, "choice.3_5": 0.4, "choice.11": 3.5, "score.6_10": 2.5, "noul.2": 0.3}
    path = write_clef(tmp_path / "t.clef.gguf", random_state_dict(TINY_HEAD), vars(TINY_HEAD),
                      temperatures=written | {"choice.4": 0.01})  # no such bucket: llama-server never reads it
    read = read_embedded_head(path).temperatures
    assert read == pytest.approx(written, rel=1e-7)  # stored as float32
    options = AnswerOptions(temperature=read)
    for kind, sizes in ALL_SIZES.items():
        for n in sizes:
            assert options.temperature_for(kind, n) == pytest.approx(expected_t(written, kind, n), rel=1e-7), (kind, n)
    assert options.temperature_for("choice", 4) == pytest.approx(0.4)  # "choice.4" was not taken as 4 options


@pytest.mark.parametrize("gguf, toml, kind, n, want", [
    ({"choice": 0.5}, {}, "choice", 3, 0.5),  # the GGUF's key when models.toml has none
    ({"choice": 0.5}, {"choice": 0.8}, "choice", 3, 0.8),  # models.toml wins key by key
    ({"choice.3_5": 0.5}, {"choice": 0.8}, "choice", 5, 0.5),  # a bucket key wins, whichever side it came from
    ({"choice.3_5": 0.5}, {"choice": 0.8}, "choice", 6, 0.8),  # ... only in its bucket
    ({"choice": 0.5}, {"choice.3_5": 0.8}, "choice", 3, 0.8),
    ({"choice": 0.5}, {"choice.3_5": 0.8}, "choice", 6, 0.5),
    ({"choice.6_10": 0.5}, {"choice.6_10": 0.8}, "choice", 10, 0.8),
    ({"score": 2.0}, {"noul": 0.8}, "noul", 2, 0.8),
    ({"score": 2.0}, {"noul": 0.8}, "score", 2, 2.0),
    ({}, {}, "score", 10, 1.0),
])
def test_models_toml_over_the_gguf_key_by_key(gguf, toml, kind, n, want):
    merged = answer_options(AnswerOptions(temperature=toml, confidence="jev"), gguf)
    assert merged.temperature_for(kind, n) == want
    assert merged.confidence == "jev" and merged.temperature == gguf | toml
