"""Does this GGUF belong with this head? Inspection functions returning typed findings.

Every check reads headers through memory maps; nothing loads a whole file into memory. The
`clef-bridge check` command prints these findings, and the server refuses to start on an error.
"""

from __future__ import annotations

import json
import os
import re
import shlex
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any

import numpy as np

from ...head.config import HeadConfig, config_path_for, load_config
from ...head.errors import Category, ClefError, HeadConfigError, HeadWeightsError
from ...head.weights import SafetensorsHeader, expected_shapes, read_header, read_tensors
from ..catalogue.architectures import CLEF_ARCHITECTURES, architecture
from ..gguf.clef_format import CLEF_ARCH
from ..gguf.clef_head import EmbeddedHead, validate_embedded_head
from ..gguf.lora import AdapterError, AdapterMismatch, AdapterSkipped, lora_digest, lora_facts
from ..gguf.projector import (
    PROJECTOR_HOME,
    ProjectorError,
    compute_bytes,
    max_image_tokens,
    pairing_problems,
    projector_for,
    projector_info,
)
from ..gguf.reader import GGUFError, GGUFInfo, StringArray, read_gguf, read_strings
from .memory_plan import layer_pattern
from .provenance import (
    MAX_CANARY_DIFF,
    MAX_NORM_DIFF,
    MAX_STATE_DRIFT,
    MIN_ROW_COSINE,
    WARN_CANARY_DIFF,
    WARN_STATE_DRIFT,
    canary_difference,
    compare_fingerprints,
    default_pair_path,
    fingerprint,
    sha256_file,
    state_drift,
)

PROMPT_TOKENS = ("<|im_start|>", "<|im_end|>", "<think>", "</think>")
SPECIAL_TYPES = (3, 4)  # CONTROL, USER_DEFINED
HEAD_HOME = ("get a llama.cpp `clef` GGUF, which embeds the head (ggml-org/Clef-Flash-GGUF, ggml-org/Clef-GGUF, "
             "bartowski/Cloudflare_clef-flash-GGUF), or the release's joint_head.safetensors + "
             "joint_head_config.json from Cloudflare/clef-flash (9B) or Cloudflare/clef (27B); `clef-bridge pull` "
             "fetches either")
HEADLESS = ("this qwen35 GGUF holds only the backbone; loaded without its joint head it runs and answers nonsense "
            "(the headless-GGUF trap)")


@dataclass(frozen=True)
class Finding:
    level: str  # "error" refuses the pair, "warning" is served with a warning, "info" is for the record
    code: str
    message: str
    fix: str = ""


@dataclass
class Facts:
    """What the checks found out about the files (None: not found out, or the check did not run)."""

    gguf_version: int | None = None
    architecture: str | None = None
    tensors: int | None = None
    embedding_length: int | None = None
    block_count: int | None = None
    vocab_size: int | None = None
    full_attention_layers: int | None = None
    head_source: str | None = None  # "safetensors" or "embedded" (a clef GGUF's own head)
    head_tensors: int | None = None
    head_config: dict[str, Any] | None = None
    head_matrices: str | None = None  # an embedded head's matrix type
    sha256: dict[str, str] = field(default_factory=dict)  # "gguf"/"head" -> the digest checked against a pin
    fingerprint_min_cosine: float | None = None
    fingerprint_norm_diff: float | None = None
    canary_state_drift: float | None = None
    canary_max_diff: float | None = None
    pair: str | None = None  # the pairing record read
    projector_checked: bool = False  # the projector checks ran; mmproj None then means text only
    mmproj: Path | None = None
    mmproj_type: str | None = None
    mmproj_width: int | None = None
    mmproj_weight_bytes: int | None = None
    mmproj_compute_bytes: int | None = None
    mmproj_deepstack_layers: int | None = None  # Qwen3-Omni's vision feeds this many layers besides the input
    mmproj_audio: str | None = None  # the audio encoder in the same projector (Qwen3-Omni's qwen3a)
    image_canary_drift: float | None = None
    verified_against: dict[str, Any] | None = None  # tools/verify.py's comparison with a release
    lora: dict[str, Any] | None = None  # the entry's LoRA adapter: rank, alpha, targets, base (gguf/lora.py LoraFacts)

    def to_dict(self) -> dict[str, Any]:
        """The facts found, by name (`check --json`'s "facts")."""
        out: dict[str, Any] = {}
        for f in fields(self):
            value = getattr(self, f.name)
            if f.name == "sha256":
                out |= {f"{label}_sha256": digest for label, digest in value.items()}
            elif f.name == "mmproj" and self.projector_checked:
                out["mmproj"] = str(value) if value else None
            elif f.name != "projector_checked" and value is not None:
                out[f.name] = value
        return out


@dataclass
class CheckReport:
    gguf: str
    head_path: str | None  # the head file checked (a clef GGUF's own path when embedded)
    findings: list[Finding] = field(default_factory=list)
    facts: Facts = field(default_factory=Facts)
    record: dict[str, Any] | None = field(default=None, repr=False)  # the pairing record, for the canaries
    embedded: EmbeddedHead | None = field(default=None, repr=False)  # the head read from a clef GGUF
    info: GGUFInfo | None = field(default=None, repr=False)  # the GGUF's header, read once for every check

    @property
    def accepted(self) -> bool:
        return not any(f.level == "error" for f in self.findings)

    @property
    def warnings(self) -> list[Finding]:
        return [f for f in self.findings if f.level == "warning"]

    @property
    def head_label(self) -> str:
        """The head as people read it: its path, or a clef GGUF's "(embedded head)", or "(no head)"."""
        return "(embedded head)" if self.facts.head_source == "embedded" else self.head_path or "(no head)"

    def add(self, level: str, code: str, message: str, fix: str = "") -> None:
        self.findings.append(Finding(level, code, message, fix))

    def to_dict(self) -> dict[str, Any]:
        return {"gguf": self.gguf, "head": self.head_path, "accepted": self.accepted, "facts": self.facts.to_dict(),
                "findings": [asdict(f) for f in self.findings]}


# --- the GGUF ----------------------------------------------------------------------------------

def check_gguf(path: Path, report: CheckReport) -> GGUFInfo | None:
    try:
        info = read_gguf(path)
        stored = info.metadata.get("tokenizer.ggml.tokens")
        tokens = read_strings(info, "tokenizer.ggml.tokens") if isinstance(stored, StringArray) else None
    except GGUFError as exc:
        fix = ("check the gguf path" if exc.code == "gguf.missing" else
               "re-download the GGUF; a truncated or foreign file cannot be served")
        report.add("error", exc.code, str(exc), fix)
        return None
    report.info = info
    facts = report.facts
    facts.gguf_version, facts.architecture, facts.tensors = info.version, info.architecture, len(info.tensors)
    for t in info.tensors.values():
        if t.n_bytes is None:
            report.add("error", "gguf.tensor_type", f"tensor {t.name} has unknown type {t.type}",
                       "update clef-bridge and llama-cpp-python, or use a GGUF of a common quantization")
            continue
        end = info.data_start + t.offset + t.n_bytes
        if end > info.file_size:
            report.add("error", "gguf.truncated", f"tensor {t.name} ends at byte {end} but the file has "
                       f"{info.file_size}: the download is incomplete", "download the GGUF again (resume)")
            break
        if t.offset % info.alignment:
            report.add("error", "gguf.alignment", f"tensor {t.name} at offset {t.offset} breaks the "
                       f"{info.alignment}-byte alignment", "the file is corrupt: download it again")
            break
    if info.architecture not in CLEF_ARCHITECTURES:
        report.add("error", "gguf.architecture", f"architecture {info.architecture!r} is not a Clef backbone "
                   f"(Clef uses {' or '.join(CLEF_ARCHITECTURES)})",
                   "use a GGUF converted from Cloudflare/clef-flash, Cloudflare/clef or Cloudflare/clef-omni")
        return info
    n_embd = info.arch_key("embedding_length")
    pattern = layer_pattern(info)
    facts.embedding_length, facts.block_count = n_embd, info.arch_key("block_count")
    facts.vocab_size = len(tokens) if isinstance(tokens, list) else None
    facts.full_attention_layers = sum(pattern) if pattern else None
    if not isinstance(n_embd, int):
        report.add("error", "gguf.metadata", f"{info.architecture}.embedding_length is missing",
                   "the GGUF's metadata is incomplete: convert it again with llama.cpp's converter")
    if pattern is None:
        report.add("error", "gguf.metadata", "the layer pattern (attention.recurrent_layers or "
                   "full_attention_interval) is missing", "convert the model again with llama.cpp's converter")
    output = info.tensors.get("output.weight") or info.tensors.get("token_embd.weight")
    if output is None:
        report.add("error", "gguf.output_embedding", "neither output.weight nor token_embd.weight is present; "
                   "the head's lexical prior needs the output embedding", "use a complete GGUF of the model")
    elif "output.weight" not in info.tensors:
        report.add("info", "gguf.tied_embedding", "no output.weight: the output embedding is tied to "
                   "token_embd.weight")
    if not isinstance(tokens, list):
        report.add("error", "gguf.tokenizer", "the GGUF has no tokenizer (tokenizer.ggml.tokens)",
                   "use a GGUF that carries its tokenizer")
        return info
    types = info.metadata.get("tokenizer.ggml.token_type")
    ids = {tok: i for i, tok in enumerate(tokens) if tok in PROMPT_TOKENS}
    missing = [t for t in PROMPT_TOKENS if t not in ids]
    plain = [t for t, i in ids.items() if isinstance(types, np.ndarray) and types[i] not in SPECIAL_TYPES]
    if missing or plain:
        report.add("error", "gguf.special_tokens", f"the tokenizer lacks the prompt's special tokens {missing}"
                   + (f" (plain tokens: {plain})" if plain else ""), "use the GGUF of a Clef release's backbone")
    if output is not None and len(output.shape) == 2:
        if isinstance(n_embd, int) and output.shape[0] != n_embd:
            report.add("error", "gguf.output_embedding", f"{output.name} rows have {output.shape[0]} values but "
                       f"the embedding length is {n_embd}", "the file is inconsistent: convert it again")
        if output.shape[1] < len(tokens):
            report.add("error", "pair.vocab", f"{output.name} has {output.shape[1]} rows but the tokenizer has "
                       f"{len(tokens)} tokens: token ids past row {output.shape[1] - 1} have no embedding",
                       "the GGUF's tokenizer and weights come from different models: use a consistent GGUF")
    return info


# --- the head ----------------------------------------------------------------------------------

SCALAR_RANGES = {"prior_logit_scale": (-10.0, 10.0), "joint_logit_scale": (-10.0, 10.0),
                 "residual_gate": (-20.0, 20.0)}


def find_head(gguf: Path) -> Path | None:
    """The head beside a GGUF: <stem>.head.safetensors, or joint_head.safetensors in the same folder."""
    for candidate in (gguf.with_name(f"{gguf.stem}.head.safetensors"), gguf.with_name("joint_head.safetensors")):
        if candidate.is_file():
            return candidate
    return None


def check_head(path: Path, report: CheckReport) -> tuple[HeadConfig, SafetensorsHeader] | None:
    if not path.is_file():
        report.add("error", "head.missing", f"{path}: no such file", HEAD_HOME)
        return None
    cfg = None
    config = config_path_for(path)
    if not config.is_file():
        report.add("error", "head.config_missing", f"{config}: not found beside the head", HEAD_HOME)
    else:
        try:
            cfg = load_config(config)
        except HeadConfigError as exc:
            report.add("error", "head.config_invalid", str(exc), HEAD_HOME)
    try:
        header = read_header(path)
    except HeadWeightsError as exc:
        report.add("error", "head.safetensors", str(exc), "the file is damaged: download it again")
        return None
    report.facts.head_tensors = len(header.entries)
    if cfg is None:
        return None
    report.facts.head_config = vars(cfg)
    want = expected_shapes(cfg)
    for name, shape in want.items():
        entry = header.entries.get(name)
        if entry is None:
            report.add("error", "head.tensor_missing", f"{name} (shape {list(shape)}) is missing", HEAD_HOME)
        elif entry.shape != shape:
            report.add("error", "head.tensor_shape", f"{name} has shape {list(entry.shape)}; "
                       f"joint_head_config.json implies {list(shape)}",
                       "the config and the weights disagree: download both from the same release")
    for name in header.entries.keys() - want.keys():
        report.add("error", "head.tensor_unexpected", f"{name} is not part of the joint schema head",
                   "the file is not a Clef joint head (or the config is for a different one)")
    if not report.accepted:
        return None
    tensors = read_tensors(path, header)
    bad = [n for n, t in tensors.items() if not np.isfinite(t).all()]
    for name in bad:
        report.add("error", "head.nonfinite", f"{name} holds NaN or infinite values", HEAD_HOME)
    for name, (lo, hi) in SCALAR_RANGES.items():
        value = float(tensors[name])
        if name not in bad and not lo <= value <= hi:
            report.add("warning", "head.scalar_range", f"{name} = {value:g} lies outside [{lo:g}, {hi:g}]",
                       "check that the head is the released one")
    return cfg, header


def shell_path(path: str | Path) -> str:
    """A path as a hint prints it: absolute (it works wherever the user stands), quoted for the shell."""
    return shlex.quote(os.path.abspath(path))


# --- together ----------------------------------------------------------------------------------

def check_pair(gguf: Path, head: Path | None) -> CheckReport:
    """Every check of a GGUF and its head; head None means the clef GGUF's own head, or the one beside the GGUF.

    For a clef GGUF with its embedded head, report.head_path is the GGUF itself and report.embedded holds the head.
    """
    gguf = Path(gguf)
    report = CheckReport(str(gguf), None)
    info = check_gguf(gguf, report)
    if head is None and info is not None and info.architecture == CLEF_ARCH:
        report.head_path = str(gguf)
        report.facts.head_source = "embedded"
        report.embedded = validate_embedded_head(info, report)
        if report.embedded is not None:
            report.facts.head_config = vars(report.embedded.config)
            report.facts.head_matrices = report.embedded.matrix_type
        return report
    head = Path(head) if head is not None else find_head(gguf)
    if head is None and info is None:
        return report  # the GGUF itself is unreadable: that finding says it all
    if head is None:
        report.add("error", "pair.headless", f"no head for {gguf.name}: {HEADLESS}",
                   f"{HEAD_HOME}; then put joint_head.safetensors and its joint_head_config.json beside the GGUF, or "
                   "name the head: `head = \"PATH\"` in the model's models.toml entry (serve, decide), `--head PATH` "
                   "on the command line (check, pair, drift)")
        return report
    report.head_path = str(head)
    report.facts.head_source = "safetensors"
    if info is not None and info.architecture == CLEF_ARCH:
        report.add("info", "clef.head_replaced", f"{gguf.name} embeds a head, but {head.name} is served instead")
    found = check_head(head, report)
    if info is None or found is None:
        return report
    cfg, _ = found
    n_embd = info.arch_key("embedding_length")
    if isinstance(n_embd, int) and cfg.hidden_size != n_embd:
        report.add("error", "pair.hidden_size", f"the head expects hidden_size {cfg.hidden_size} but the GGUF's "
                   f"embedding length is {n_embd}: this head belongs to another model",
                   "Clef-flash (9B) uses hidden 4096, Clef (27B) hidden 5120, Clef-omni (30B-A3B) hidden 2048: pair "
                   "each GGUF with its own head")
    return report


# --- provenance --------------------------------------------------------------------------------

def check_pins(report: CheckReport, gguf: Path, head: Path | None, gguf_sha256: str | None,
               head_sha256: str | None) -> None:
    for label, path, pin in (("gguf", gguf, gguf_sha256), ("head", head, head_sha256)):
        if not pin or path is None or not path.is_file():
            continue
        actual = sha256_file(path)
        report.facts.sha256[label] = actual
        if actual != pin.lower():
            report.add("error", f"pin.{label}_sha256", f"{path.name} has sha256 {actual}, but models.toml pins "
                       f"{pin}", "the file changed or is damaged: download it again, or update the pin")


def check_record(report: CheckReport, gguf: Path, head: Path, record: dict[str, Any]) -> None:
    """Compare a pairing record's head hash and backbone fingerprint with this GGUF and head."""
    if record.get("version") not in (1, 2):
        report.add("error", "pair.record", f"unknown pairing record version {record.get('version')!r}",
                   "write it again with `clef-bridge pair`")
        return
    if sha256_file(head) != record["head_sha256"]:
        report.add("error", "pair.head_changed", "the head is not the one this pairing record was made with",
                   "use the paired head, or pair again with `clef-bridge pair GGUF HEAD`")
    cosine, norm_diff = compare_fingerprints(record["fingerprint"], fingerprint(gguf, report.info))
    report.facts.fingerprint_min_cosine, report.facts.fingerprint_norm_diff = round(cosine, 4), round(norm_diff, 4)
    if cosine < MIN_ROW_COSINE or norm_diff > MAX_NORM_DIFF:
        report.add("error", "pair.backbone_mismatch", f"the backbone is not the one the head was paired with "
                   f"(sampled output rows: cosine {cosine:.3f}, at least {MIN_ROW_COSINE} expected; norm weights "
                   f"differ by {norm_diff:.3f})", "use a GGUF of the same release as the head (any quantization)")


def check_adapter(report: CheckReport, lora: Path) -> None:
    """The entry's LoRA adapter against its GGUF: its facts, or an error naming both when it cannot serve over it."""
    info = report.info
    if info is None:
        return
    arch = architecture(info.architecture)
    if arch is not None and arch.loads_as:  # a clef GGUF: its qwen35 backbone is checked when written, at load
        report.add("info", "lora.deferred", f"the adapter is checked against {Path(report.gguf).name}'s backbone "
                   "when it loads")
        return
    codes = {AdapterMismatch: "lora.base_mismatch", AdapterSkipped: "lora.skipped_tensors"}
    try:
        facts = lora_facts(lora, info)
    except (AdapterError, OSError) as exc:
        report.add("error", codes.get(type(exc), "lora.unreadable"), str(exc), getattr(exc, "fix", ""))
        return
    report.facts.lora = facts.to_dict()
    named = _plain(facts.base.rstrip("/").rsplit("/", 1)[-1])
    names = {v: _plain(v) for k, v in info.metadata.items()
             if isinstance(v, str) and re.fullmatch(r"general\.(name|basename|base_model\.\d+\.(name|repo_url))", k)
             and _plain(v)}
    if named and names and not any(named in n or n in named for n in names.values()):
        # a Hub id is the release it was trained on; a local folder's name may say nothing, so only a warning
        hub = re.fullmatch(r"[\w.-]+/[\w.-]+", facts.base) is not None
        report.add("error" if hub else "warning", "lora.base_name",
                   f"{lora} was trained on {facts.base}, but {Path(report.gguf).name} is "
                   f"{', '.join(map(repr, sorted(names)))} by its metadata",
                   "serve the adapter over the GGUF of the release it was trained on")


def _plain(name: str) -> str:
    """A model name for comparison: lower-case letters and digits only ("Cloudflare/clef-flash" -> "clefflash")."""
    return re.sub(r"[^a-z0-9]", "", name.lower())


def check_record_lora(report: CheckReport, record: dict[str, Any], lora: Path | None) -> None:
    """A head trained with an adapter is paired with that adapter: the record's adapter digest against the entry's."""
    recorded = record.get("lora_sha256")
    if lora is None and recorded:
        report.add("error", "pair.lora_missing", "the pairing record was made with a LoRA adapter, the entry has none",
                   "set `lora` to the adapter the head was trained with")
    elif lora is not None and recorded != lora_digest(lora):
        report.add("error", "pair.lora_changed", f"{lora} is not the adapter this pairing record was made with"
                   + ("" if recorded else " (the record has none)"),
                   f"use the paired adapter, or pair again with `clef-bridge pair GGUF HEAD --lora {shell_path(lora)}`")


def check_canaries(report: CheckReport, record: dict[str, Any], probabilities: list[dict[str, list[float]]],
                   states: list[dict[str, Any]]) -> None:
    """Compare the record's canaries (hidden states, then probabilities) with those of the loaded pair."""
    if "canary_states" not in record:
        report.add("info", "pair.record_v1", "the pairing record predates hidden-state canaries: a fine-tune of the "
                   "same base is caught only by its probabilities", "write it again with `clef-bridge pair`")
    else:
        drift = state_drift(record["canary_states"], states)
        report.facts.canary_state_drift = round(drift, 5)
        if drift > MAX_STATE_DRIFT:
            report.add("error", "pair.canary_mismatch", f"the canaries' hidden states moved by {drift:.4f} (mean 1 - "
                       f"cosine; at most {MAX_STATE_DRIFT} expected from quantization): the backbone's inner layers "
                       "are not the ones the head was paired with (another model or a fine-tune)",
                       "pair the head with its own backbone")
            return
        if drift > WARN_STATE_DRIFT:
            report.add("warning", "pair.canary_drift", f"the canaries' hidden states moved by {drift:.4f}: a coarse "
                       "quantization (or a small fine-tune); answers will differ measurably from the reference",
                       "prefer Q8_0 or F16 where memory allows (clef-bridge drift measures it)")
    diff = canary_difference(record["canaries"], probabilities)
    report.facts.canary_max_diff = round(diff, 4)
    if diff > MAX_CANARY_DIFF:
        report.add("error", "pair.canary_mismatch", f"canary probabilities moved by {diff:.3f} (at most "
                   f"{MAX_CANARY_DIFF} expected from quantization): the backbone's inner layers are not the ones "
                   "the head was paired with", "pair the head with its own backbone")
    elif diff > WARN_CANARY_DIFF and not any(f.code == "pair.canary_drift" for f in report.findings):
        report.add("warning", "pair.canary_drift", f"canary probabilities moved by {diff:.3f}: a coarse "
                   "quantization; answers will differ measurably from the reference",
                   "prefer Q8_0 or F16 where memory allows (clef-bridge drift measures it)")


def load_record(path: Path, report: CheckReport) -> dict[str, Any] | None:
    try:
        record = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        report.add("error", "pair.record", f"{path}: cannot read the pairing record: {exc}",
                   "write it again with `clef-bridge pair`")
        return None
    if not isinstance(record, dict) or not {"head_sha256", "fingerprint", "canaries"} <= record.keys():
        report.add("error", "pair.record", f"{path}: not a pairing record", "write it again with `clef-bridge pair`")
        return None
    return record


def check_all(gguf: Path, head: Path | None, pair: Path | None = None, gguf_sha256: str = "",
              head_sha256: str = "", want_record: bool = True, lora: Path | None = None) -> CheckReport:
    """Static checks, pins, and the static part of the pairing record (pair, or <gguf stem>.pair.json).

    The record's canaries need a loaded model: the loader runs them (check_canaries) with the record
    this report keeps in `record`.
    """
    report = check_pair(gguf, head)
    head = Path(report.head_path) if report.head_path else None
    check_pins(report, Path(gguf), head, gguf_sha256, head_sha256)
    if lora is not None:
        check_adapter(report, lora)
    default = default_pair_path(lora if lora is not None else gguf)  # a fine-tune's record lies beside its adapter
    pair = pair or (default if default.is_file() else None)
    if head is None or not report.accepted:
        return report
    if pair is None and want_record:
        report.add("warning", "pair.no_record", "no pairing record: nothing proves this backbone is the one the "
                   "head was trained with (a same-shape backbone of another model would answer nonsense)",
                   f"write one with `clef-bridge pair {shell_path(gguf)}"
                   f"{'' if report.embedded else ' ' + shell_path(head)}"
                   f"{'' if lora is None else ' --lora ' + shell_path(lora)}` once you trust the pair, or fetch it with "
                   "`clef-bridge pull`")
    if pair is None:
        return report
    report.facts.pair = str(pair)
    record = load_record(Path(pair), report)
    if record is not None:
        check_record(report, Path(gguf), head, record)
        check_record_lora(report, record, lora)
        report.record = record
    return report


class ModelRefused(ClefError):
    """A models.toml entry failed its integrity checks."""

    category = Category.REFUSED
    error_type = "model_refused"

    def __init__(self, name: str, report: CheckReport):
        self.name, self.report = name, report
        lines = [f"model {name!r} refused ({report.gguf} + {report.head_label}):"]
        for f in report.findings:
            if f.level == "error":
                lines.append(f"  {f.code}: {f.message}" + (f"\n    fix: {f.fix}" if f.fix else ""))
        super().__init__("\n".join(lines))


# --- the vision projector -------------------------------------------------------------------

def check_projector(report: CheckReport, gguf: Path, configured: Path | None) -> None:
    """The projector's findings on an entry's report: found or not, readable, paired with the backbone."""
    try:
        path = projector_for(gguf, configured)
    except ProjectorError as exc:
        report.add("error", "mmproj.ambiguous", str(exc), exc.fix)
        return
    report.facts.projector_checked, report.facts.mmproj = True, path  # None: text only (image requests get a 422)
    if path is None:
        return
    if not path.is_file():
        report.add("error", "mmproj.missing", f"{path}: no such projector file",
                   "fix mmproj in models.toml (relative paths start at the models.toml folder)")
        return
    try:
        info = projector_info(path)
    except (ProjectorError, GGUFError) as exc:
        report.add("error", "mmproj.invalid", str(exc), PROJECTOR_HOME)
        return
    facts = report.facts
    facts.mmproj_type, facts.mmproj_width = info.projector_type, info.n_embd
    facts.mmproj_weight_bytes = info.weight_bytes
    facts.mmproj_compute_bytes = compute_bytes(info, max_image_tokens(facts.architecture))
    facts.mmproj_deepstack_layers, facts.mmproj_audio = info.deepstack_layers, info.audio_type or None
    n_embd = facts.embedding_length
    for problem in pairing_problems(info, n_embd, facts.architecture or "") if isinstance(n_embd, int) else []:
        report.add("error", "mmproj.pairing", f"{path.name} does not fit this backbone: {problem}",
                   "use the mmproj GGUF converted from the same model as the backbone (Qwen3.5 for Clef and "
                   "Clef-flash, Qwen3-Omni for Clef-omni)")


def check_image_canary(report: CheckReport, record: dict, current: dict | None) -> None:
    """Compare a pairing record's image canary (hidden states of a fixed picture through the projector) with
    the loaded model's: a projector of the right width from another model or a fine-tune moves them."""
    recorded = record.get("image_canary")
    if recorded is None or current is None:
        if current is not None:
            report.add("info", "mmproj.no_canary", "the pairing record predates this projector: nothing proves it "
                       "is the backbone's own beyond its type and width", "write the record again with `clef-bridge "
                       "pair` once you trust the projector")
        return
    drift = state_drift([recorded], [current])
    report.facts.image_canary_drift = round(drift, 5)
    if drift > MAX_STATE_DRIFT:
        report.add("error", "mmproj.canary_mismatch", f"the image canary's hidden states moved by {drift:.4f} (mean "
                   f"1 - cosine; at most {MAX_STATE_DRIFT} expected from quantization): the projector is not the one "
                   "the pair was recorded with", "use the mmproj GGUF of this model, or pair again with it")
    elif drift > WARN_STATE_DRIFT:
        report.add("warning", "mmproj.canary_drift", f"the image canary's hidden states moved by {drift:.4f}: a "
                   "coarser projector or backbone quantization than the recorded one")
