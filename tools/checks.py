"""check and pair: integrity reports for models.toml entries or loose files, and pairing records."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..bridge.integrity import ModelRefused, Report, check_pair
from ..bridge.loading import inspect_spec, load_checked, open_model
from ..bridge.provenance import default_pair_path, pair_record
from ..bridge.registry import ModelSpec, Registry, model_spec

IO_CODES = ("gguf.missing", "head.missing")
CHECK_CONTEXT = 4096  # enough for the canaries; keeps a check's llama.cpp context small


@dataclass(frozen=True)
class CheckResult:
    reports: tuple[tuple[str | None, Report], ...]  # (models.toml name or None, report)

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
    report: Report

    @property
    def ok(self) -> bool:
        return self.report.accepted

    def to_dict(self) -> dict[str, Any]:
        return {"path": str(self.path), "head_sha256": self.head_sha256, "fingerprint_rows": self.fingerprint_rows,
                "canary_requests": self.canary_requests, "report": self.report.to_dict()}


def file_spec(gguf: Path, head: Path | None, pair: Path | None = None) -> ModelSpec:
    keys: dict[str, Any] = {"n_ctx": CHECK_CONTEXT, "max_length": CHECK_CONTEXT}
    if pair is not None:
        keys["pair"] = str(pair)
    return model_spec("check", gguf, head, **keys)


def check_spec(spec: ModelSpec) -> Report:
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


def check_files(gguf: Path, head: Path | None, pair: Path | None) -> CheckResult:
    return CheckResult(((None, check_spec(file_spec(gguf, head, pair))),))


def pair_files(gguf: Path, head: Path, output: Path | None) -> PairResult:
    """Write a pairing record for a GGUF and head that pass the static checks."""
    spec = file_spec(gguf, head)
    report = check_pair(gguf, head)  # an older record beside the GGUF is being replaced, not checked
    out = output or default_pair_path(gguf)
    if not report.accepted:
        return PairResult(out, "", 0, 0, report)
    model, _ = open_model(spec, Path(report.head))
    try:
        record = pair_record(gguf, head, model)
    finally:
        model.close()
    out.write_text(json.dumps(record, indent=1) + "\n", encoding="utf-8")
    return PairResult(out, record["head_sha256"], len(record["fingerprint"]["row_ids"]), len(record["canaries"]),
                      report)
