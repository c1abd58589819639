"""llama.cpp's `clef` GGUFs in the product: served as they are (equal to Cloudflare's reference), checked,
split and joined from the command line, planned by fit, compared by drift."""

from __future__ import annotations

import json
import logging
import shutil

import numpy as np
import pytest
from clef_bridge.bridge.config.registry import load_registry
from clef_bridge.bridge.gguf.clef_head import read_embedded_head
from clef_bridge.head.config import HeadConfig, config_path_for
from clef_bridge.head.schema import parse_request
from clef_bridge.head.weights import load_state_dict
from clef_bridge.tools.cli import main

from . import fixturegen_clef
from .fixturegen_clef import Damage
from .reference import assert_same_answers
from .serverkit import RunningServer
from .test_end_to_end import F32_TOLERANCE, REQUESTS, oracle, reference_probabilities  # noqa: F401 - fixture

pytestmark = pytest.mark.slow

ROUNDING = 5e-5  # answers carry 4 decimals


@pytest.fixture(scope="module")
def clef_fx(fx):
    return fixturegen_clef.build(fx)


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("CLEF_BRIDGE_CACHE", str(tmp_path / "cache"))
    return tmp_path / "cache"


def served_probabilities(request: dict, answers: dict) -> list[np.ndarray]:
    """The served answers' probabilities in prompt order, question by question."""
    out = []
    for q in parse_request(request).questions:
        a = answers[q.id]
        out.append(np.array([a["noul"], 1 - a["noul"]]) if q.type == "noul" else
                   np.array([a["probabilities"][oid] for oid, _ in q.options]))
    return out


def test_a_clef_gguf_is_served_as_it_is(oracle, clef_fx, tmp_path, cache, caplog):  # noqa: F811
    toml = tmp_path / "models.toml"
    toml.write_text(f'[models.clef-tiny]\ngguf = "{clef_fx.f32}"\nn_ctx = 8192\nmax_length = 8192\n')
    caplog.set_level(logging.INFO, logger="clef_bridge")
    with RunningServer(load_registry(toml)) as srv:
        worst = 0.0
        for request in REQUESTS[::3]:
            reply = srv.post({**request, "model": "clef-tiny"})
            assert reply.status == 200, reply.body
            ref_encoded, ref_probs = reference_probabilities(oracle, request)
            assert reply.json()["usage"]["input_tokens"] == len(ref_encoded.input_ids)
            for p, rp in zip(served_probabilities(request, reply.json()["answers"]), ref_probs):
                worst = max(worst, float(np.abs(p - rp).max()))
            expected = oracle.ref.systemone(oracle.model, oracle.processor, request, max_length=8192)
            assert_same_answers(reply.json()["answers"], expected["answers"], F32_TOLERANCE)  # every field
        [model] = srv.request("GET", "/v1/models").json()["models"]
    print(f"clef GGUF served: max |p diff| vs the reference {worst:.2e}")
    assert worst <= F32_TOLERANCE + ROUNDING
    assert any("wrote the qwen35 backbone of tiny-f32.clef.gguf" in r.message for r in caplog.records)
    assert len(list((cache / "backbones").glob("*.qwen35.gguf"))) == 1
    assert [w.split(":")[0] for w in model.get("x_warnings", [])] == ["pair.no_record"]
    caplog.clear()
    with RunningServer(load_registry(toml)):
        pass
    assert any("converted earlier" in r.message for r in caplog.records)  # reused, not written again


def test_check_reports_the_embedded_head(capsys, clef_fx):
    assert main(["check", str(clef_fx.q8_0), "--json"]) == 0
    [report] = json.loads(capsys.readouterr().out)["reports"]
    assert report["accepted"] and report["facts"]["head_source"] == "embedded"
    assert report["facts"]["head_matrices"] == "Q8_0" and report["facts"]["architecture"] == "clef"
    assert "pair.headless" not in {f["code"] for f in report["findings"]}


@pytest.mark.parametrize("damage, code, name", [
    (Damage(drop="decision.scorer.weight"), "clef.tensor_missing", "decision.scorer.weight"),
    (Damage(reshape="dec.blk.1.cross_attn_q.weight"), "clef.tensor_shape", "dec.blk.1.cross_attn_q.weight"),
    (Damage(key_type="clef.decision.head_count"), "clef.key_type", "clef.decision.head_count"),
])
def test_check_refuses_a_damaged_clef_gguf_naming_what(capsys, fx, tmp_path, damage, code, name):
    cfg = json.loads(config_path_for(fx.head).read_text())
    flat = load_state_dict(fx.head, HeadConfig(**cfg))
    path = fixturegen_clef.write_clef(tmp_path / "damaged.clef.gguf", flat, cfg, backbone=fx.gguf_f32, damage=damage)
    assert main(["check", str(path), "--json"]) == 1
    [report] = json.loads(capsys.readouterr().out)["reports"]
    assert any(f["code"] == code and name in f["message"] and f["fix"] for f in report["findings"])


def test_a_qwen35_gguf_without_head_names_where_heads_come_from(capsys, fx, tmp_path):
    shutil.copy(fx.gguf_f32, tmp_path / "lonely.gguf")
    assert main(["check", str(tmp_path / "lonely.gguf")]) == 1
    out = capsys.readouterr().out
    assert "pair.headless" in out and "ggml-org/Clef-Flash-GGUF" in out and "Cloudflare/clef-flash" in out


def test_split_then_join_from_the_command_line(capsys, clef_fx, fx, tmp_path, cache):
    out = tmp_path / "release"
    assert main(["split", str(clef_fx.f32), "-o", str(out), "--json"]) == 0
    done = json.loads(capsys.readouterr().out)
    assert done["head_dtype"] == "F32" and done["pair"]["report"]["accepted"]
    backbone = out / "tiny-f32.clef.backbone.gguf"
    assert (out / "tiny-f32.clef.backbone.pair.json").is_file()
    assert main(["check", str(backbone), "--json"]) == 0  # head beside it, checked against the written record
    facts = json.loads(capsys.readouterr().out)["reports"][0]["facts"]
    assert facts["canary_state_drift"] == 0 and facts["head_source"] == "safetensors"
    joined = tmp_path / "joined.clef.gguf"
    assert main(["join", str(backbone), str(out / "joint_head.safetensors"), "-o", str(joined), "--head-dtype",
                 "q8_0", "--temperature", "choice=0.64,score.3_5=0.8"]) == 0
    capsys.readouterr()
    assert read_embedded_head(joined).temperatures == pytest.approx({"choice": 0.64, "score.3_5": 0.8})  # float32
    assert main(["check", str(joined)]) == 0


def test_join_takes_temperatures_from_calibration(capsys, fx, tmp_path):
    calibration = tmp_path / "cal.json"
    calibration.write_text(json.dumps({"model": "tiny", "temperatures": {"noul": 1.0, "choice": 0.7, "score": 1.2}}))
    joined = tmp_path / "joined.clef.gguf"
    assert main(["join", str(fx.gguf_f32), str(fx.head), "-o", str(joined), "--from-calibration",
                 str(calibration), "--temperature", "score=0.9"]) == 0
    assert read_embedded_head(joined).temperatures == pytest.approx({"noul": 1.0, "choice": 0.7, "score": 0.9})
    assert main(["join", str(fx.gguf_f32), str(fx.head), "-o", str(tmp_path / "x.gguf"), "--temperature", "hot"]) == 2
    assert "not a number" in capsys.readouterr().err


def test_a_clef_gguf_temperature_is_served_and_models_toml_wins(fx, tmp_path, cache):
    joined = tmp_path / "warm.clef.gguf"
    assert main(["join", str(fx.gguf_f32), str(fx.head), "-o", str(joined), "--temperature", "noul=4"]) == 0
    request = {"model": "m", "state": "temperature", "questions": {"q": {"type": "noul"}}}
    answers = {}
    for label, extra in (("gguf", ""), ("toml", "temperature = {noul = 1.0}\n")):
        toml = tmp_path / f"{label}.toml"
        toml.write_text(f'[models.m]\ngguf = "{joined}"\n{extra}')
        with RunningServer(load_registry(toml)) as srv:
            answers[label] = srv.post(request).json()["answers"]["q"]["noul"]
    plain = tmp_path / "plain.toml"
    plain.write_text(f'[models.m]\ngguf = "{fx.gguf_f32}"\nhead = "{fx.head}"\n')
    with RunningServer(load_registry(plain)) as srv:
        base = srv.post(request).json()["answers"]["q"]["noul"]
    assert answers["toml"] == base and abs(answers["gguf"] - 0.5) < abs(base - 0.5)  # T = 4 flattens


def test_fit_reads_the_embedded_head_and_leaves_it_out_of_llama_cpp(capsys, clef_fx, fx):
    assert main(["fit", str(clef_fx.f32), "--vram", "8GiB", "--json"]) == 0
    clef = json.loads(capsys.readouterr().out)
    assert main(["fit", str(fx.gguf_f32), "--vram", "8GiB", "--json"]) == 0
    plain = json.loads(capsys.readouterr().out)
    assert clef["weights_bytes"] == plain["weights_bytes"]  # head tensors are not llama.cpp's
    assert "embedded" in clef["head_source"] and clef["head_bytes_float32"] < 1e6


def test_drift_between_two_clef_ggufs(capsys, clef_fx, tmp_path, cache):
    data = tmp_path / "probes.jsonl"
    data.write_text("".join(json.dumps({"request": r}) + "\n" for r in REQUESTS[:4]))
    assert main(["drift", str(clef_fx.f32), str(clef_fx.q8_0), "--data", str(data), "--json"]) == 0
    result = json.loads(capsys.readouterr().out)
    assert result["requests"] == 4 and 0 < result["all"]["max_abs_dp"] < 0.1
