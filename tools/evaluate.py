"""eval: run labelled requests through a server (or a model in-process) and report quality, errors first."""

from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import aiohttp

from ..bridge.host.progress import Progress
from .evaldata import Example, decision_from_answer
from .scoring import Decision, accuracy, brier, coverage_at_precision, ece, macro_f1, nll, reliability, score_errors

TARGETS = (0.95, 0.99)


@dataclass
class Outcome:
    example: Example
    response: dict[str, Any] | None = None
    error: str | None = None


@dataclass
class EvalReport:
    requests: int
    errors: list[dict[str, Any]]
    by_type: dict[str, dict[str, Any]]
    by_question: dict[str, dict[str, Any]]
    overall: dict[str, Any]
    decisions: dict[str, list[Decision]] = field(repr=False, default_factory=dict)

    @property
    def ok(self) -> bool:
        return not self.errors

    def to_dict(self) -> dict[str, Any]:
        return {"requests": self.requests, "errors": len(self.errors), "error_examples": self.errors[:50],
                "overall": self.overall, "by_type": self.by_type, "by_question": self.by_question}


def metrics(ds: list[Decision], kind: str | None) -> dict[str, Any]:
    out: dict[str, Any] = {"n": len(ds), "accuracy": accuracy(ds), "ece": ece(ds), "brier": brier(ds),
                           "nll": nll(ds)}
    if kind == "choice":
        out["macro_f1"] = macro_f1(ds)
    if kind == "score":
        out |= score_errors(ds)
    out["coverage"] = {str(t): vars(coverage_at_precision(ds, t)) for t in TARGETS}
    return out


def build_report(outcomes: list[Outcome]) -> EvalReport:
    errors = [{"line": o.example.line, "error": o.error} for o in outcomes if o.error is not None]
    by_type: dict[str, list[Decision]] = {}
    by_question: dict[str, tuple[str, list[Decision]]] = {}
    for o in outcomes:
        if o.response is None:
            continue
        for qid, gold in o.example.labels.items():
            question = o.example.questions[qid]
            d = decision_from_answer(question, o.response["answers"][qid], gold)
            by_type.setdefault(question.type, []).append(d)
            by_question.setdefault(qid, (question.type, []))[1].append(d)
    everything = [d for ds in by_type.values() for d in ds]
    return EvalReport(
        requests=len(outcomes), errors=errors,
        by_type={t: metrics(ds, t) for t, ds in sorted(by_type.items())},
        by_question={q: {"type": t, **metrics(ds, t)} for q, (t, ds) in sorted(by_question.items())},
        overall=metrics(everything, None), decisions=by_type)


async def _run_http(url: str, examples: list[Example], concurrency: int, api_key: str | None,
                    progress: Progress) -> list[Outcome]:
    outcomes = [Outcome(e) for e in examples]
    queue = iter(outcomes)
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}

    async def worker(session: aiohttp.ClientSession) -> None:
        for outcome in queue:
            try:
                async with session.post(f"{url}/v1/systemone", json=outcome.example.request, headers=headers) as r:
                    body = await r.json(content_type=None)
                    if r.status == 200:
                        outcome.response = body
                    else:
                        outcome.error = f"HTTP {r.status}: {json.dumps(body)[:300]}"
            except (aiohttp.ClientError, asyncio.TimeoutError, json.JSONDecodeError) as exc:
                outcome.error = f"{type(exc).__name__}: {exc}"
            progress.update(1)

    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=600)) as session:
        await asyncio.gather(*(worker(session) for _ in range(max(concurrency, 1))))
    return outcomes


def run_http(url: str, examples: list[Example], concurrency: int = 4, api_key: str | None = None) -> list[Outcome]:
    progress = Progress("eval", len(examples), unit="requests")
    try:
        return asyncio.run(_run_http(url.rstrip("/"), examples, concurrency, api_key, progress))
    finally:
        progress.close()


def run_local(respond: Callable[[dict], dict], examples: list[Example]) -> list[Outcome]:
    from ..head.errors import ClefError

    progress = Progress("eval", len(examples), unit="requests")
    outcomes = []
    for example in examples:
        outcome = Outcome(example)
        try:
            outcome.response = respond(example.request)
        except ClefError as exc:
            outcome.error = f"{exc.error_type}: {exc}"
        outcomes.append(outcome)
        progress.update(1)
    progress.close()
    return outcomes


def _fmt(v: Any) -> str:
    return "-" if v is None or (isinstance(v, float) and v != v) else f"{v:.3f}" if isinstance(v, float) else str(v)


def markdown(report: EvalReport) -> str:
    lines = ["# Evaluation report", "", f"**Errors: {len(report.errors)} of {report.requests} requests** "
             "(a failed request is an error, never a dropped example)", ""]
    for e in report.errors[:20]:
        lines.append(f"- line {e['line']}: {e['error']}")
    cols = ["n", "accuracy", "macro_f1", "exact", "within_one", "mae", "ece", "brier", "nll"]
    lines += ["", "| scope | " + " | ".join(cols) + " | coverage@0.95 (threshold) | coverage@0.99 (threshold) |",
              "|" + " --- |" * (len(cols) + 3)]
    rows = [("all", report.overall)] + [(f"type {t}", m) for t, m in report.by_type.items()] + \
        [(f"question {q}", m) for q, m in report.by_question.items()]
    for scope, m in rows:
        cov = [f"{m['coverage'][str(t)]['coverage']:.3f} ({_fmt(m['coverage'][str(t)]['threshold'])})"
               for t in TARGETS]
        lines.append(f"| {scope} | " + " | ".join(_fmt(m.get(c)) for c in cols) + " | " + " | ".join(cov) + " |")
    return "\n".join(lines) + "\n"


def write_report(report: EvalReport, out: Path) -> list[str]:
    """report.json, report.md and, with matplotlib installed, the plots; returns notes for the user."""
    from .plots import coverage_curves, reliability_diagrams

    out.mkdir(parents=True, exist_ok=True)
    (out / "report.json").write_text(json.dumps(report.to_dict(), indent=2) + "\n", encoding="utf-8")
    (out / "report.md").write_text(markdown(report), encoding="utf-8")
    notes = [f"wrote {out / 'report.json'} and {out / 'report.md'}"]
    bins = {t: reliability(ds) for t, ds in report.decisions.items()}
    notes.append(reliability_diagrams(bins, out / "reliability.png"))
    notes.append(coverage_curves(report.decisions, out / "coverage.png"))
    return notes
