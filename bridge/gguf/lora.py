"""LoRA adapters: a PEFT adapter folder (as clef-finetune writes it) to llama.cpp's GGUF LoRA format.

Only the base GGUF is needed: its metadata gives the shapes and head counts that the HF -> GGUF converter used
to split, fuse and permute the base's weights, and the adapter's A and B matrices get the same treatment
(convert_hf_to_gguf.py's facts, checked against PEFT numerically by tests/test_lora.py):

- the linear attention's V heads are reordered from grouped-by-K-head to tiled order: the V rows of
  in_proj_qkv, the rows of in_proj_z, in_proj_a and in_proj_b (rows of B) and the columns of out_proj (of A);
- every other target keeps its rows (the full attention's q_proj, query and gate together, included).

llama.cpp applies an adapter to a weight only where its graph calls build_lora_mm; an adapter tensor for any
other weight loads and is silently ignored, so such an adapter is refused here, naming those tensors.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import re
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from gguf import GGMLQuantizationType, GGUFWriter

from ...head.errors import Category, ClefError, HeadWeightsError
from ...head.weights import read_header, read_tensors
from ..catalogue.architectures import QWEN35
from ..host.paths import cache_dir
from .reader import GGUFInfo, read_gguf
from .writer import quiet_gguf_py

ADAPTER_CONFIG = "adapter_config.json"
ADAPTER_WEIGHTS = "adapter_model.safetensors"
CONVERTER_VERSION = "1"  # part of the cache key: a converter that writes differently makes new files

# HF module (its last two names) -> the GGUF weight that llama.cpp's qwen35 graph runs through build_lora_mm
QWEN35_TARGETS = {
    "self_attn.q_proj": "attn_q", "self_attn.k_proj": "attn_k", "self_attn.v_proj": "attn_v",
    "self_attn.o_proj": "attn_output",
    "linear_attn.in_proj_qkv": "attn_qkv", "linear_attn.in_proj_z": "attn_gate",
    "linear_attn.in_proj_a": "ssm_alpha", "linear_attn.in_proj_b": "ssm_beta", "linear_attn.out_proj": "ssm_out",
    "mlp.gate_proj": "ffn_gate", "mlp.up_proj": "ffn_up", "mlp.down_proj": "ffn_down",
}
# PEFT's key of one LoRA matrix of a decoder layer's linear (Qwen3_5ForConditionalGeneration or ...ForCausalLM)
_KEY = re.compile(r"^base_model\.model\.(?:model\.)?(?:language_model\.)?layers\.(\d+)\.(\w+\.\w+)"
                  r"\.lora_([AB])\.weight$")
# PEFT options that change what the adapter computes beyond (alpha / r) * B @ A, which llama.cpp cannot express
_UNSUPPORTED = {"use_dora": "DoRA", "modules_to_save": "fully trained modules (modules_to_save)",
                "rank_pattern": "per-module ranks (rank_pattern)", "alpha_pattern": "per-module alphas (alpha_pattern)"}


class AdapterError(ClefError):
    """A LoRA adapter cannot be read or used as given."""

    category = Category.CONFIG
    error_type = "adapter_error"


class AdapterSkipped(AdapterError):
    """The adapter holds tensors that llama.cpp would load and silently not apply; lists them."""

    error_type = "adapter_skipped_tensors"


class AdapterMismatch(AdapterError):
    """The adapter was made for another base than this GGUF (architecture, shapes or layers)."""

    error_type = "adapter_base_mismatch"


@dataclass(frozen=True)
class PeftAdapter:
    """A PEFT LoRA adapter folder, read: its config's facts and its A/B matrices by HF module name."""

    folder: Path
    r: int
    alpha: float  # the alpha llama.cpp scales by (alpha / r); rsLoRA's alpha / sqrt(r) folded in
    base: str  # base_model_name_or_path, as PEFT wrote it
    matrices: dict[str, tuple[np.ndarray, np.ndarray]]  # "layers.N.linear_attn.in_proj_qkv" -> (A [r, in], B [out, r])
    skipped: tuple[str, ...]  # tensors that map to no weight llama.cpp applies LoRA to

    @property
    def targets(self) -> tuple[str, ...]:
        """The module kinds it adapts ("linear_attn.in_proj_qkv", "mlp.up_proj", ...), sorted."""
        return tuple(sorted({name.split(".", 2)[2] for name in self.matrices}))


def _config(folder: Path) -> dict:
    path = folder / ADAPTER_CONFIG
    try:
        config = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as e:
        raise AdapterError(f"{path}: cannot read the adapter's config ({e})",
                           fix="point `lora` at the adapter/ folder clef-finetune wrote (adapter_config.json and "
                               "adapter_model.safetensors), or at a GGUF LoRA file") from e
    if not isinstance(config, dict) or config.get("peft_type", "LORA") != "LORA":
        raise AdapterError(f"{path}: not a PEFT LoRA config (peft_type {config.get('peft_type')!r})")
    used = [what for key, what in _UNSUPPORTED.items() if config.get(key)]
    if config.get("bias", "none") != "none":
        used.append(f"trained biases (bias={config['bias']!r})")
    if used:
        raise AdapterError(f"{path}: the adapter uses {', '.join(used)}, which llama.cpp's LoRA cannot apply",
                           fix="train with plain LoRA (clef-finetune's defaults), or merge the adapter and serve "
                               "the merged GGUF")
    for key in ("r", "lora_alpha"):
        if not isinstance(config.get(key), (int, float)) or config[key] <= 0:
            raise AdapterError(f"{path}: {key} must be a positive number, got {config.get(key)!r}")
    return config


def read_peft(folder: str | Path) -> PeftAdapter:
    """Read a PEFT adapter folder (float32, float16 or bfloat16 weights) into float32 matrices."""
    folder = Path(folder)
    config = _config(folder)
    weights = folder / ADAPTER_WEIGHTS
    try:
        tensors = read_tensors(weights, read_header(weights))
    except (OSError, HeadWeightsError) as e:
        raise AdapterError(f"{weights}: cannot read the adapter's weights ({e})") from e
    pairs: dict[str, dict[str, np.ndarray]] = {}
    skipped = []
    for key, value in tensors.items():
        match = _KEY.match(key)
        if match is None or match.group(2) not in QWEN35_TARGETS:
            skipped.append(key)
            continue
        pairs.setdefault(f"layers.{match.group(1)}.{match.group(2)}", {})[match.group(3)] = value
    broken = sorted(name for name, p in pairs.items() if len(p) != 2)
    if broken:
        raise AdapterError(f"{weights}: LoRA pairs missing their A or B: {', '.join(broken)}")
    r, alpha = int(config["r"]), float(config["lora_alpha"])
    if config.get("use_rslora"):  # PEFT scales by alpha / sqrt(r); llama.cpp by alpha / r
        alpha *= math.sqrt(r)
    matrices = {name: (p["A"], p["B"]) for name, p in sorted(pairs.items())}
    wrong_rank = sorted(name for name, (a, b) in matrices.items()
                        if a.ndim != 2 or b.ndim != 2 or a.shape[0] != r or b.shape[1] != r)
    if wrong_rank:
        raise AdapterError(f"{weights}: matrices whose rank is not the config's r={r}: {', '.join(wrong_rank)}")
    return PeftAdapter(folder, r, alpha, str(config.get("base_model_name_or_path") or ""), matrices,
                       tuple(sorted(skipped)))


@dataclass(frozen=True)
class HeadCounts:
    """The linear attention's head layout, from the base GGUF's metadata (what the converter permuted by)."""

    k_heads: int  # ssm.group_count
    v_heads: int  # ssm.time_step_rank
    k_dim: int  # ssm.state_size
    v_dim: int  # ssm.inner_size / v_heads


def head_counts(info: GGUFInfo) -> HeadCounts:
    k_heads, v_heads = info.arch_key("ssm.group_count"), info.arch_key("ssm.time_step_rank")
    inner, state = info.arch_key("ssm.inner_size"), info.arch_key("ssm.state_size")
    if not all(isinstance(v, int) and v > 0 for v in (k_heads, v_heads, inner, state)):
        raise AdapterMismatch(f"{info.path}: no linear-attention head counts (ssm.*) in its metadata")
    return HeadCounts(k_heads, v_heads, state, inner // v_heads)


def tiled_order(n: int, counts: HeadCounts, head_dim: int) -> np.ndarray:
    """The index that reorders n = v_heads x head_dim rows from grouped-by-K-head to tiled order."""
    per_k = counts.v_heads // counts.k_heads
    return np.arange(n).reshape(counts.k_heads, per_k, head_dim).transpose(1, 0, 2).reshape(n)


def gguf_matrices(kind: str, a: np.ndarray, b: np.ndarray, counts: HeadCounts) -> tuple[np.ndarray, np.ndarray]:
    """(A, B) as the GGUF weight's rows and columns lie: the converter's V-head reorder applied to B or A."""
    if counts.k_heads == counts.v_heads or not kind.startswith("linear_attn."):
        return a, b
    if kind == "linear_attn.in_proj_qkv":
        qk = 2 * counts.k_heads * counts.k_dim
        order = np.concatenate([np.arange(qk), qk + tiled_order(b.shape[0] - qk, counts, counts.v_dim)])
        return a, b[order]
    if kind == "linear_attn.in_proj_z":
        return a, b[tiled_order(b.shape[0], counts, counts.v_dim)]
    if kind in ("linear_attn.in_proj_a", "linear_attn.in_proj_b"):
        return a, b[tiled_order(b.shape[0], counts, 1)]
    if kind == "linear_attn.out_proj":
        return a[:, tiled_order(a.shape[1], counts, counts.v_dim)], b
    raise AssertionError(f"no GGUF layout for {kind}")


def gguf_name(module: str) -> str:
    """"layers.3.self_attn.q_proj" -> "blk.3.attn_q.weight"."""
    _, layer, kind = module.split(".", 2)
    return f"blk.{layer}.{QWEN35_TARGETS[kind]}.weight"


def check_against(adapter: PeftAdapter, info: GGUFInfo) -> None:
    """Refuse an adapter made for another base: its tensors for weights this GGUF lacks or shapes it differs in."""
    if info.architecture != QWEN35.name:
        raise AdapterMismatch(f"{adapter.folder} (base {adapter.base or 'not named'}) is a Qwen3.5 LoRA; {info.path} "
                              f"is a {info.architecture!r} backbone", fix="pair the adapter with the base it was "
                              "trained on")
    wrong = []
    for module, (a, b) in adapter.matrices.items():
        weight = info.tensors.get(gguf_name(module))
        if weight is None:
            wrong.append(f"{module} (no {gguf_name(module)})")
        elif tuple(weight.shape[:2]) != (a.shape[1], b.shape[0]):
            wrong.append(f"{module} [{b.shape[0]}x{a.shape[1]}] vs {gguf_name(module)} "
                         f"[{weight.shape[1]}x{weight.shape[0]}]")
    if wrong:
        raise AdapterMismatch(
            f"{adapter.folder} (trained on {adapter.base or 'a base it does not name'}) does not fit {info.path} "
            f"({info.metadata.get('general.name', 'unnamed')}): {len(wrong)} target(s) differ: "
            f"{'; '.join(wrong[:8])}{' ...' if len(wrong) > 8 else ''}",
            fix="serve the adapter over the GGUF of the release it was trained on")


def refuse_skipped(adapter: PeftAdapter) -> None:
    if adapter.skipped:
        raise AdapterSkipped(
            f"{adapter.folder}: {len(adapter.skipped)} tensor(s) adapt weights that llama.cpp's {QWEN35.name} graph "
            f"does not run LoRA on, so they would be silently ignored: {', '.join(adapter.skipped)}",
            fix=f"train with clef-finetune's targets only ({', '.join(sorted(QWEN35_TARGETS))}), or merge the "
                "adapter and serve the merged GGUF")


def write_gguf_lora(adapter: PeftAdapter, info: GGUFInfo, out: Path) -> Path:
    """Write the adapter as llama.cpp's GGUF LoRA for this base (float32 matrices); refuses what it cannot."""
    refuse_skipped(adapter)
    check_against(adapter, info)
    counts = head_counts(info)
    tmp = out.with_name(f"{out.name}.{os.getpid()}.tmp")
    out.parent.mkdir(parents=True, exist_ok=True)
    with quiet_gguf_py():
        writer = GGUFWriter(str(tmp), QWEN35.name)
        writer.add_type("adapter")
        writer.add_string("adapter.type", "lora")
        writer.add_float32("adapter.lora.alpha", adapter.alpha)
        writer.add_string("general.base_model.name_or_path", adapter.base)
        for module, (a, b) in adapter.matrices.items():
            a, b = gguf_matrices(module.split(".", 2)[2], a, b, counts)
            name = gguf_name(module).removesuffix(".weight")
            # ggml's lora_a is [in, r] and lora_b [r, out] (row length first): numpy's A [r, in] and B [out, r]
            writer.add_tensor(f"{name}.weight.lora_a", np.ascontiguousarray(a, dtype=np.float32),
                              raw_dtype=GGMLQuantizationType.F32)
            writer.add_tensor(f"{name}.weight.lora_b", np.ascontiguousarray(b, dtype=np.float32),
                              raw_dtype=GGMLQuantizationType.F32)
        writer.write_header_to_file()
        writer.write_kv_data_to_file()
        writer.write_tensors_to_file()
        writer.close()
    tmp.replace(out)
    return out


def adapter_digest(folder: Path, gguf: GGUFInfo) -> str:
    """What the converted file depends on: the adapter's two files, the base's layout keys, the converter."""
    h = hashlib.sha256(f"{CONVERTER_VERSION}:{lora_digest(folder)}".encode())
    layout = {k: v for k, v in gguf.metadata.items() if k.startswith(f"{gguf.architecture}.ssm.")}
    h.update(json.dumps([gguf.architecture, sorted(layout.items())]).encode())
    return h.hexdigest()


def is_gguf_lora(path: Path) -> bool:
    return path.is_file() and path.suffix == ".gguf"


def converted_lora(adapter: str | Path, gguf: str | Path, cache: Path | None = None) -> Path:
    """The GGUF LoRA file for `adapter` over `gguf`: a GGUF LoRA as given, a PEFT folder converted once and cached
    under the host's cache folder (lora/<digest>.gguf), keyed by the adapter's bytes and the base's layout."""
    adapter = Path(adapter)
    if is_gguf_lora(adapter):
        return adapter
    adapter = adapter_folder(adapter)
    info = read_gguf(gguf)
    peft = read_peft(adapter)
    out = (cache or cache_dir() / "lora") / f"{adapter_digest(adapter, info)}.gguf"
    if out.is_file():
        refuse_skipped(peft)
        check_against(peft, info)
        return out
    return write_gguf_lora(peft, info, out)


@dataclass(frozen=True)
class LoraFacts:
    """What `check` says about an adapter: its rank, scale, targets and the base it names."""

    path: str
    format: str  # "peft" or "gguf"
    rank: int
    alpha: float
    base: str  # base_model_name_or_path ("" when the adapter names none)
    targets: tuple[str, ...]  # module kinds (PEFT's names) or GGUF weights adapted
    modules: int  # adapted linears

    def to_dict(self) -> dict:
        return {"path": self.path, "format": self.format, "rank": self.rank, "alpha": self.alpha, "base": self.base,
                "targets": list(self.targets), "modules": self.modules}


def adapter_folder(lora: Path) -> Path:
    """The PEFT folder of `lora`: itself, or the adapter/ of a clef-finetune checkpoint folder."""
    if not (lora / ADAPTER_CONFIG).is_file() and (lora / "adapter" / ADAPTER_CONFIG).is_file():
        return lora / "adapter"
    return lora


def _gguf_lora_facts(path: Path, base: GGUFInfo) -> LoraFacts:
    """A GGUF LoRA file's facts, refused when llama.cpp would skip a tensor or the base lacks one."""
    info = read_gguf(path)
    if info.metadata.get("general.type") != "adapter" or info.metadata.get("adapter.type") != "lora":
        raise AdapterError(f"{path}: not a GGUF LoRA (general.type {info.metadata.get('general.type')!r}, "
                           f"adapter.type {info.metadata.get('adapter.type')!r})")
    weights = sorted({n.rsplit(".", 1)[0] for n in info.tensors if n.endswith((".lora_a", ".lora_b"))})
    applied = {gguf_name(f"layers.0.{k}").split(".", 2)[2] for k in QWEN35_TARGETS}  # "attn_q.weight", ...
    skipped = [w for w in weights if not w.startswith("blk.") or w.split(".", 2)[2] not in applied]
    if skipped:
        raise AdapterSkipped(f"{path}: {len(skipped)} weight(s) that llama.cpp's {QWEN35.name} graph does not run "
                             f"LoRA on, so they would be silently ignored: {', '.join(skipped)}")
    wrong = [w for w in weights if w not in base.tensors
             or base.tensors[w].shape[:2] != (info.tensors[f"{w}.lora_a"].shape[0],
                                              info.tensors[f"{w}.lora_b"].shape[1])]
    named = str(info.metadata.get("general.base_model.name_or_path", ""))
    if info.architecture != base.architecture or wrong:
        raise AdapterMismatch(f"{path} ({info.architecture}, trained on {named or 'a base it does not name'}) does "
                              f"not fit {base.path} ({base.architecture}, {base.metadata.get('general.name', '')})"
                              + (f": {', '.join(wrong[:8])}" if wrong else ""),
                              fix="serve the adapter over the GGUF of the release it was trained on")
    ranks = {info.tensors[f"{w}.lora_a"].shape[1] for w in weights}
    return LoraFacts(str(path), "gguf", max(ranks, default=0), float(info.metadata.get("adapter.lora.alpha", 0.0)),
                     named, tuple(sorted({w.split(".", 2)[2].removesuffix(".weight") for w in weights})),
                     len(weights))


def lora_facts(lora: str | Path, base: GGUFInfo) -> LoraFacts:
    """Read and check an adapter (PEFT folder or GGUF LoRA) against a qwen35 base: AdapterError when it cannot
    serve over it (another base, tensors llama.cpp would skip, options it cannot apply)."""
    lora = Path(lora)
    if is_gguf_lora(lora):
        return _gguf_lora_facts(lora, base)
    peft = read_peft(adapter_folder(lora))
    refuse_skipped(peft)
    check_against(peft, base)
    return LoraFacts(str(lora), "peft", peft.r, peft.alpha, peft.base, peft.targets, len(peft.matrices))


def lora_digest(lora: str | Path) -> str:
    """sha256 over the adapter's bytes (a GGUF LoRA, or a PEFT folder's config and weights): a pairing record's."""
    lora = Path(lora)
    files = [lora] if is_gguf_lora(lora) else [adapter_folder(lora) / n for n in (ADAPTER_CONFIG, ADAPTER_WEIGHTS)]
    h = hashlib.sha256()
    for path in files:
        with path.open("rb") as f:
            for chunk in iter(lambda: f.read(1 << 20), b""):
                h.update(chunk)
    return h.hexdigest()


def lora_file_bytes(lora: str | Path) -> int:
    """The adapter's weights as llama.cpp holds them: a GGUF LoRA's tensors, or a PEFT adapter's matrices in float32
    (as converted), read from the headers alone."""
    lora = Path(lora)
    if is_gguf_lora(lora):
        return sum(t.n_bytes or 0 for t in read_gguf(lora).tensors.values())
    header = read_header(adapter_folder(lora) / ADAPTER_WEIGHTS)
    return sum(4 * int(np.prod(e.shape)) for name, e in header.entries.items() if _KEY.match(name))


@dataclass(frozen=True)
class ConvertedLora:
    """`clef-bridge lora`'s result: the GGUF LoRA written and the adapter's facts."""

    path: Path
    bytes: int
    lora: LoraFacts

    def to_dict(self) -> dict:
        return {"path": str(self.path), "bytes": self.bytes, "lora": self.lora.to_dict()}


def convert_lora_file(adapter: str | Path, gguf: str | Path, out: str | Path | None = None) -> ConvertedLora:
    """A PEFT adapter written as a GGUF LoRA for this qwen35 base (for llama-server's --lora too); default out:
    <adapter>.lora.gguf beside the adapter folder."""
    adapter = Path(adapter)
    if is_gguf_lora(adapter):
        raise AdapterError(f"{adapter} is a GGUF file already", fix="name it as `lora` in models.toml as it is")
    info = read_gguf(gguf)
    facts = lora_facts(adapter, info)
    path = write_gguf_lora(read_peft(adapter_folder(adapter)), info,
                           Path(out) if out else adapter.with_name(f"{adapter.name}.lora.gguf"))
    return ConvertedLora(path, path.stat().st_size, facts)
