"""llama.cpp's `clef` GGUFs: the header reader's one shape, the embedded head read and validated, and
join's output checked against the facts file (transcribed as data in fixturegen_clef) with gguf-py's
GGUFReader, an independent reader."""

from __future__ import annotations

import json

import numpy as np
import pytest
from clef_bridge.bridge.config.integrity import CheckReport
from clef_bridge.bridge.demo.builtins import make_demo
from clef_bridge.bridge.gguf.clef_head import ClefHeadError, read_embedded_head, validate_embedded_head
from clef_bridge.bridge.gguf.clef_split import join
from clef_bridge.bridge.gguf.reader import GGUFError, StringArray, read_gguf, read_strings
from clef_bridge.head.config import HeadConfig, config_path_for
from clef_bridge.head.encoder import encode
from clef_bridge.head.model import joint_schema_head
from clef_bridge.head.schema import parse_request
from clef_bridge.head.weights import load_state_dict, save_state_dict, unflatten
from gguf import GGMLQuantizationType as Q
from gguf import GGUFReader, GGUFValueType
from gguf.quants import dequantize

from . import fixturegen_clef
from .fixturegen import TINY_HEAD
from .fixturegen_clef import FACT_KEYS, FACT_TEMPLATE, FACT_TEMPLATE_TEXT_ONLY, Damage, fact_arrays, fact_dtype, fact_tensors, write_clef
from .randomhead import random_inputs, random_layout, random_state_dict

pytestmark = pytest.mark.integration

# The three scalars travel as exp / sigmoid in float64, stored as F32, and come back through log: within
# a few float32 ulps of the original, not bit-exact (the facts' formula, also what llama-server uses).
SCALARS = ("prior_logit_scale", "joint_logit_scale", "residual_gate")
SCALAR_RTOL = 1e-6
CFG = HeadConfig(**TINY_HEAD)


@pytest.fixture(scope="module")
def clef_fx(fx):
    return fixturegen_clef.build(fx)


@pytest.fixture(scope="module")
def flat(fx):
    return load_state_dict(fx.head, CFG)


@pytest.fixture(scope="module")
def tiny_reader(fx):
    return GGUFReader(fx.gguf_f32)  # gguf-py decodes all 152k vocabulary strings: once per module


@pytest.fixture(scope="module")
def demo(tmp_path_factory):
    """A qwen35 GGUF with a 270-token vocabulary and its head: gguf-py reads it back in milliseconds."""
    return make_demo(tmp_path_factory.mktemp("demo"))


def assert_same_head(ours: dict, ref: dict, atol: float = 0.0, rtol: float = 0.0) -> None:
    assert ours.keys() == ref.keys()
    for name in ref:
        assert ours[name].dtype == np.float32 and ours[name].shape == ref[name].shape, name
        if name in SCALARS:
            np.testing.assert_allclose(ours[name], ref[name], rtol=SCALAR_RTOL, err_msg=name)
        else:
            np.testing.assert_allclose(ours[name], ref[name], rtol=rtol, atol=atol, err_msg=name)


# --- the header reader ----------------------------------------------------------------------------

def test_string_arrays_have_one_shape_and_decode_on_demand(fx, tiny_reader):
    info = read_gguf(fx.gguf_f32)
    reader = tiny_reader
    for key in ("tokenizer.ggml.tokens", "tokenizer.ggml.merges"):
        assert isinstance(info.metadata[key], StringArray)
        assert read_strings(info, key) == reader.fields[key].contents()
    with pytest.raises(GGUFError) as err:
        read_strings(info, "tokenizer.ggml.token_type")
    assert err.value.code == "gguf.key"


def test_every_key_keeps_its_gguf_type(fx, tiny_reader):
    info = read_gguf(fx.gguf_f32)
    reader = tiny_reader
    stored = {k: f for k, f in reader.fields.items() if not k.startswith("GGUF.")}
    assert list(info.fields) == list(stored)
    for key, field in stored.items():
        element = field.types[1] if len(field.types) > 1 else None
        assert (info.fields[key].type, info.fields[key].element_type) == (field.types[0], element), key


# --- reading the embedded head ----------------------------------------------------------------------

@pytest.mark.parametrize("which, atol", [("f32", 0.0), ("q8_0", 4e-3)])
def test_embedded_head_equals_the_safetensors_head(clef_fx, fx, flat, which, atol):
    head = read_embedded_head(getattr(clef_fx, which))
    assert head.config == CFG
    assert head.matrix_type == which.upper() and head.template_matches and not head.warnings
    # Q8_0: each block of 32 keeps max|x| / 127 steps, so at most half a step (|x| <= ~0.5 here) off
    assert_same_head(head.state_dict, flat, atol=atol)


@pytest.mark.parametrize("which, tolerance", [("f32", 1e-5), ("q8_0", 0.05)])
def test_embedded_head_gives_the_safetensors_logits(clef_fx, flat, which, tolerance):
    head = read_embedded_head(getattr(clef_fx, which))
    layout = random_layout(300, [0, 1, 2], [2, 6, 4], seed=4)
    hidden, _, _, rows = random_inputs(CFG, layout, 300, seed=6)
    ours = joint_schema_head(hidden, rows, layout, head.config.heads, **unflatten(head.state_dict))
    ref = joint_schema_head(hidden, rows, layout, CFG.heads, **unflatten(flat))
    assert np.abs(ref).max() > 0.1  # not two near-zero vectors
    assert np.abs(ours - ref).max() <= tolerance


# --- damage: every problem refused by name ------------------------------------------------------------

def _check(path) -> tuple[CheckReport, object]:
    report = CheckReport(str(path), None)
    return report, validate_embedded_head(read_gguf(path), report)


def _errors(report: CheckReport) -> dict[str, list[str]]:
    out: dict[str, list[str]] = {}
    for f in report.findings:
        if f.level == "error":
            assert f.fix, f"{f.code} has no fix"
            out.setdefault(f.code, []).append(f.message)
    return out


def test_the_head_only_file_is_accepted(tmp_path, flat):
    report, head = _check(write_clef(tmp_path / "ok.gguf", flat, TINY_HEAD))
    assert head is not None and report.findings == []


TENSORS = list(fact_tensors(TINY_HEAD))


@pytest.mark.parametrize("damage, code, named", [
    *[(Damage(drop=name), "clef.tensor_missing", name) for name in TENSORS],
    (Damage(extra="dec.blk.2.attn_norm.weight"), "clef.tensor_unexpected", "dec.blk.2.attn_norm.weight"),
    (Damage(extra="decision.proj_extra.weight"), "clef.tensor_unexpected", "decision.proj_extra.weight"),
    *[(Damage(reshape=name), "clef.tensor_shape", name) for name in (
        "decision.proj_memory.weight", "decision.proj_question.weight", "dec.blk.0.ffn_up.weight",
        "token_types.weight", "decision.hidden_norm.bias", "decision.scales", "dec.blk.1.attn_q.weight")],
    (Damage(nan="dec.blk.1.ffn_up.weight"), "clef.nonfinite", "dec.blk.1.ffn_up.weight"),
    (Damage(nan="decision.scales"), "clef.nonfinite", "decision.scales"),
    (Damage(quantize="decision.hidden_norm.bias"), "clef.tensor_type", "decision.hidden_norm.bias"),
    (Damage(key_type="clef.decision.head_count"), "clef.key_type", "clef.decision.head_count"),
    (Damage(key_type="clef.attention.layer_norm_epsilon"), "clef.key_type", "clef.attention.layer_norm_epsilon"),
    (Damage(drop_key="clef.decision.block_count"), "clef.key_missing", "clef.decision.block_count"),
    (Damage(drop_key="clef.decision.type"), "clef.key_missing", "clef.decision.type"),
    (Damage(drop_key="tokenizer.chat_template.systemone"), "clef.template", "tokenizer.chat_template.systemone"),
], ids=lambda v: v if isinstance(v, str) else None)
def test_damage_is_refused_by_name(tmp_path, flat, damage, code, named):
    path = write_clef(tmp_path / "bad.gguf", flat, TINY_HEAD, damage=damage)
    report, head = _check(path)
    errors = _errors(report)
    assert head is None and code in errors, errors
    assert any(named in message for message in errors[code]), errors[code]
    with pytest.raises(ClefHeadError) as err:
        read_embedded_head(path)
    assert any(c == code and named in m for c, m, _ in err.value.problems)


def test_scales_out_of_range_are_refused(tmp_path, flat):
    path = write_clef(tmp_path / "gate.gguf", flat | {"residual_gate": np.float32(40.0)}, TINY_HEAD)
    report, head = _check(path)
    assert head is None and "decision.scales" in _errors(report)["clef.scales"][0]


def test_block_counts_beyond_the_file_are_refused(tmp_path, flat):
    damage = Damage(value=("clef.decision.block_count", 10**6))
    path = write_clef(tmp_path / "blocks.gguf", flat, TINY_HEAD, damage=damage)
    report, head = _check(path)
    assert head is None and "block_count (1000000)" in _errors(report)["clef.key_value"][0]


def test_head_count_must_divide_the_width(tmp_path, flat):
    path = write_clef(tmp_path / "heads.gguf", flat, TINY_HEAD, damage=Damage(value=("clef.decision.head_count", 3)))
    report, head = _check(path)
    assert head is None and "clef.decision.head_count" in _errors(report)["clef.key_value"][0]


@pytest.mark.parametrize("template, code", [
    (FACT_TEMPLATE + " ", "clef.template"),  # llama-server's prompt would end with a space
    (FACT_TEMPLATE.replace("Decide every field jointly.", "Decide."), "clef.template"),
    (FACT_TEMPLATE_TEXT_ONLY, "clef.template_text_only"),  # the same text prompts, but no place for images
])
def test_another_template_is_a_warning(tmp_path, flat, template, code):
    path = write_clef(tmp_path / "tpl.gguf", flat, TINY_HEAD, damage=Damage(template=template))
    report, head = _check(path)
    assert head is not None and not head.template_matches
    assert [(f.level, f.code) for f in report.findings] == [("warning", code)]
    assert "clef-bridge join" in report.findings[0].fix


def test_upstreams_template_is_no_warning(tmp_path, flat):
    report, head = _check(write_clef(tmp_path / "tpl.gguf", flat, TINY_HEAD))
    assert head is not None and head.template_matches and report.findings == []


def test_a_truncated_file_is_refused(tmp_path, flat):
    path = write_clef(tmp_path / "cut.gguf", flat, TINY_HEAD)
    info = read_gguf(path)
    last = max(info.tensors.values(), key=lambda t: t.offset)
    path.write_bytes(path.read_bytes()[:-max(1, last.n_bytes // 2)])
    report, head = _check(path)
    assert head is None and any(last.name in m for m in _errors(report)["clef.truncated"])
    path.write_bytes(path.read_bytes()[:info.data_start // 2])  # cut inside the header
    with pytest.raises(GGUFError):
        read_embedded_head(path)


def test_a_qwen35_file_has_no_embedded_head(fx):
    report, head = _check(fx.gguf_f32)
    assert head is None and "clef.architecture" in _errors(report)


# --- join against the facts, read back by gguf-py -----------------------------------------------------

def _value(field):
    return field.contents()


def _decode(t) -> np.ndarray:
    """gguf-py's view of a tensor as float32."""
    if t.tensor_type in (Q.F32, Q.F16):
        return t.data.astype(np.float32)
    return dequantize(t.data, t.tensor_type)


@pytest.mark.parametrize("head_type", ["f32", "f16", "bf16", "q8_0"])
def test_join_conforms_to_the_facts(tmp_path, demo, head_type):
    temps = {"choice": 0.8, "score.6_10": 1.25}
    out = join(demo.gguf, demo.head, tmp_path / "clef.gguf", head_type, temperatures=temps)
    got, src = GGUFReader(out.path), GGUFReader(demo.gguf)
    cfg = json.loads(config_path_for(demo.head).read_text())
    flat = load_state_dict(demo.head, HeadConfig(**cfg))

    fields = {k: f for k, f in got.fields.items() if not k.startswith("GGUF.")}
    assert _value(fields.pop("general.architecture")) == "clef"
    for key, field in src.fields.items():  # every backbone key under clef.*, same type, same value
        if key.startswith("GGUF.") or key == "general.architecture":
            continue
        mine = fields.pop(key.replace("qwen35.", "clef.", 1) if key.startswith("qwen35.") else key)
        assert mine.types == field.types and _value(mine) == _value(field), key
    for key, (vtype, sub, value) in FACT_KEYS.items():
        field = fields.pop(key)
        assert field.types == ([vtype, sub] if sub is not None else [vtype]), key
        expected = value(cfg)
        assert (_value(field) == pytest.approx(expected)) if vtype == GGUFValueType.FLOAT32 else \
            (_value(field) == expected), key
    assert fields.pop("tokenizer.chat_template.systemone", None) is None  # already checked: the exact template
    for name, temp in temps.items():
        field = fields.pop(f"clef.decision.temperature.{name}")
        assert field.types == [GGUFValueType.FLOAT32] and _value(field) == pytest.approx(temp)
    assert fields == {}  # nothing else

    tensors = {t.name: t for t in got.tensors}
    for t in src.tensors:
        mine = tensors.pop(t.name)
        assert mine.tensor_type == t.tensor_type and list(mine.shape) == list(t.shape)
        assert np.array_equal(mine.data.view(np.uint8), t.data.view(np.uint8)), t.name
    expected = fact_arrays(flat, cfg)
    qtype = Q[head_type.upper()]
    for name, (_, ne, _) in fact_tensors(cfg).items():
        t = tensors.pop(name)
        assert tuple(int(n) for n in t.shape) == ne, name
        assert t.tensor_type == fact_dtype(name, ne, qtype), name
        values = _decode(t)
        # the fixture head is bf16, so f32 and bf16 hold it exactly; f16 too except below its normal range
        # (2^-14), where its subnormal steps of 2^-24 round; q8_0 within half a step of max|x| / 127
        atol = {Q.Q8_0: 4e-3, Q.F16: 2.0 ** -25}.get(t.tensor_type, 0.0)
        np.testing.assert_allclose(values.reshape(expected[name].shape), expected[name], atol=atol, err_msg=name)
    assert tensors == {}
    template = got.fields["tokenizer.chat_template.systemone"]
    assert bytes(template.parts[template.data[0]]) == FACT_TEMPLATE.encode()


def test_an_f32_head_joined_in_bf16_rounds_once(tmp_path, fx):
    head = tmp_path / "head" / "joint_head.safetensors"
    head.parent.mkdir()
    original = random_state_dict(CFG, seed=9)
    save_state_dict(head, original, "F32")
    config_path_for(head).write_text(json.dumps(TINY_HEAD))
    out = join(fx.gguf_f32, head, tmp_path / "c.gguf", "bf16")
    got = read_embedded_head(out.path)
    assert got.matrix_type == "BF16"
    matrices = {n for n, v in original.items() if v.ndim == 2 and n != "type_embedding.weight"}
    for name, value in original.items():
        # bf16 keeps 8 significant bits (rounding: relative error <= 2^-8); everything else stays F32
        rtol = 2.0 ** -8 if name in matrices else (SCALAR_RTOL if name in SCALARS else 0.0)
        np.testing.assert_allclose(got.state_dict[name], value, rtol=rtol, err_msg=name)
        if name in matrices:
            assert not np.array_equal(got.state_dict[name], value), f"{name} was not rounded at all"


# --- the template against our prompt ---------------------------------------------------------------------

SEP, MARK_QUESTION, MARK_OPTION = "\x1e", "\x1dQ", "\x1dO"


def _tojson(value, separators=(",", ":")):
    # llama.cpp's tojson, as the facts describe the server's rendering: keys sorted, UTF-8 kept
    return json.dumps(value, separators=tuple(separators), sort_keys=True, ensure_ascii=False)


def test_the_systemone_template_renders_the_pieces_we_tokenize():
    """llama-server tokenizes each sep-delimited piece of the rendered template; ours must be the same pieces."""
    jinja2 = pytest.importorskip("jinja2")
    request = parse_request({"model": "m", "state": {"ticket": "Rückerstattung bitte", "amount": 12.5},
                             "questions": {
                                 "refund": {"type": "noul", "instructions": "Refund asked?"},
                                 "team": {"type": "choice", "instructions": {"ask": "which team"},
                                          "criteria": {"tech": None, "billing": "payments"}},
                                 "anger": {"type": "score", "instructions": "How upset?",
                                           "criteria": ["calm", {"level": "angry"}]}}})
    pieces: list[str] = []

    def tokenize(text: str, parse_special: bool) -> list[int]:
        pieces.append(text)
        return [len(pieces) - 1]

    encoded = encode(request, tokenize)
    ours = [pieces[i] for i in encoded.input_ids]
    env = jinja2.Environment()
    env.filters["tojson"] = _tojson
    questions = [{"id": q.id, "type": q.type, "instructions": q.instructions,
                  "options": [{"key": k, "description": d} for k, d in q.options]} for q in request.questions]
    rendered = env.from_string(FACT_TEMPLATE).render(state=request.state, questions=questions, sep=SEP,
                                                     mark_question=MARK_QUESTION, mark_option=MARK_OPTION)
    theirs = rendered.split(SEP)
    assert [p.removeprefix(MARK_QUESTION).removeprefix(MARK_OPTION) for p in theirs] == ours
    assert len(ours) == 34  # prefix, state, header, 3 x (field, instructions, options header, END), 6 x 3, suffix
    marked = lambda mark: [i for i, p in enumerate(theirs) if p.startswith(mark)]  # noqa: E731
    assert marked(MARK_QUESTION) == encoded.layout.question_spans[:, 0].tolist()
    assert marked(MARK_OPTION) == encoded.layout.option_spans[:, 0].tolist()
