"""Bad input to every command ends in one line that names the cause and a fix, never a traceback."""

from __future__ import annotations

import numpy as np
import pytest
from clef_bridge.tools.cli import main
from gguf import GGMLQuantizationType, GGUFWriter

pytestmark = pytest.mark.integration


@pytest.fixture
def keyless_gguf(tmp_path):
    """A qwen35 GGUF whose metadata lacks block_count and the layer pattern."""
    path = tmp_path / "keyless.gguf"
    writer = GGUFWriter(str(path), "qwen35")
    writer.add_uint32("qwen35.embedding_length", 64)
    writer.add_tensor("output.weight", np.zeros((8, 64), np.float32), raw_dtype=GGMLQuantizationType.F32)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def run(capsys, *argv: str) -> tuple[int, str]:
    """Exit code and everything printed (reports go to stdout, errors to stderr)."""
    code = main(list(argv))
    printed = capsys.readouterr()
    return code, printed.out + printed.err


def test_fit_on_a_gguf_missing_keys(capsys, keyless_gguf):
    code, err = run(capsys, "fit", str(keyless_gguf), "--vram", "8GiB")
    assert code == 2 and "qwen35.block_count" in err and "fix:" in err and "Traceback" not in err


def test_calibrate_with_a_malformed_file(capsys, tmp_path, fx):
    data = tmp_path / "bad.jsonl"
    data.write_text('{"request": {"model": "m"}}\nnot json\n')
    toml = tmp_path / "models.toml"
    toml.write_text(f'[models.tiny]\ngguf = "{fx.gguf_f32}"\nhead = "{fx.head}"\n')
    code, err = run(capsys, "calibrate", "--data", str(data), "--models", str(toml), "--model", "tiny")
    assert code == 2 and "line 1: invalid request" in err and "line 2: not JSON" in err


@pytest.mark.parametrize("argv, fragment", [
    (["check", "{tmp}/nothing.gguf"], "gguf.missing"),
    (["decide", "--models", "{tmp}/none.toml", "{tmp}/request.json"], "cannot read"),
    (["eval", "--data", "{tmp}/none.jsonl", "--url", "http://127.0.0.1:9"], "cannot read"),
    (["split", "{gguf}", "-o", "{tmp}/out"], "split takes a clef GGUF"),
    (["join", "{gguf}", "{tmp}/joint_head.safetensors", "-o", "{tmp}/x.gguf"], "joint_head_config.json"),
    (["drift", "{tmp}/a.gguf", "{gguf}"], "a.gguf"),
    (["serve", "--models", "{tmp}/none.toml"], "not found"),
    (["serve", "--models", "{gguf}"], "clef-bridge serve"),  # a GGUF given as models.toml: the fix, not utf-8
    (["serve", "{gguf}", "--models", "{tmp}/none.toml"], "not both"),
    (["serve", "--head", "{gguf}"], "go with a GGUF"),
    (["fit", "--arch", "clef-flash", "--vram", "lots"], "cannot read the size"),
])
def test_commands_explain_their_failures(capsys, tmp_path, fx, argv, fragment):
    argv = [a.format(tmp=tmp_path, gguf=fx.gguf_f32) for a in argv]
    code, err = run(capsys, *argv)
    assert code in (1, 2) and fragment in err and "Traceback" not in err, err
    assert "pair.headless" not in err  # a missing or foreign file is not called headless


def test_join_creates_its_folder_as_split_does_and_both_refusals_name_overwrite(capsys, tmp_path, fx):
    joined = tmp_path / "new" / "deeper" / "joined.clef.gguf"
    join = ["join", str(fx.gguf_f32), str(fx.head), "-o", str(joined)]
    code, err = run(capsys, *join)
    assert code == 0 and joined.is_file(), err
    split = ["split", str(joined), "-o", str(tmp_path / "also" / "new")]
    code, err = run(capsys, *split)
    assert code == 0, err
    for argv in (join, split):  # a second time: the files are there
        code, err = run(capsys, *argv)
        assert code == 2 and "already exist" in err and "--overwrite" in err and "Traceback" not in err, err
        code, err = run(capsys, *argv, "--overwrite")
        assert code == 0, err


def test_soak_names_the_threshold_that_failed():
    from benchmarks.render import text
    from benchmarks.soak import judge

    summary = {"requests": 100, "errors": 0, "rss_growth_pct": 7.5, "p99_last_over_first": 1.05}
    verdict = judge(summary)
    assert not verdict.ok and "RSS grew 7.5% after warm-up (threshold: < 5.0%)" in verdict.verdict
    assert text(verdict).splitlines()[-1].startswith("soak: FAIL: RSS grew 7.5%")
    assert judge({**summary, "rss_growth_pct": 1.0}).verdict == "PASS"


def test_calibrate_declines_little_data_and_says_why():
    from clef_bridge.tools.calibrate import MIN_ITEMS, calibrate_items

    rng = np.random.default_rng(0)
    items = [(rng.normal(size=3).astype(np.float32), int(rng.integers(3))) for _ in range(3)]
    result = calibrate_items("choice", items)
    assert not result.accepted and result.temperature == 1.0
    assert f"too little data: 3 labelled choice decisions, at least {MIN_ITEMS}" in result.reason


def test_fit_counts_the_head_that_lies_beside_the_gguf(capsys, tmp_path):
    import json

    from clef_bridge.bridge.demo.builtins import make_demo

    demo = make_demo(tmp_path / "demo")
    assert main(["fit", str(demo.gguf), "--vram", "8GiB", "--json"]) == 0
    plan = json.loads(capsys.readouterr().out)
    assert plan["head_bytes_float32"] < 2**20 < demo.head.stat().st_size * 8  # its real size, not Clef-flash's
    assert plan["head_source"].endswith("joint_head.safetensors")
