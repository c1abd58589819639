"""Strict loading of joint_head.safetensors into numpy arrays (float32, or float16 matrices)."""

from __future__ import annotations

import json
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import numpy as np

from .config import HeadConfig
from .errors import HeadConfigError, HeadWeightsError


def _bf16(raw: np.ndarray) -> np.ndarray:
    # bf16 is the top half of a float32; numpy has no bf16 dtype.
    return (raw.view("<u2").astype(np.uint32) << 16).view(np.float32)


# safetensors dtype name -> (bytes per element, decoder from raw little-endian bytes to float32)
DTYPES: dict[str, tuple[int, Callable[[np.ndarray], np.ndarray]]] = {
    "F32": (4, lambda raw: raw.view("<f4").astype(np.float32)),
    "F16": (2, lambda raw: raw.view("<f2").astype(np.float32)),
    "BF16": (2, _bf16),
}

MAX_HEADER_BYTES = 100 * 1024 * 1024


@dataclass(frozen=True)
class TensorEntry:
    name: str
    dtype: str
    shape: tuple[int, ...]
    begin: int  # byte offset inside the data section
    end: int


@dataclass(frozen=True)
class SafetensorsHeader:
    entries: dict[str, TensorEntry]
    data_start: int  # absolute file offset of the data section
    file_size: int
    metadata: dict[str, str]


def read_header(path: str | Path) -> SafetensorsHeader:
    """Parse a safetensors header; raises HeadWeightsError listing structural problems."""
    path = Path(path)
    try:
        with path.open("rb") as f:
            size = path.stat().st_size
            prefix = f.read(8)
            if len(prefix) < 8:
                raise HeadWeightsError(str(path), ["file is shorter than the 8-byte header length"])
            (n,) = struct.unpack("<Q", prefix)
            if n > min(MAX_HEADER_BYTES, size - 8):
                raise HeadWeightsError(str(path), [f"header length {n} does not fit in a {size}-byte file"])
            raw = json.loads(f.read(n))
    except OSError as exc:
        raise HeadWeightsError(str(path), [f"cannot read: {exc}"]) from None
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise HeadWeightsError(str(path), [f"header is not valid JSON: {exc}"]) from None
    if not isinstance(raw, dict):
        raise HeadWeightsError(str(path), ["header is not a JSON object"])
    metadata = raw.pop("__metadata__", None) or {}
    problems: list[str] = []
    entries: dict[str, TensorEntry] = {}
    data_size = size - 8 - n
    for name, info in raw.items():
        try:
            dtype, shape, (begin, end) = info["dtype"], tuple(info["shape"]), info["data_offsets"]
            if not all(isinstance(d, int) and d >= 0 for d in shape) or not isinstance(dtype, str):
                raise TypeError
            if not (isinstance(begin, int) and isinstance(end, int)):
                raise TypeError
        except (KeyError, TypeError, ValueError):
            problems.append(f"{name}: malformed header entry {info!r}")
            continue
        entries[name] = TensorEntry(name, dtype, shape, begin, end)
        if dtype not in DTYPES:
            problems.append(f"{name}: dtype {dtype} is not supported (use BF16, F16 or F32)")
            continue
        expected = DTYPES[dtype][0] * int(np.prod(shape, dtype=np.int64))
        if not 0 <= begin <= end <= data_size:
            problems.append(f"{name}: data [{begin}, {end}) lies outside the {data_size}-byte data section")
        elif end - begin != expected:
            problems.append(f"{name}: {end - begin} bytes of data for shape {list(shape)} {dtype} "
                            f"({expected} expected)")
    spans = sorted((e.begin, e.end, e.name) for e in entries.values())
    for (b0, e0, n0), (b1, e1, n1) in zip(spans, spans[1:]):
        if b1 < e0:
            problems.append(f"{n0} and {n1}: data regions overlap")
    if problems:
        raise HeadWeightsError(str(path), problems)
    return SafetensorsHeader(entries, 8 + n, size, dict(metadata))


def expected_shapes(cfg: HeadConfig) -> dict[str, tuple[int, ...]]:
    """Every tensor name JointSchemaHead(cfg).state_dict() holds, with its shape."""
    h, w, f = cfg.hidden_size, cfg.width, cfg.feedforward
    norm = lambda p: {f"{p}.weight": (w,), f"{p}.bias": (w,)}  # noqa: E731
    linear = lambda p, o, i: {f"{p}.weight": (o, i), f"{p}.bias": (o,)}  # noqa: E731
    attention = lambda p: {  # noqa: E731
        f"{p}.in_proj_weight": (3 * w, w), f"{p}.in_proj_bias": (3 * w,), **linear(f"{p}.out_proj", w, w)}
    shapes: dict[str, tuple[int, ...]] = {
        "prior_logit_scale": (), "joint_logit_scale": (), "residual_gate": (),
        "hidden_norm.weight": (h,), "hidden_norm.bias": (h,),
        "type_embedding.weight": (3, w),
        **norm("option_summary_norm"), **norm("field_norm"), **norm("option_norm"),
        **linear("residual_scorer.0", w, 4 * w), **linear("residual_scorer.3", 1, w),
    }
    for p in ("memory", "question", "option_question", "global", "option_context", "option_lexical"):
        shapes[f"{p}_projection.weight"] = (w, h)
    for i in range(cfg.routing_layers):
        p = f"evidence_layers.{i}"
        shapes |= norm(f"{p}.query_norm") | norm(f"{p}.memory_norm") | norm(f"{p}.feedforward_norm")
        shapes |= attention(f"{p}.attention") | linear(f"{p}.feedforward.0", f, w) | linear(f"{p}.feedforward.3", w, f)
    for i in range(cfg.layers):
        p = f"layers.{i}"
        shapes |= attention(f"{p}.self_attn") | attention(f"{p}.multihead_attn")
        shapes |= linear(f"{p}.linear1", f, w) | linear(f"{p}.linear2", w, f)
        shapes |= norm(f"{p}.norm1") | norm(f"{p}.norm2") | norm(f"{p}.norm3")
    return shapes


def read_tensors(path: str | Path, header: SafetensorsHeader) -> dict[str, np.ndarray]:
    """Decode every tensor to float32 (once, at load)."""
    data = np.memmap(path, dtype=np.uint8, mode="r", offset=header.data_start)
    out = {}
    for e in header.entries.values():
        out[e.name] = DTYPES[e.dtype][1](np.asarray(data[e.begin:e.end])).reshape(e.shape)
    del data
    return out


def load_state_dict(path: str | Path, cfg: HeadConfig) -> dict[str, np.ndarray]:
    """Flat torch-named float32 arrays; one error lists every missing, unexpected or mis-shaped tensor."""
    header = read_header(path)
    want = expected_shapes(cfg)
    problems = [f"missing tensor {n} (shape {list(s)})" for n, s in want.items() if n not in header.entries]
    problems += [f"unexpected tensor {n}" for n in header.entries if n not in want]
    problems += [
        f"{n}: shape {list(e.shape)}, config implies {list(want[n])}"
        for n, e in header.entries.items() if n in want and e.shape != want[n]
    ]
    if problems:
        raise HeadWeightsError(str(path), problems)
    return read_tensors(path, header)


def unflatten(flat: dict[str, Any]) -> dict[str, Any]:
    """'layers.0.norm1.weight' -> params['layers'][0]['norm1']['weight'] (digit runs 0..n-1 become lists)."""
    tree: dict[str, Any] = {}
    for name, value in flat.items():
        node = tree
        *parents, leaf = name.split(".")
        for part in parents:
            node = node.setdefault(part, {})
        node[leaf] = value
    return _listify(tree)


def _listify(node: Any) -> Any:
    if not isinstance(node, dict):
        return node
    node = {k: _listify(v) for k, v in node.items()}
    indices = [str(i) for i in range(len(node))]
    if node and set(node) == set(indices):
        return [node[i] for i in indices]
    return node


# head_dtype -> how the weight matrices are stored. Vectors, scalars and the type embedding stay
# float32 (as llama.cpp's Clef converter keeps them), and every matrix computes in float32
# (model.linear): float16 halves the head's memory, and Cloudflare's bf16 weights convert to it
# exactly inside float16's normal range (6.1e-5 to 65504; larger values are refused).
STORAGE_DTYPES: dict[str, type[np.floating]] = {"f32": np.float32, "f16": np.float16}

# One vocabulary for dtypes on every flag and models.toml key: ggml's lowercase names (f32, f16, bf16,
# q8_0). Earlier spellings (float32, float16, bfloat16, F32, BF16, ...) still read, as these names.
DTYPE_ALIASES = {"float32": "f32", "float16": "f16", "bfloat16": "bf16"}


def dtype_name(spelling: str) -> str:
    """The vocabulary's name for a dtype however it is spelled: "float16", "F16" and "f16" are "f16"."""
    lowered = spelling.strip().lower()
    return DTYPE_ALIASES.get(lowered, lowered)


def is_matrix(name: str, shape: tuple[int, ...]) -> bool:
    """Whether head_dtype applies to this tensor: the 2-D weights but the 3-row type embedding."""
    return len(shape) == 2 and name != "type_embedding.weight"


def _storage(dtype: str) -> type[np.floating]:
    if dtype_name(dtype) not in STORAGE_DTYPES:
        raise HeadConfigError(f"head_dtype {dtype!r} is not supported: use one of {', '.join(STORAGE_DTYPES)}")
    return STORAGE_DTYPES[dtype_name(dtype)]


def stored_bytes(cfg: HeadConfig, dtype: str) -> int:
    """Bytes the head's parameters take when loaded with this head_dtype (the memory plan's head)."""
    size = np.dtype(_storage(dtype)).itemsize
    return sum(int(np.prod(shape)) * (size if is_matrix(name, shape) else 4)
               for name, shape in expected_shapes(cfg).items())


def store_matrices(flat: dict[str, np.ndarray], dtype: str, path: str | Path = "") -> dict[str, np.ndarray]:
    """The 2-D weight matrices in a head_dtype; one error lists every matrix that dtype cannot hold."""
    target = _storage(dtype)
    largest = float(np.finfo(target).max)
    out, problems = {}, []
    for name, value in flat.items():
        if is_matrix(name, value.shape) and value.dtype != target:
            peak = float(np.abs(value).max(initial=0.0))
            if peak > largest:
                problems.append(f"{name}: |value| up to {peak:g} overflows {dtype} (largest {largest:g}); "
                                "use head_dtype = \"f32\"")
                continue
            value = value.astype(target)
        out[name] = value
    if problems:
        raise HeadWeightsError(str(path), problems)
    return out


def params_from(flat: dict[str, np.ndarray], xp: Any = np, dtype: str = "f32",
                source: str | Path = "") -> dict[str, Any]:
    """A flat torch-named state dict as the nested parameters the head's functions unpack, on xp."""
    flat = store_matrices(flat, dtype, source)
    if xp is not np:
        flat = {k: xp.asarray(v) for k, v in flat.items()}
    return unflatten(flat)


def _to_bf16(x: np.ndarray) -> np.ndarray:
    bits = np.ascontiguousarray(x, dtype=np.float32).view(np.uint32)
    rounded = bits + 0x7FFF + ((bits >> 16) & 1)  # round to nearest even, as torch does
    return (rounded >> 16).astype("<u2")


# safetensors dtype name -> encoder from float32 to the stored little-endian array
ENCODERS: dict[str, Callable[[np.ndarray], np.ndarray]] = {
    "F32": lambda x: np.ascontiguousarray(x, dtype="<f4"),
    "F16": lambda x: np.ascontiguousarray(x, dtype="<f2"),
    "BF16": _to_bf16,
}


def save_state_dict(path: str | Path, flat: dict[str, np.ndarray], dtype: str = "BF16") -> None:
    """Write a safetensors file (numpy's safetensors module cannot write bf16)."""
    header, blobs, offset = {}, [], 0
    for name in sorted(flat):
        blob = ENCODERS[dtype](flat[name]).tobytes()
        header[name] = {"dtype": dtype, "shape": list(np.shape(flat[name])),
                        "data_offsets": [offset, offset + len(blob)]}
        blobs.append(blob)
        offset += len(blob)
    raw = json.dumps(header, separators=(",", ":")).encode()
    raw += b" " * (-len(raw) % 8)  # keep the data section 8-byte aligned
    with Path(path).open("wb") as f:
        f.write(struct.pack("<Q", len(raw)) + raw)
        for blob in blobs:
            f.write(blob)
