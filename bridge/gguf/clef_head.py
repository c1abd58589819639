"""The joint schema head embedded in a `clef` GGUF: validated like a safetensors head, then read.

validate_embedded_head appends findings to a report (anything with add(level, code, message, fix),
such as integrity.CheckReport) and returns the head when nothing is wrong; read_embedded_head is the strict
form that raises one error listing every problem.
"""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import numpy as np
from gguf import GGML_QUANT_SIZES
from gguf import GGUFValueType as V

from ...head.config import HeadConfig
from ...head.errors import Category, ClefError
from . import clef_format as cf
from .reader import GGUFInfo, KeyField, read_gguf, read_strings, tensor_end, tensor_float32

REWRITE = "rewrite it with `clef-bridge join BACKBONE.gguf HEAD.safetensors`, or download the GGUF again"
REWRITE_TEMPLATE = ("`clef-bridge split` it and `clef-bridge join` the parts back (both exact; join writes upstream's "
                    "current template)")
REDOWNLOAD = "the file is damaged or incomplete: download it again"
_W, _F = 10007, 10009  # distinct primes standing in for width and feed-forward when finding them in shapes
_NUMERIC = {V.UINT8, V.INT8, V.UINT16, V.INT16, V.UINT32, V.INT32, V.FLOAT32, V.UINT64, V.INT64, V.FLOAT64}


class FindingSink(Protocol):
    def add(self, level: str, code: str, message: str, fix: str = "") -> None: ...


class ClefHeadError(ClefError):
    """A clef GGUF's embedded head is incomplete or inconsistent; lists every problem found."""

    category = Category.CONFIG
    error_type = "clef_head_error"

    def __init__(self, path: str, problems: list[tuple[str, str, str]]):
        self.path = path
        self.problems = tuple(problems)  # (code, message, fix)
        listing = "\n".join(f"  - {code}: {message} (fix: {fix})" for code, message, fix in problems)
        super().__init__(f"{path}: {len(problems)} problem(s) with the embedded joint head:\n{listing}")


@dataclass(frozen=True)
class EmbeddedHead:
    config: HeadConfig
    state_dict: dict[str, np.ndarray]  # torch names, float32, as head.weights.load_state_dict gives
    temperatures: dict[str, float]  # "<type>" or "<type>.<bucket>" -> T
    template_matches: bool  # the systemone template is upstream's converter template byte for byte
    tensor_types: dict[str, str]  # GGUF tensor name -> GGML type name
    warnings: tuple[str, ...]

    @property
    def matrix_type(self) -> str:
        """The GGML type of the head's 2-D matrices ("MIXED" when they differ)."""
        names = {t.gguf for t in cf.head_tensors(self.config.routing_layers, self.config.layers)
                 if t.kind == cf.MATRIX}
        types = {self.tensor_types[n] for n in names}
        return types.pop() if len(types) == 1 else "MIXED"


class _Tracker:
    """Forwards findings to the caller's report and remembers what this module added."""

    def __init__(self, report: FindingSink):
        self.report, self.errors, self.warnings = report, [], []

    def add(self, level: str, code: str, message: str, fix: str = "") -> None:
        self.report.add(level, code, message, fix)
        if level == "error":
            self.errors.append((code, message, fix))
        elif level == "warning":
            self.warnings.append(f"{code}: {message}")


def _type_name(vtype: int, etype: int | None = None) -> str:
    try:
        name = V(vtype).name
    except ValueError:
        name = str(vtype)
    return f"{name}[{_type_name(etype)}]" if etype is not None else name


def _check_keys(info: GGUFInfo, t: _Tracker) -> dict[str, Any]:
    """The head keys that are present with their exact type; a finding for each that is not."""
    good = {}
    for key, (vtype, etype) in cf.HEAD_KEYS.items():
        field: KeyField | None = info.fields.get(key)
        if field is None:
            if key == cf.TEMPLATE_KEY:
                t.add("error", "clef.template", f"{key} is missing: llama-server refuses a decision GGUF without "
                      "its systemone prompt template", REWRITE)
            elif key == cf.TEMPLATES_KEY:
                t.add("warning", "clef.key_missing", f"{key} is missing (upstream's converter writes "
                      "[\"systemone\"])", REWRITE)
            else:
                t.add("error", "clef.key_missing", f"{key} is missing", REWRITE)
        elif field.type != vtype or field.element_type != etype:
            t.add("error", "clef.key_type", f"{key} is stored as {_type_name(field.type, field.element_type)}; "
                  f"llama.cpp reads it as {_type_name(vtype, etype)}", REWRITE)
        else:
            good[key] = info.metadata[key]
    kind = good.get("clef.decision.type")
    if kind is not None and kind != cf.DECISION_TYPE:
        t.add("error", "clef.key_value", f"clef.decision.type is {kind!r}, not {cf.DECISION_TYPE!r}", REWRITE)
    for key in ("clef.decision.routing_block_count", "clef.decision.block_count", "clef.decision.head_count"):
        if key in good and good[key] < 1:
            t.add("error", "clef.key_value", f"{key} is {good[key]}; it must be at least 1", REWRITE)
            del good[key]
    eps = good.get("clef.attention.layer_norm_epsilon")
    if eps is not None and np.float32(eps) != np.float32(cf.LAYER_NORM_EPS):
        t.add("error", "clef.key_value", f"clef.attention.layer_norm_epsilon is {eps:g}; the joint head is "
              f"computed with torch's {cf.LAYER_NORM_EPS:g}", REWRITE)
    template = good.get(cf.TEMPLATE_KEY)
    if template == cf.SYSTEMONE_TEMPLATE_TEXT_ONLY:
        t.add("warning", "clef.template_text_only", f"{cf.TEMPLATE_KEY} is upstream's earlier template, without its "
              "images block: llama-server answers text requests as clef-bridge does, but refuses requests with "
              "images (500, 'unexpected layout of the decision prompt')", REWRITE_TEMPLATE)
    elif template is not None and template != cf.SYSTEMONE_TEMPLATE:
        t.add("warning", "clef.template", f"{cf.TEMPLATE_KEY} differs from upstream's converter template: "
              "llama-server renders the file's template, clef-bridge renders the reference prompt, so answers "
              "may differ between the two", REWRITE_TEMPLATE)
    if cf.TEMPLATES_KEY in good:
        names = read_strings(info, cf.TEMPLATES_KEY)
        if cf.TEMPLATE_NAME not in names:
            t.add("warning", "clef.key_value", f"{cf.TEMPLATES_KEY} = {names} does not name "
                  f"{cf.TEMPLATE_NAME!r}", REWRITE)
    return good


def _check_temperatures(info: GGUFInfo, t: _Tracker) -> dict[str, float]:
    temps = {}
    for key, field in info.fields.items():
        if not key.startswith("clef.decision.") or key in cf.HEAD_KEYS:
            continue
        if not key.startswith(cf.TEMPERATURE_PREFIX):
            t.add("warning", "clef.key_unexpected", f"{key} is not a key llama.cpp's clef model reads", "")
            continue
        name, value = key[len(cf.TEMPERATURE_PREFIX):], info.metadata[key]
        try:
            cf.temperature_key(name)
        except ValueError as exc:
            t.add("warning", "clef.temperature", f"{key}: {exc}; llama-server never looks it up", "")
            continue
        if field.type not in _NUMERIC and field.type != V.STRING:
            t.add("error", "clef.key_type", f"{key} is stored as {_type_name(field.type, field.element_type)}; "
                  "a temperature is a number", REWRITE)
            continue
        try:
            temp = float(value)
        except ValueError:
            temp = math.nan
        if not math.isfinite(temp) or temp <= 0:
            t.add("error", "clef.temperature", f"{key} = {value!r}: a temperature must be a finite number > 0",
                  "calibrate again and rewrite the temperatures with `clef-bridge join --temperature`")
            continue
        temps[name] = temp
    return temps


def _dimension(info: GGUFInfo, symbolic: dict[str, tuple[int, ...]], marker: int) -> int | None:
    """The size most present tensors agree on along the axes that the width (or ff) sets.

    A majority rather than one designated tensor, so that one mis-shaped tensor is the one named.
    """
    sizes = Counter(tensor.shape[axis] for name, ne in symbolic.items()
                    if (tensor := info.tensors.get(name)) is not None and len(tensor.shape) == len(ne)
                    for axis, n in enumerate(ne) if n == marker)
    return sizes.most_common(1)[0][0] if sizes else None


def _check_tensor_type(info: GGUFInfo, spec: cf.HeadTensor, t: _Tracker) -> None:
    tensor = info.tensors[spec.gguf]
    name = getattr(tensor.type, "name", str(tensor.type))
    allowed = cf.MATRIX_TYPES if spec.kind in (cf.MATRIX, cf.TYPES) else cf.VECTOR_TYPES
    if tensor.type in allowed:
        block = GGML_QUANT_SIZES[tensor.type][0]
        if tensor.shape and tensor.shape[0] % block:
            t.add("error", "clef.tensor_type", f"{spec.gguf}: rows of {tensor.shape[0]} values cannot be stored "
                  f"in {name} blocks of {block}", REWRITE)
    elif spec.kind == cf.VECTOR and tensor.type in cf.READABLE_VECTOR_TYPES:
        t.add("warning", "clef.tensor_type", f"{spec.gguf} is {name}; llama.cpp's tools keep 1-D tensors in F32",
              REWRITE)
    else:
        t.add("error", "clef.tensor_type", f"{spec.gguf} is {name}; a {spec.kind} tensor must be one of "
              f"{', '.join(sorted(q.name for q in allowed))}", REWRITE)


def _check_tensors(info: GGUFInfo, good: dict[str, Any], t: _Tracker) -> HeadConfig | None:
    """The exact tensor set, shapes, types and bounds; the head's config when the shapes are known."""
    routing, joint = good["clef.decision.routing_block_count"], good["clef.decision.block_count"]
    # Every block holds at least 18 tensors: more blocks than the file has tensors is a damaged count, and
    # building the expected-tensor table from it could take any amount of memory.
    if routing + joint > len(info.tensors):
        t.add("error", "clef.key_value", f"clef.decision.routing_block_count ({routing}) and block_count ({joint}) "
              f"claim more blocks than the file holds tensors ({len(info.tensors)})", REWRITE)
        return None
    specs = cf.head_tensors(routing, joint)
    names = {s.gguf for s in specs}
    for s in specs:
        if s.gguf not in info.tensors:
            t.add("error", "clef.tensor_missing", f"head tensor {s.gguf} is missing", REDOWNLOAD)
    n_layer = info.metadata.get("clef.block_count")
    for name in info.tensors:
        stray = cf.is_head_tensor(name) and name not in names
        block = name.split(".")[1] if name.startswith("blk.") else ""
        if block.isdigit() and isinstance(n_layer, int):
            stray |= "nextn" in name or int(block) >= n_layer
        if stray:
            t.add("error", "clef.tensor_unexpected", f"{name} is not part of this head (routing blocks {routing}, "
                  f"joint blocks {joint}); llama.cpp refuses a clef GGUF with extra tensors", REWRITE)
    hidden = good.get("clef.embedding_length")
    symbolic = cf.gguf_shapes(HeadConfig(hidden or 1, _W, routing, joint, 1, _F))
    width, ff = _dimension(info, symbolic, _W), _dimension(info, symbolic, _F)
    cfg = None
    if width and ff and hidden and "clef.decision.head_count" in good:
        cfg = HeadConfig(hidden, width, routing, joint, good["clef.decision.head_count"], ff)
        if width % cfg.heads:
            t.add("error", "clef.key_value", f"clef.decision.head_count ({cfg.heads}) does not divide the head's "
                  f"width ({width})", REWRITE)
        for name, ne in cf.gguf_shapes(cfg).items():
            tensor = info.tensors.get(name)
            if tensor is not None and tensor.shape != ne:
                t.add("error", "clef.tensor_shape", f"{name} has ne {list(tensor.shape)}; the head "
                      f"(hidden {hidden}, width {width}, feed-forward {ff}) implies {list(ne)}", REWRITE)
    for s in specs:
        if s.gguf in info.tensors:
            _check_tensor_type(info, s, t)
            end = tensor_end(info, info.tensors[s.gguf])
            if end is not None and end > info.file_size:
                t.add("error", "clef.truncated", f"{s.gguf} ends at byte {end} but the file has {info.file_size}",
                      REDOWNLOAD)
    return cfg


def _check_values(arrays: dict[str, np.ndarray], t: _Tracker) -> None:
    for name, array in arrays.items():
        if not np.isfinite(array).all():
            t.add("error", "clef.nonfinite", f"{name} holds NaN or infinite values", REDOWNLOAD)
    s0, s1, g = (float(x) for x in arrays["decision.scales"])
    limit = math.exp(cf.LOG_100) * (1 + 1e-6)  # the head clamps both logit scales at 100
    if not (0 < s0 <= limit and 0 < s1 <= limit and 0 < g < 1):
        t.add("error", "clef.scales", f"decision.scales = [{s0:g}, {s1:g}, {g:g}]: the logit scales must lie in "
              "(0, 100] and the gate in (0, 1)", REDOWNLOAD)


def validate_embedded_head(info: GGUFInfo, report: FindingSink) -> EmbeddedHead | None:
    """Every check of a clef GGUF's head, as findings on report; the head when no error was found."""
    t = _Tracker(report)
    if info.architecture != cf.CLEF_ARCH:
        t.add("error", "clef.architecture", f"general.architecture is {info.architecture!r}, not "
              f"{cf.CLEF_ARCH!r}: the GGUF has no embedded head", "pass a clef GGUF")
        return None
    good = _check_keys(info, t)
    if isinstance(info.fields.get("clef.embedding_length"), KeyField):
        good["clef.embedding_length"] = info.metadata["clef.embedding_length"]
    else:
        t.add("error", "clef.key_missing", "clef.embedding_length is missing", REWRITE)
    temperatures = _check_temperatures(info, t)
    if "clef.decision.routing_block_count" not in good or "clef.decision.block_count" not in good:
        return None
    cfg = _check_tensors(info, good, t)
    if t.errors or cfg is None:
        return None
    arrays = {s: tensor_float32(info, info.tensors[s]) for s in cf.gguf_shapes(cfg)}
    _check_values(arrays, t)
    if t.errors:
        return None
    types = {s: getattr(info.tensors[s].type, "name", "?") for s in arrays}
    return EmbeddedHead(cfg, cf.from_gguf_arrays(arrays, cfg), temperatures,
                        info.metadata.get(cf.TEMPLATE_KEY) == cf.SYSTEMONE_TEMPLATE, types, tuple(t.warnings))


class _List:
    def __init__(self):
        self.findings: list[tuple[str, str, str, str]] = []

    def add(self, level: str, code: str, message: str, fix: str = "") -> None:
        self.findings.append((level, code, message, fix))


def read_embedded_head(gguf: str | Path | GGUFInfo) -> EmbeddedHead:
    """The head of a clef GGUF; GGUFError when the file is unreadable, ClefHeadError listing every problem."""
    info = gguf if isinstance(gguf, GGUFInfo) else read_gguf(gguf)
    findings = _List()
    head = validate_embedded_head(info, findings)
    if head is None:
        raise ClefHeadError(str(info.path), [(c, m, f) for level, c, m, f in findings.findings if level == "error"])
    return head
