"""check and pair: integrity reports for models.toml entries or loose files, and pairing records."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..bridge.catalogue.releases import CLOUDFLARE_NAMES, RELEASES
from ..bridge.config.integrity import CheckReport, ModelRefused, check_adapter, check_pair, check_projector
from ..bridge.config.provenance import default_pair_path, pair_record
from ..bridge.config.registry import ModelSpec, Registry, model_spec
from ..bridge.model.loading import inspect_spec, load_checked, open_model
from .verify import MIN_RELEASE_COSINE, Verification, VerifyError, verify_against

RELEASE_BY_WIDTH = {width: RELEASES[name].repo for width, name in CLOUDFLARE_NAMES.items()}

IO_CODES = ("gguf.missing", "head.missing")
CHECK_CONTEXT = 4096  # enough for the canaries; keeps a check's llama.cpp context small


@dataclass(frozen=True)
class CheckResult:
    reports: tuple[tuple[str | None, CheckReport], ...]  # (models.toml name or None, report)

    @property
    def ok(self) -> bool:
        return all(r.accepted for _, r in self.reports)

    @property
    def io_error(self) -> bool:
        return any(f.code in IO_CODES for _, r in self.reports for f in r.findings)

    def to_dict(self) -> dict[str, Any]:
        return {"accepted": self.ok, "reports": [{"model": n, **r.to_dict()} for n, r in self.reports]}


@dataclass(frozen=True)
class PairResult:
    path: Path
    head_sha256: str
    fingerprint_rows: int
    canary_requests: int
    report: CheckReport

    @property
    def ok(self) -> bool:
        return self.report.accepted

    def to_dict(self) -> dict[str, Any]:
        return {"path": str(self.path), "head_sha256": self.head_sha256, "fingerprint_rows": self.fingerprint_rows,
                "canary_requests": self.canary_requests, "report": self.report.to_dict()}


def file_spec(gguf: Path, head: Path | None, pair: Path | None = None, lora: Path | None = None) -> ModelSpec:
    keys: dict[str, Any] = {"n_ctx": CHECK_CONTEXT, "max_length": CHECK_CONTEXT}
    if pair is not None:
        keys["pair"] = str(pair)
    if lora is not None:
        keys["lora"] = str(lora)
    return model_spec("check", gguf, head, **keys)


def check_spec(spec: ModelSpec) -> CheckReport:
    """Every check the server runs before serving spec, canaries included (the model is loaded only for them)."""
    report = inspect_spec(spec)
    if not report.accepted or report.record is None:
        return report
    try:
        loaded = load_checked(spec)
    except ModelRefused as exc:
        return exc.report
    loaded.model.close()
    return loaded.report


def check_registry(registry: Registry) -> CheckResult:
    return CheckResult(tuple((name, check_spec(spec)) for name, spec in registry.models.items()))


def check_files(gguf: Path, head: Path | None, pair: Path | None, verify_repo: str | None = None,
                lora: Path | None = None) -> CheckResult:
    report = check_spec(file_spec(gguf, head, pair, lora))
    if verify_repo is not None and report.accepted:
        add_verification(report, verify_against(gguf, verify_repo or release_repo(report)))
    return CheckResult(((None, report),))


def release_repo(report: CheckReport) -> str:
    """The release repository of the head's model, by its width (Clef-flash 4096, Clef 5120)."""
    width = report.facts.embedding_length
    if width not in RELEASE_BY_WIDTH:
        raise VerifyError(f"no Clef release has hidden size {width}", fix="name the repository: --verify-against REPO")
    return RELEASE_BY_WIDTH[width]


def add_verification(report: CheckReport, verification: Verification) -> None:
    report.facts.verified_against = verification.to_dict()
    if verification.ok:
        report.add("info", "provenance.verified", f"sampled tensors equal {verification.repo}'s release (min row "
                   f"cosine {verification.min_cosine:.4f}, {verification.bytes_read} bytes read)")
    else:
        worst = min(verification.samples, key=lambda s: s.min_cosine)
        report.add("error", "provenance.release_mismatch", f"the GGUF is not {verification.repo}'s model: "
                   f"{worst.gguf_tensor} rows have cosine {worst.min_cosine:.3f} with the release's "
                   f"{worst.release_tensor} (at least {MIN_RELEASE_COSINE} expected from quantization)",
                   "use a GGUF converted from the release (a mislabelled repository, another model or a "
                   "fine-tune fails this)")


def pair_files(gguf: Path, head: Path | None, output: Path | None, verify_repo: str | None = None,
               mmproj: Path | None = None, lora: Path | None = None) -> PairResult:
    """Write a pairing record for a GGUF and head that pass the static checks (head None: embedded or beside).

    verify_repo: first compare the GGUF with that release ('' = the head's release by its width) and
    keep the result in the record; a mismatch writes no record.
    """
    spec = file_spec(gguf, head, lora=lora)
    report = check_pair(gguf, head)  # an older record beside the GGUF is being replaced, not checked
    check_projector(report, gguf, mmproj)  # a projector is loaded too, for the record's image canary
    if lora is not None:
        check_adapter(report, lora)
    if verify_repo is not None and report.accepted:
        add_verification(report, verify_against(gguf, verify_repo or release_repo(report)))
    out = output or default_pair_path(lora if lora is not None else gguf)
    if not report.accepted:
        return PairResult(out, "", 0, 0, report)
    model, _ = open_model(spec, report)
    try:
        record = pair_record(gguf, Path(report.head_path), model, lora)
    finally:
        model.close()
    if report.facts.verified_against is not None:
        record["verified_against"] = report.facts.verified_against
    out.write_text(json.dumps(record, indent=1) + "\n", encoding="utf-8")
    return PairResult(out, record["head_sha256"], len(record["fingerprint"]["row_ids"]), len(record["canaries"]),
                      report)
