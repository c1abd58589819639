"""Move Clef models between llama.cpp's `clef` GGUFs and clef-bridge's backbone + safetensors head.

- to_backbone / ensure_backbone: a `qwen35` GGUF from a `clef` one (the llama.cpp inside
  llama-cpp-python cannot load arch clef), kept in a cache keyed by the source's path, size and mtime;
- split: a clef GGUF -> <stem>.backbone.gguf + joint_head.safetensors + joint_head_config.json;
- join: a qwen35 GGUF + a safetensors head -> a clef GGUF that upstream llama-server loads.
Backbone tensors are always copied byte for byte, never requantized.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import math
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import gguf
import numpy as np
from gguf import GGMLQuantizationType as Q
from gguf import GGUFValueType as V
from gguf.quants import quantize

from ...head.config import CONFIG_NAME, HeadConfig, config_path_for, load_config
from ...head.errors import Category, ClefError
from ...head.weights import ENCODERS, load_state_dict, read_header, save_state_dict
from ..catalogue.dtypes import DTYPES, SPLIT_DTYPES
from . import clef_format as cf
from .clef_head import read_embedded_head
from .reader import GGUFInfo, KeyField, read_gguf, read_raw, tensor_end
from .writer import CopyFrom, OutTensor, WriteResult, atomic_file, check_space, encode_value, write_gguf

OnChunk = Callable[[int, int], None]  # (bytes written so far, bytes in all), after every chunk


class ConvertError(ClefError):
    """A GGUF cannot be converted as asked (wrong architecture, existing output, bad option)."""

    category = Category.CONFIG
    error_type = "convert_error"


@dataclass(frozen=True)
class CachedFile:
    """What ensure_cached did: 'converted' or 'reused', the file's size, the seconds it took."""

    action: str
    bytes: int
    seconds: float
    superseded: tuple[Path, ...]  # older conversions of the same source, removed


@dataclass(frozen=True)
class SplitResult:
    backbone: Path
    head: Path
    config: Path
    head_dtype: str  # safetensors dtype written: BF16, F16 or F32
    temperatures: dict[str, float]  # what the clef GGUF carried (safetensors has no place for them)
    bytes: int
    seconds: float


@dataclass(frozen=True)
class JoinResult:
    path: Path
    head_type: str  # GGML type of the head matrices
    dropped: tuple[str, ...]  # MTP/nextn tensors and keys left out
    bytes: int
    seconds: float


def copied(info: GGUFInfo, names: list[str]) -> list[OutTensor]:
    out = []
    for name in names:
        t = info.tensors[name]
        end = tensor_end(info, t)
        if end is None or end > info.file_size:
            raise ConvertError(f"{info.path}: tensor {name} " + ("has an unknown type" if end is None else
                               "runs past the end of the file (truncated?)") + "; download the GGUF again")
        out.append(OutTensor(name, t.shape, int(t.type), t.n_bytes, CopyFrom(info.path, info.data_start + t.offset)))
    return out


def _renamed(info: GGUFInfo, src: str, dst: str, keep) -> list[tuple[str, str, bytes]]:
    """(source key, new key, stored bytes) of the kept keys: `<src>.` renamed `<dst>.` with its type and
    bytes kept, general.architecture set to dst."""
    out = []
    for key in filter(keep, info.fields):
        if key == "general.architecture":
            out.append((key, key, encode_value(V.STRING, dst)))
        else:
            new = f"{dst}.{key[len(src) + 1:]}" if key.startswith(f"{src}.") else key
            out.append((key, new, read_raw(info, key)))
    return out


def _require_arch(info: GGUFInfo, arch: str, fix: str) -> None:
    if info.architecture != arch:
        raise ConvertError(f"{info.path}: architecture {info.architecture!r}, expected {arch!r}; {fix}")


# --- clef -> qwen35 ---------------------------------------------------------------------------------

def _backbone_plan(info: GGUFInfo) -> tuple[list[tuple[str, bytes]], list[OutTensor]]:
    _require_arch(info, cf.CLEF_ARCH, "only a clef GGUF has a backbone to take out (a qwen35 GGUF already is one)")
    renamed = _renamed(info, cf.CLEF_ARCH, cf.BACKBONE_ARCH, lambda k: not cf.is_head_key(k))
    kvs = [(new, raw) for _, new, raw in renamed]
    return kvs, copied(info, [n for n in info.tensors if not cf.is_head_tensor(n)])


def to_backbone(clef: str | Path, out: str | Path, progress: bool | None = None, on_chunk: OnChunk | None = None,
                reserve: int = 0) -> WriteResult:
    """Write the qwen35 backbone of a clef GGUF: keys renamed with their types, head dropped, data copied."""
    info = read_gguf(clef)
    kvs, tensors = _backbone_plan(info)
    return write_gguf(out, kvs, tensors, info.alignment, progress, on_chunk, reserve)


def cache_name(src: Path, suffix: str) -> tuple[str, str]:
    """(prefix shared by every file made from this path, file name of the one made from this version of it)."""
    st = src.stat()
    where = hashlib.sha256(str(src).encode()).hexdigest()[:12]
    version = hashlib.sha256(f"{st.st_size}|{st.st_mtime_ns}".encode()).hexdigest()[:12]
    prefix = f"{src.stem}.{where}."
    return prefix, f"{prefix}{version}{suffix}"


def _complete(path: Path) -> bool:
    try:
        info = read_gguf(path)
    except ClefError:
        return False
    return all((tensor_end(info, t) or math.inf) <= info.file_size for t in info.tensors.values())


def ensure_cached(src: str | Path, cache_root: str | Path, suffix: str,
                  write: Callable[[Path, Path], WriteResult]) -> tuple[Path, CachedFile]:
    """A GGUF made from src by write(src, out), from the cache keyed by src's path, size and mtime: made once,
    again when src changes (older versions removed), under a lock so that a second process waits and reuses it."""
    src = Path(src).resolve()
    root = Path(cache_root)
    root.mkdir(parents=True, exist_ok=True)
    prefix, name = cache_name(src, suffix)
    out = root / name
    start = time.monotonic()
    with (root / f".{prefix}lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if out.is_file() and _complete(out):
            return out, CachedFile("reused", out.stat().st_size, time.monotonic() - start, ())
        superseded = tuple(p for p in root.glob(f"{prefix}*{suffix}") if p != out)
        for old in superseded:
            old.unlink(missing_ok=True)
        result = write(src, out)
        if cache_name(src, suffix)[1] != name:
            out.unlink(missing_ok=True)
            raise ConvertError(f"{src} changed while {out.name} was being written from it; try again")
        return out, CachedFile("converted", result.bytes, time.monotonic() - start, superseded)


def ensure_backbone(clef: str | Path, cache_root: str | Path, progress: bool | None = None,
                    on_chunk: OnChunk | None = None) -> tuple[Path, CachedFile]:
    """The qwen35 backbone of a clef GGUF from the cache, converting it once (and again if the source changes)."""
    return ensure_cached(clef, cache_root, ".qwen35.gguf", lambda src, out: to_backbone(src, out, progress, on_chunk))


# --- split ------------------------------------------------------------------------------------------

SAFETENSORS_TYPES = {name: DTYPES[name].ggml for name in SPLIT_DTYPES}  # what split writes, by our name


def _refuse_existing(paths: list[Path], overwrite: bool) -> None:
    existing = [str(p) for p in paths if p.exists()]
    if existing and not overwrite:
        raise ConvertError(f"{', '.join(existing)} already exist(s)",
                           fix="add --overwrite to replace them (overwrite=True from Python), or remove them")


def split(clef: str | Path, out_dir: str | Path, head_dtype: str | None = None, overwrite: bool = False,
          progress: bool | None = None) -> SplitResult:
    """<stem>.backbone.gguf + joint_head.safetensors + joint_head_config.json, as in a Clef release.

    head_dtype: bf16 (like the release), f16 or f32; None: f32 when the GGUF's head matrices are F32,
    else bf16. Raises ClefHeadError when the embedded head is damaged, before writing anything.
    """
    start = time.monotonic()
    clef, out_dir = Path(clef), Path(out_dir)
    info = read_gguf(clef)
    _require_arch(info, cf.CLEF_ARCH, "split takes a clef GGUF (a qwen35 GGUF holds no head)")
    head = read_embedded_head(info)
    choice = head_dtype or ("f32" if head.matrix_type == "F32" else "bf16")
    if choice not in SAFETENSORS_TYPES:
        raise ConvertError(f"head dtype {choice!r}: use one of {', '.join(SAFETENSORS_TYPES)}")
    dtype = SAFETENSORS_TYPES[choice]
    out_dir.mkdir(parents=True, exist_ok=True)
    backbone, weights, config = out_dir / f"{clef.stem}.backbone.gguf", out_dir / "joint_head.safetensors", \
        out_dir / CONFIG_NAME
    _refuse_existing([backbone, weights, config], overwrite)
    head_bytes = sum(ENCODERS[dtype](v).nbytes for v in head.state_dict.values())
    check_space(out_dir, head_bytes, "the joint head")
    result = to_backbone(clef, backbone, progress, reserve=head_bytes)
    with atomic_file(weights) as tmp:
        save_state_dict(tmp, head.state_dict, dtype)
    cfg = {k: v for k, v in vars(head.config).items() if k != "dropout"}  # the release's six keys
    with atomic_file(config) as tmp:
        tmp.write_text(json.dumps(cfg, indent=2) + "\n", encoding="utf-8")
    return SplitResult(backbone, weights, config, dtype, head.temperatures,
                       result.bytes + weights.stat().st_size + config.stat().st_size, time.monotonic() - start)


# --- join -------------------------------------------------------------------------------------------

def _encode(array: np.ndarray, qtype: Q) -> bytes:
    if qtype == Q.Q8_0:
        if array.shape[-1] % 32:
            raise ConvertError(f"q8_0 stores rows in blocks of 32 values; a row of {array.shape[-1]} does not "
                               "fit: use --head-dtype f16 or bf16")
        return quantize(np.ascontiguousarray(array, dtype=np.float32), Q.Q8_0).tobytes()
    return ENCODERS[qtype.name](array).tobytes()


def _head_plan(flat: dict[str, np.ndarray], cfg: HeadConfig, head_type: Q, stored: list[str]) -> list[OutTensor]:
    arrays = cf.to_gguf_arrays(flat, cfg)
    out = []
    for spec in cf.converter_order(cfg.routing_layers, cfg.layers, stored):
        qtype = head_type if spec.kind == cf.MATRIX else Q.F32  # norms, biases, scales, token types: F32
        data = _encode(arrays[spec.gguf], qtype)
        out.append(OutTensor(spec.gguf, tuple(reversed(arrays[spec.gguf].shape)), int(qtype), len(data), data))
    return out


KeyValues = list[tuple[str, bytes]]  # (key, its stored type and value)


def _head_keys(cfg: HeadConfig, temperatures: dict[str, float]) -> tuple[KeyValues, KeyValues]:
    """(the decision keys, which upstream's converter writes after the architecture's; the template keys, last)."""
    kvs = [("clef.decision.type", encode_value(V.STRING, cf.DECISION_TYPE)),
           ("clef.decision.routing_block_count", encode_value(V.UINT32, cfg.routing_layers)),
           ("clef.decision.block_count", encode_value(V.UINT32, cfg.layers)),
           ("clef.decision.head_count", encode_value(V.UINT32, cfg.heads)),
           ("clef.attention.layer_norm_epsilon", encode_value(V.FLOAT32, cf.LAYER_NORM_EPS))]
    for name, temp in sorted(temperatures.items()):
        if not math.isfinite(temp) or temp <= 0:
            raise ConvertError(f"temperature {name} = {temp}: a temperature must be a finite number > 0")
        try:
            kvs.append((cf.temperature_key(name), encode_value(V.FLOAT32, temp)))
        except ValueError as exc:
            raise ConvertError(str(exc)) from None
    return kvs, [(cf.TEMPLATE_KEY, encode_value(V.STRING, cf.SYSTEMONE_TEMPLATE)),
                 (cf.TEMPLATES_KEY, encode_value(V.ARRAY, [cf.TEMPLATE_NAME], V.STRING))]


def _with_head_keys(kvs: KeyValues, head: KeyValues, templates: KeyValues) -> KeyValues:
    """The keys in upstream's converter order: the decision keys after the last clef.* key, the templates last."""
    last = max((i for i, (key, _) in enumerate(kvs) if key.startswith(f"{cf.CLEF_ARCH}.")), default=len(kvs) - 1)
    return kvs[:last + 1] + head + kvs[last + 1:] + templates


def _without_mtp(info: GGUFInfo) -> tuple[list[tuple[str, bytes]], list[str], list[str]]:
    """The backbone's keys (renamed to clef.*) and tensor names without the MTP block; what was dropped."""
    arch = cf.BACKBONE_ARCH
    n_mtp = int(info.metadata.get(f"{arch}.nextn_predict_layers", 0) or 0)
    n_layer = int(info.metadata[f"{arch}.block_count"])
    keep_layers = n_layer - n_mtp
    dropped = [k for k in info.fields if "nextn" in k]
    drop_keys = set(dropped) | {cf.TEMPLATE_KEY, cf.TEMPLATES_KEY}
    kvs = []
    for src_key, key, raw in _renamed(info, arch, cf.CLEF_ARCH, lambda k: k not in drop_keys):
        field: KeyField = info.fields[src_key]
        value = info.metadata.get(src_key)
        if n_mtp and src_key == f"{arch}.block_count":
            raw = encode_value(field.type, keep_layers)
        elif n_mtp and isinstance(value, np.ndarray) and len(value) == n_layer:
            raw = encode_value(V.ARRAY, value[:keep_layers].tolist(), field.element_type)  # per-layer arrays
        kvs.append((key, raw))

    def is_mtp(name: str) -> bool:
        block = name.split(".")[1] if name.startswith("blk.") else ""
        return "nextn" in name or (n_mtp > 0 and block.isdigit() and int(block) >= keep_layers)

    tensors = [n for n in info.tensors if not is_mtp(n)]
    return kvs, tensors, dropped + [n for n in info.tensors if is_mtp(n)]


def join(backbone: str | Path, head: str | Path, out: str | Path, head_dtype: str | None = None,
         temperatures: dict[str, float] | None = None, overwrite: bool = False,
         progress: bool | None = None) -> JoinResult:
    """A clef GGUF from a qwen35 backbone and a safetensors head (joint_head_config.json beside it).

    head_dtype: f32, f16, bf16 or q8_0 for the head's 2-D matrices; None: what upstream's converter writes them as,
    the backbone's own file type (the outtype it was converted with), else the head file's own dtype.
    temperatures: {"<type>" or "<type>.<bucket>": T} written as clef.decision.temperature.* keys.
    The backbone's general.size_label is counted again with the head's parameters, as the converter counts them.
    """
    backbone, out = Path(backbone), Path(out)
    info = read_gguf(backbone)
    _require_arch(info, cf.BACKBONE_ARCH, "join takes a qwen35 backbone GGUF (split a clef GGUF first)")
    cfg = load_config(config_path_for(head))
    flat = load_state_dict(head, cfg)
    choice = head_dtype or OUTTYPE_HEADS.get(info.metadata.get("general.file_type")) or _safetensors_dtype(Path(head))
    if choice not in cf.HEAD_TYPES:
        raise ConvertError(f"head type {choice!r}: use one of {', '.join(cf.HEAD_TYPES)}")
    n_embd = info.metadata.get(f"{cf.BACKBONE_ARCH}.embedding_length")
    if n_embd != cfg.hidden_size:
        raise ConvertError(f"the head expects hidden_size {cfg.hidden_size} but {backbone.name} has embedding "
                           f"length {n_embd}: pair each backbone with its own head")
    _refuse_existing([out], overwrite)
    out.parent.mkdir(parents=True, exist_ok=True)  # as split creates its folder
    kvs, names, dropped = _without_mtp(info)
    tensors = copied(info, names) + _head_plan(flat, cfg, cf.HEAD_TYPES[choice], _stored_order(Path(head)))
    kvs = [(key, encode_value(V.STRING, parameter_label(tensors)) if key == SIZE_LABEL else value)
           for key, value in kvs]
    result = write_gguf(out, _with_head_keys(kvs, *_head_keys(cfg, temperatures or {})), tensors, info.alignment,
                        progress)
    return JoinResult(out, cf.HEAD_TYPES[choice].name, tuple(dropped), result.bytes, result.seconds)


# general.file_type (llama.cpp's LlamaFileType) of a backbone the converter wrote -> the type its head's matrices get
# with that outtype (ALL_F32, MOSTLY_F16, MOSTLY_Q8_0, MOSTLY_BF16); another file type came from llama-quantize
OUTTYPE_HEADS = {0: "f32", 1: "f16", 7: "q8_0", 32: "bf16"}
SIZE_LABEL = "general.size_label"


def parameter_label(tensors: list[OutTensor]) -> str:
    """general.size_label as upstream's converter counts it (gguf-py's GGUFWriter.get_total_parameter_count, then
    size_label): every tensor written, an expert tensor's parameters once per expert. Shapes are GGUF's ne order,
    the reverse of the converter's numpy shapes."""
    total = shared = expert = expert_sum = expert_tensors = 0
    for t in tensors:
        size = math.prod(t.ne)
        total += size
        if "_exps." in t.name and len(t.ne) >= 3:
            count = t.ne[1 if ".bias" in t.name else 2]
            expert, expert_sum, expert_tensors = expert + size // count, expert_sum + count, expert_tensors + 1
        else:
            shared += size
    return gguf.size_label(total, shared, expert, expert_sum // expert_tensors if expert_tensors else 0)


def _stored_order(head: Path) -> list[str]:
    """The head's tensor names in the order of their data, the order safetensors' load_file yields them."""
    return [e.name for e in sorted(read_header(head).entries.values(), key=lambda e: e.begin)]


def _safetensors_dtype(head: Path) -> str:
    dtypes = {e.dtype for e in read_header(head).entries.values()}
    return dtypes.pop().lower() if len(dtypes) == 1 else "f32"
