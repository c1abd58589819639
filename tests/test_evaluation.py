"""Metrics against hand-computed values, temperature fitting on synthetic models, eval over HTTP,
calibrate --write, and drift against a direct computation."""

from __future__ import annotations

import json
import math
import tomllib

import numpy as np
import pytest
from clef_bridge.bridge.config.registry import load_registry
from clef_bridge.bridge.service.local import LocalService
from clef_bridge.head.answer import softmax64 as softmax
from clef_bridge.tools.calibrate import calibrate_items
from clef_bridge.tools.cli import main
from clef_bridge.tools.drift import drift, probe_requests
from clef_bridge.tools.evaldata import DataError, load_examples
from clef_bridge.tools.scoring import (
    Decision,
    accuracy,
    brier,
    coverage_at_precision,
    ece,
    macro_f1,
    nll,
    score_errors,
    temperature_scaled,
)

from .conftest import open_spec, tiny_spec
from .deciding import prepare
from .serverkit import RunningServer, registry_for

pytestmark = pytest.mark.slow


def D(p, gold):
    return Decision(np.array(p, dtype=float), gold)


CASES = [D([0.9, 0.1], 0), D([0.9, 0.1], 1), D([0.6, 0.4], 0), D([0.45, 0.55], 0)]


def test_ece_with_empty_bins():
    # bins (15 wide): 0.9 -> 13 (one right, one wrong), 0.6 -> 9 (right), 0.55 -> 8 (wrong)
    assert ece(CASES) == pytest.approx(2 / 4 * abs(0.5 - 0.9) + 1 / 4 * abs(1 - 0.6) + 1 / 4 * abs(0 - 0.55))
    assert ece([D([1.0, 0.0], 0)]) == pytest.approx(0.0)  # a confidence of 1.0 lands in the last bin
    assert math.isnan(ece([]))


def test_ties_take_the_first_option():
    tie = D([0.5, 0.5], 1)
    assert tie.predicted == 0 and not tie.correct and tie.confidence == 0.5
    assert accuracy([tie, D([0.5, 0.5], 0)]) == 0.5


def test_brier_and_nll():
    assert brier(CASES) == pytest.approx((0.02 + 1.62 + 0.32 + 0.605) / 4)
    assert nll(CASES) == pytest.approx(-(math.log(0.9) + math.log(0.1) + math.log(0.6) + math.log(0.45)) / 4)
    assert nll([D([1.0, 0.0], 1)]) == pytest.approx(-math.log(1e-12))  # clipped, never infinite


def test_macro_f1():
    ds = [D([0.8, 0.1, 0.1], 0), D([0.8, 0.1, 0.1], 1), D([0.1, 0.8, 0.1], 1), D([0.1, 0.1, 0.8], 0)]
    # class 0: tp 1, fp 1, fn 1 -> 0.5; class 1: tp 1, fp 0, fn 1 -> 2/3; class 2: tp 0 -> 0
    assert macro_f1(ds) == pytest.approx((0.5 + 2 / 3 + 0.0) / 3)


def test_score_errors():
    ds = [D([0.1, 0.8, 0.1], 1), D([0.7, 0.2, 0.1], 2), D([0.0, 0.3, 0.7], 1)]
    out = score_errors(ds)
    assert out["exact"] == pytest.approx(1 / 3) and out["within_one"] == pytest.approx(2 / 3)
    assert out["mae"] == pytest.approx((abs(1.0 - 1) + abs(0.4 - 2) + abs(1.7 - 1)) / 3)


def test_coverage_at_precision():
    ds = [D([0.99, 0.01], 0), D([0.95, 0.05], 0), D([0.9, 0.1], 0), D([0.9, 0.1], 1), D([0.7, 0.3], 0)]
    c95 = coverage_at_precision(ds, 0.95)
    assert c95.coverage == pytest.approx(0.4) and c95.threshold == pytest.approx(0.95)
    # at 0.9 the two tied decisions come in together: 3 of 4 right = 0.75
    c70 = coverage_at_precision(ds, 0.75)
    assert c70.coverage == pytest.approx(1.0) and c70.precision == pytest.approx(0.8)
    assert coverage_at_precision([D([0.6, 0.4], 1)], 0.95).threshold is None


def _synthetic(factor: float, n: int = 800, seed: int = 0):
    rng = np.random.default_rng(seed)
    items = []
    for _ in range(n):
        true = rng.normal(0, 1.5, size=4)
        gold = int(rng.choice(4, p=softmax(true)))
        items.append((true * factor, gold))
    return items


def test_calibration_recovers_the_factor():
    result = calibrate_items("choice", _synthetic(2.5))
    assert result.fitted == pytest.approx(2.5, rel=0.10)
    assert result.accepted and result.heldout_nll_fitted < result.heldout_nll_current
    assert result.after["ece"] < result.before["ece"] and result.after["nll"] < result.before["nll"]
    assert result.iqr[0] <= result.fitted <= result.iqr[1]


def test_a_calibrated_model_keeps_its_temperature():
    result = calibrate_items("noul", _synthetic(1.0, seed=1))
    assert result.temperature == pytest.approx(1.0, rel=0.10)


def test_scaling_never_changes_an_argmax():
    rng = np.random.default_rng(3)
    for _ in range(200):
        z = rng.normal(0, 3, size=rng.integers(2, 12))
        assert temperature_scaled(z, float(rng.uniform(0.05, 20))).argmax() == z.argmax()


def _labelled(tmp_path, fx):
    lines = []
    for i in range(12):
        request = {"model": "tiny", "state": f"Ticket {i}: the {'printer' if i % 2 else 'invoice'} is broken.",
                   "questions": {"team": {"type": "choice", "instructions": "Which team?",
                                          "criteria": {"it": "IT", "billing": "Billing", "sales": None}},
                                 "urgent": {"type": "noul", "instructions": "Urgent?"},
                                 "severity": {"type": "score", "criteria": ["low", "mid", "high"]}}}
        labels = {"team": "it" if i % 2 else "billing", "urgent": i % 3 == 0, "severity": i % 3}
        lines.append({"request": request, "labels": labels})
    lines.append({"request": {"model": "tiny", "state": "word " * 9000, "questions": {"q": {"type": "noul"}}},
                  "labels": {"q": True}})  # too long for the model: it fails, and must count as an error
    path = tmp_path / "data.jsonl"
    path.write_text("\n".join(json.dumps(x) for x in lines) + "\n")
    return path


def test_data_errors_name_their_lines(tmp_path):
    path = tmp_path / "bad.jsonl"
    path.write_text('{"request": {"model": "m", "state": "s", "questions": {"q": {"type": "noul"}}}, '
                    '"labels": {"q": "yes"}}\nnot json\n\n{"request": 1, "labels": {}}\n'
                    '{"request": {"model": "m", "state": "s", "questions": {"c": {"type": "choice", '
                    '"criteria": {"a": 1}}}}, "labels": {}}\n')
    with pytest.raises(DataError) as info:
        load_examples(path)
    text = str(info.value)
    assert "line 1: label 'q': a noul label must be true or false" in text and "line 2: not JSON" in text
    assert "line 4:" in text and "line 5: invalid request" in text


def test_eval_over_http_counts_every_request(fx, tmp_path, capsys):
    data = _labelled(tmp_path, fx)
    with RunningServer(registry_for(tiny_spec(fx), tmp_path / "m.toml")) as srv:
        code = main(["eval", "--data", str(data), "--url", srv.url, "--out", str(tmp_path / "report")])
    out = capsys.readouterr().out
    assert code == 1  # one request failed
    assert out.splitlines()[2].startswith("**Errors: 1 of 13 requests**")
    report = json.loads((tmp_path / "report" / "report.json").read_text())
    assert report["requests"] == 13 and report["errors"] == 1 and report["error_examples"][0]["line"] == 13
    assert "HTTP 413" in report["error_examples"][0]["error"]
    assert {k: v["n"] for k, v in report["by_type"].items()} == {"choice": 12, "noul": 12, "score": 12}
    assert report["overall"]["n"] == 36 and set(report["by_question"]) == {"team", "urgent", "severity"}
    for m in report["by_type"].values():
        assert 0 <= m["accuracy"] <= 1 and 0 <= m["ece"] <= 1 and set(m["coverage"]) == {"0.95", "0.99"}
    assert "macro_f1" in report["by_type"]["choice"] and "mae" in report["by_type"]["score"]
    assert (tmp_path / "report" / "report.md").read_text().startswith("# Evaluation report")


def test_eval_in_process_equals_http(fx, tmp_path, capsys):
    data = _labelled(tmp_path, fx)
    toml = tmp_path / "models.toml"
    toml.write_text(f'[models.tiny]\ngguf = "{fx.gguf_f32}"\nhead = "{fx.head}"\nn_ctx = 4096\nmax_length = 4096\n')
    assert main(["eval", "--data", str(data), "--models", str(toml), "--model", "tiny", "--out",
                 str(tmp_path / "local")]) == 1
    with RunningServer(registry_for(tiny_spec(fx), tmp_path / "m.toml")) as srv:
        main(["eval", "--data", str(data), "--url", srv.url, "--out", str(tmp_path / "http")])
    capsys.readouterr()
    local = json.loads((tmp_path / "local" / "report.json").read_text())
    http = json.loads((tmp_path / "http" / "report.json").read_text())
    assert local["overall"] == http["overall"] and local["by_type"] == http["by_type"]


def test_calibrate_writes_models_toml(fx, tmp_path, capsys):
    data = _labelled(tmp_path, fx)
    lines = data.read_text().splitlines()[:-1]  # calibration data must all be answerable
    data.write_text("\n".join(lines) + "\n")
    toml = tmp_path / "models.toml"
    toml.write_text(f'default = "tiny"\n\n[models.tiny]\ngguf = "{fx.gguf_f32}"\nhead = "{fx.head}"\n'
                    'n_ctx = 4096\nmax_length = 4096\n')
    assert main(["calibrate", "--data", str(data), "--models", str(toml), "--model", "tiny", "--write"]) == 0
    out = capsys.readouterr().out
    assert "choice:" in out and "held-out NLL" in out and "ECE" in out
    raw = tomllib.loads(toml.read_text())["models"]["tiny"]
    assert set(raw["temperature"]) == {"choice", "noul", "score"}
    assert load_registry(toml).models["tiny"].answer.temperature == {k: float(v) for k, v in raw["temperature"].items()}


def test_drift_refuses_audio_for_a_backbone_without_audio_as_the_server_does(fx, tmp_path, capsys):
    """A drift fix: drift used to answer a request with audio as if it were text (the server answers 422)."""
    import base64

    from .omni_cases import tone, wav

    audio = base64.b64encode(wav(tone(0.5))).decode()
    data = tmp_path / "audio.jsonl"
    data.write_text(json.dumps({"request": {**probe_requests(1)[0], "audio": [audio]}}) + "\n", encoding="utf-8")
    assert main(["drift", str(fx.gguf_f32), str(fx.gguf_q8_0), "--head", str(fx.head), "--data", str(data)]) == 1
    assert "takes no audio" in capsys.readouterr().err


def test_drift_matches_a_direct_computation(fx, capsys):
    requests = probe_requests(8)
    a, b = open_spec(tiny_spec(fx)), open_spec(tiny_spec(fx, gguf=fx.gguf_q8_0))
    try:
        with LocalService(a) as service_a, LocalService(b) as service_b:
            result = drift(service_a.decide, service_b.decide, requests)
        diffs, flips = [], 0
        for request in requests:  # each backbone's full prefill, no prefix cache, no worker
            for (_, za), (_, zb) in zip(a.uncached_logits(prepare(a, request)), b.uncached_logits(prepare(b, request))):
                pa, pb = softmax(za), softmax(zb)
                diffs.append(np.abs(pa - pb))
                flips += int(pa.argmax() != pb.argmax())
    finally:
        a.close()
        b.close()
    everything = np.concatenate(diffs)
    assert result["all"]["decisions"] == len(diffs)
    assert result["all"]["max_abs_dp"] == pytest.approx(everything.max(), abs=1e-6)
    assert result["all"]["mean_abs_dp"] == pytest.approx(everything.mean(), abs=1e-6)
    assert result["all"]["argmax_flips"] == flips
    assert 0 < result["all"]["max_abs_dp"] < 0.05  # Q8_0 moves the tiny model's answers a little
    assert main(["drift", str(fx.gguf_f32), str(fx.gguf_q8_0), "--head", str(fx.head), "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["requests"] == len(probe_requests()) == 24 and set(doc) >= {"all", "noul", "choice", "score"}
