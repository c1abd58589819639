"""An adapter for another base is refused at load naming both; a head trained with an adapter is paired with that
adapter (`check` and `pair` take --lora); `check --json` lists the adapter's rank, targets and base."""

from __future__ import annotations

import json

import pytest
from clef_bridge.bridge.config.integrity import ModelRefused
from clef_bridge.bridge.model.loading import load_checked
from clef_bridge.tools.checks import check_files, pair_files
from clef_bridge.tools.cli import main

from . import fixturegen_lora
from .conftest import tiny_spec
from .test_lora import copy_adapter

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def lfx():
    return fixturegen_lora.build()


def codes(report) -> set[str]:
    return {f.code for f in report.findings if f.level == "error"}


def test_check_json_lists_the_adapter(lfx, capsys):
    fx = lfx.base
    code = main(["check", str(fx.gguf_f32), "--head", str(lfx.head("claims")), "--lora",
                 str(lfx.checkpoints["claims"]), "--json"])
    lora = json.loads(capsys.readouterr().out)["reports"][0]["facts"]["lora"]
    assert code == 0 and lora["rank"] == 8 and lora["alpha"] == 16 and lora["modules"] == 31
    assert "linear_attn.in_proj_qkv" in lora["targets"] and lora["base"].endswith("tiny-hf")


def test_an_adapter_naming_another_release_is_refused_naming_both(lfx, tmp_path):
    folder = copy_adapter(lfx, tmp_path, config={"base_model_name_or_path": "someone/other-model"})
    report = check_files(lfx.base.gguf_f32, lfx.head("claims"), None, lora=folder).reports[0][1]
    assert codes(report) == {"lora.base_name"}
    message = next(f.message for f in report.findings if f.code == "lora.base_name")
    assert "someone/other-model" in message and "tiny-f32.gguf" in message and "Tiny Hf" in message


def test_an_adapter_of_other_shapes_is_refused_at_load(lfx, tmp_path):
    import numpy as np

    key = "base_model.model.model.language_model.layers.3.self_attn.k_proj.lora_B.weight"
    folder = copy_adapter(lfx, tmp_path, tensors=lambda t: t | {key: np.ones((48, 8), np.float32)})
    with pytest.raises(ModelRefused) as refused:
        load_checked(tiny_spec(lfx.base, head=lfx.head("claims"), lora=folder))
    assert codes(refused.value.report) == {"lora.base_mismatch"}
    assert "self_attn.k_proj" in str(refused.value) and "tiny-f32.gguf" in str(refused.value)


def test_a_head_is_paired_with_its_adapter(lfx, tmp_path):
    fx, record = lfx.base, tmp_path / "claims.pair.json"
    made = pair_files(fx.gguf_f32, lfx.head("claims"), record, lora=lfx.checkpoints["claims"])
    assert made.ok and "lora_sha256" in json.loads(record.read_text())
    assert check_files(fx.gguf_f32, lfx.head("claims"), record, lora=lfx.checkpoints["claims"]).ok  # canaries too
    other = check_files(fx.gguf_f32, lfx.head("claims"), record, lora=lfx.checkpoints["routing"]).reports[0][1]
    assert "pair.lora_changed" in codes(other)
    bare = check_files(fx.gguf_f32, lfx.head("claims"), record).reports[0][1]
    assert "pair.lora_missing" in codes(bare)


def test_checks_fix_for_a_missing_record_pairs_with_the_adapter(lfx, tmp_path):
    """The pair.no_record fix of a check with --lora names the adapter: the record it writes is the fine-tune's (beside
    the adapter), which the same check then finds; without --lora it would be the base's, and the warning would stay."""
    import shlex
    import shutil

    folder = tmp_path / "claims"
    shutil.copytree(lfx.checkpoints["claims"], folder)
    report = check_files(lfx.base.gguf_f32, folder / "joint_head.safetensors", None, lora=folder).reports[0][1]
    fix = next(f.fix for f in report.findings if f.code == "pair.no_record")
    command = shlex.split(fix.split("`")[1])
    assert command[:2] == ["clef-bridge", "pair"] and command[-2:] == ["--lora", str(folder)]
    assert main(command[1:]) == 0
    again = check_files(lfx.base.gguf_f32, folder / "joint_head.safetensors", None, lora=folder).reports[0][1]
    assert "pair.no_record" not in {f.code for f in again.findings}
