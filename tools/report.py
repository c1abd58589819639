"""report: what a decision log says about the models that wrote it (tools/logdata.py reads it).

- agreement: per pair of primary and shadow model and per question, how often both gave the same top answer, and the
  mean and the largest |dp| over the options (lines with "shadows"; how each shadow's scorings went: answered,
  dropped, failed);
- drift: per model and question, the answers per time bucket (the share of each top answer, the mean probability of
  each option) and the largest change from the first bucket to the last;
- with labels: accuracy, Brier, ECE, NLL and reliability bins per model (all questions, and per type), and the
  temperature `calibrate` would fit (its calibrate_items) on the logs of the logged probabilities: log p is the
  logits over the temperature the answer was made at, less a per-question constant that softmax ignores, so the fit
  is a factor on that temperature (the model's configured one; 1 where none is).

The log is streamed: only counts, sums and the labelled questions' answers are held.
"""

from __future__ import annotations

import math
import re
from collections import Counter
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import numpy as np

from .calibrate import Calibration, calibrate_items
from .logdata import Answered, Label, Line, load_labels, log_paths, parse_line, read_records, utc
from .scoring import EPS, Decision, accuracy, brier, ece, nll, reliability

DEFAULT_BUCKET_HOURS = 24.0
SHOWN_PROBLEMS = 5  # label rows that did not join, listed by line


def _num(value: float | None, digits: int = 6) -> float | None:
    """A metric for JSON: rounded; NaN (nothing to measure) as null."""
    return None if value is None or math.isnan(value) else round(float(value), digits)


@dataclass(frozen=True)
class Agreement:
    """Primary and shadow on one question (question "" : on all of them together)."""

    question: str
    type: str  # "" for all questions together
    n: int  # decisions both answered with the same options
    agree: int  # ... with the same top answer
    mean_abs_dp: float  # mean |dp| over every option of those decisions
    max_abs_dp: float

    @property
    def share(self) -> float:
        return self.agree / self.n if self.n else math.nan

    def to_dict(self) -> dict[str, Any]:
        return {"question": self.question, "type": self.type, "n": self.n, "agree": self.agree,
                "agreement": _num(self.share), "mean_abs_dp": _num(self.mean_abs_dp),
                "max_abs_dp": _num(self.max_abs_dp)}


@dataclass(frozen=True)
class Pair:
    model: str  # the primary
    shadow: str
    lines: int  # lines naming the shadow
    outcomes: dict[str, int]  # of its scorings on those lines: "answered", "dropped", "failed: ..."
    overall: Agreement
    questions: tuple[Agreement, ...]
    missing: int  # questions the primary answered and the shadow did not
    mismatched: int  # questions both answered with different options (not compared)

    def to_dict(self) -> dict[str, Any]:
        overall = {k: v for k, v in self.overall.to_dict().items() if k not in ("question", "type")}
        return {"model": self.model, "shadow": self.shadow, "lines": self.lines, "outcomes": self.outcomes, **overall,
                "missing": self.missing, "mismatched": self.mismatched,
                "questions": [q.to_dict() for q in self.questions]}


@dataclass(frozen=True)
class Bucket:
    start: datetime  # UTC; buckets start at multiples of their width since 1970-01-01 (midnight UTC for 24 h)
    n: int
    top_share: dict[str, float]  # option -> share of the bucket's decisions with it on top
    mean_p: dict[str, float]  # option -> mean probability

    def to_dict(self) -> dict[str, Any]:
        return {"start": utc(self.start.timestamp(), "seconds"), "n": self.n,
                "top_share": {o: _num(v) for o, v in self.top_share.items()},
                "mean_p": {o: _num(v) for o, v in self.mean_p.items()}}


@dataclass(frozen=True)
class Change:
    """The option whose measure moved most from the first bucket to the last."""

    option: str
    first: float
    last: float

    @property
    def delta(self) -> float:
        return self.last - self.first

    def to_dict(self) -> dict[str, Any]:
        return {"option": self.option, "first": _num(self.first), "last": _num(self.last), "change": _num(self.delta)}


@dataclass(frozen=True)
class Drift:
    model: str
    question: str
    type: str
    options: tuple[str, ...]  # every option seen, in the order first seen
    buckets: tuple[Bucket, ...]  # those holding decisions, oldest first
    top_change: Change | None  # of the top-answer shares; None with one bucket
    p_change: Change | None  # of the mean probabilities

    @property
    def n(self) -> int:
        return sum(b.n for b in self.buckets)

    def to_dict(self) -> dict[str, Any]:
        return {"model": self.model, "question": self.question, "type": self.type, "options": list(self.options),
                "n": self.n, "buckets": [b.to_dict() for b in self.buckets],
                "largest_change": {"top_share": self.top_change.to_dict() if self.top_change else None,
                                   "mean_p": self.p_change.to_dict() if self.p_change else None}}


@dataclass(frozen=True)
class Quality:
    """One model's decisions against the labels: all questions (type "all") or one question type."""

    model: str
    type: str
    n: int
    accuracy: float
    brier: float
    ece: float
    nll: float
    reliability: tuple[tuple[float, float, int], ...]  # (mean confidence, accuracy, count) per non-empty bin
    calibration: Calibration | None  # per question type: calibrate's fit on the logged probabilities

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"model": self.model, "type": self.type, "n": self.n, "accuracy": _num(self.accuracy),
                               "brier": _num(self.brier), "ece": _num(self.ece), "nll": _num(self.nll),
                               "reliability": [[_num(c), _num(a), k] for c, a, k in self.reliability]}
        c = self.calibration
        if c is not None:
            out["temperature"] = {
                "factor": _num(c.fitted), "iqr": [_num(v) for v in c.iqr], "accepted": c.accepted, "reason": c.reason,
                "suggested": c.temperature, "heldout_nll_logged": _num(c.heldout_nll_current),
                "heldout_nll_fitted": _num(c.heldout_nll_fitted), "after": {k: _num(v) for k, v in c.after.items()}}
        return out


@dataclass(frozen=True)
class LabelJoin:
    path: str
    rows: int
    joined: int  # rows that met exactly one decision
    unmatched: int  # rows no decision answered
    ambiguous: int  # rows several decisions answered (a batch's states, where the row names no state_sha256)
    invalid: int  # joined rows whose label is not among a model's options
    problems: tuple[str, ...]  # the first rows that did not join, by line

    def to_dict(self) -> dict[str, Any]:
        return {"path": self.path, "rows": self.rows, "joined": self.joined, "unmatched": self.unmatched,
                "ambiguous": self.ambiguous, "invalid": self.invalid, "problems": list(self.problems)}


@dataclass(frozen=True)
class ReportResult:
    log: str
    files: tuple[str, ...]  # read in this order
    decisions: int  # lines read
    skipped: int  # JSON lines without a question the report can read
    untimed: int  # decision lines without a readable time (left out of the drift)
    first: str | None  # the earliest and latest time logged
    last: str | None
    models: dict[str, int]  # primary model -> its lines
    shadow_models: dict[str, int]  # shadow model -> the lines it answered on
    bucket_hours: float
    agreement: tuple[Pair, ...]
    drift: tuple[Drift, ...]
    labels: LabelJoin | None
    quality: tuple[Quality, ...]

    @property
    def ok(self) -> bool:
        return self.decisions > 0

    def to_dict(self) -> dict[str, Any]:
        return {"log": self.log, "files": list(self.files), "decisions": self.decisions, "skipped": self.skipped,
                "untimed": self.untimed, "first": self.first, "last": self.last, "models": self.models,
                "shadow_models": self.shadow_models, "bucket_hours": self.bucket_hours,
                "agreement": [p.to_dict() for p in self.agreement], "drift": [d.to_dict() for d in self.drift],
                "labels": self.labels.to_dict() if self.labels else None,
                "quality": [q.to_dict() for q in self.quality]}


@dataclass
class _Agree:
    type: str = ""
    n: int = 0
    agree: int = 0
    options: int = 0
    sum_abs: float = 0.0
    max_abs: float = 0.0

    def add(self, a: Answered, b: np.ndarray) -> None:
        diff = np.abs(a.p - b)
        self.n += 1
        self.agree += int(np.argmax(a.p)) == int(np.argmax(b))
        self.options += len(diff)
        self.sum_abs += float(diff.sum())
        self.max_abs = max(self.max_abs, float(diff.max()))

    def result(self, question: str) -> Agreement:
        mean = self.sum_abs / self.options if self.options else math.nan
        return Agreement(question, self.type, self.n, self.agree, mean, self.max_abs if self.n else math.nan)


@dataclass
class _PairStats:
    lines: int = 0
    outcomes: Counter = field(default_factory=Counter)
    missing: int = 0
    mismatched: int = 0
    overall: _Agree = field(default_factory=_Agree)
    questions: dict[str, _Agree] = field(default_factory=dict)


@dataclass
class _DriftStats:
    type: str
    options: dict[str, None] = field(default_factory=dict)  # ordered as first seen
    buckets: dict[int, tuple[list[int], Counter, Counter]] = field(default_factory=dict)  # [n], tops, sum of p


class _Reader:
    """The report's accumulators, fed one line at a time."""

    def __init__(self, bucket_s: float, labels: list[Label]):
        self.bucket_s = bucket_s
        self.decisions = self.skipped = self.untimed = 0
        self.first = self.last = None
        self.models: Counter = Counter()
        self.shadow_models: Counter = Counter()
        self.pairs: dict[tuple[str, str], _PairStats] = {}
        self.drift: dict[tuple[str, str, str], _DriftStats] = {}  # by model, question id and type
        self.labels: dict[tuple[str, str, str | None], Label] = {label.key: label for label in labels}
        self.matches: dict[int, list[dict[str, Answered]]] = {}  # label line -> each match's answers by model

    def add(self, record: dict[str, Any]) -> None:
        line = parse_line(record)
        if line is None:
            self.skipped += 1
            return
        self.decisions += 1
        self.models[line.model] += 1
        if line.time is None:
            self.untimed += 1
        else:
            self.first = line.time if self.first is None else min(self.first, line.time)
            self.last = line.time if self.last is None else max(self.last, line.time)
            self._drift(line, line.time)
        for shadow, outcome in line.outcomes.items():
            self.shadow_models[shadow] += 1
            stats = self.pairs.setdefault((line.model, shadow), _PairStats())
            stats.lines += 1
            stats.outcomes[outcome] += 1
            if shadow in line.shadows:
                self._agree(line, stats, line.shadows[shadow])
        if self.labels:
            self._match(line)

    def _agree(self, line: Line, stats: _PairStats, answers: dict[str, Answered]) -> None:
        for qid, a in line.answers.items():
            b = answers.get(qid)
            if b is None:
                stats.missing += 1
            elif set(b.options) != set(a.options) or len(b.options) != len(a.options):
                stats.mismatched += 1
            else:
                p = np.array([b.p[b.options.index(o)] for o in a.options])  # the shadow's, in the primary's order
                stats.overall.add(a, p)
                stats.questions.setdefault(qid, _Agree(a.type)).add(a, p)

    def _drift(self, line: Line, at: float) -> None:
        index = math.floor(at / self.bucket_s)
        for qid, a in line.answers.items():
            stats = self.drift.setdefault((line.model, qid, a.type), _DriftStats(a.type))
            stats.options.update(dict.fromkeys(a.options))
            count, tops, sums = stats.buckets.setdefault(index, ([0], Counter(), Counter()))
            count[0] += 1
            tops[a.top] += 1
            for option, p in zip(a.options, a.p):
                sums[option] += float(p)

    def _match(self, line: Line) -> None:
        for qid, a in line.answers.items():
            for key in {(line.request_id, qid, line.state_sha256), (line.request_id, qid, None)}:
                label = self.labels.get(key)
                if label is not None:
                    by_model = {line.model: a} | {m: s[qid] for m, s in line.shadows.items() if qid in s}
                    self.matches.setdefault(label.line, []).append(by_model)

    def agreement(self) -> tuple[Pair, ...]:
        return tuple(Pair(model, shadow, s.lines, dict(s.outcomes.most_common()), s.overall.result(""),
                          tuple(q.result(qid) for qid, q in sorted(s.questions.items())), s.missing, s.mismatched)
                     for (model, shadow), s in sorted(self.pairs.items()))

    def drifts(self) -> tuple[Drift, ...]:
        out = []
        for (model, qid, _), s in sorted(self.drift.items()):
            options = tuple(s.options)
            buckets = tuple(Bucket(datetime.fromtimestamp(index * self.bucket_s, timezone.utc), count[0],
                                   {o: tops[o] / count[0] for o in options},
                                   {o: sums[o] / count[0] for o in options})
                            for index, (count, tops, sums) in sorted(s.buckets.items()))
            out.append(Drift(model, qid, s.type, options, buckets, _change(buckets, "top_share"),
                             _change(buckets, "mean_p")))
        return tuple(out)


def _change(buckets: tuple[Bucket, ...], measure: str) -> Change | None:
    """The option that moved most between the first bucket and the last (the first such option on ties)."""
    if len(buckets) < 2:
        return None
    first, last = getattr(buckets[0], measure), getattr(buckets[-1], measure)
    option = max(first, key=lambda o: abs(last[o] - first[o]))
    return Change(option, first[option], last[option])


def quality(items: dict[tuple[str, str], list[tuple[np.ndarray, int]]]) -> tuple[Quality, ...]:
    """Per model, all its labelled decisions (type "all"), then each question type with calibrate's temperature fit
    on the log-probabilities (relative to the temperature they were made at: current = 1)."""
    out = []
    for model in sorted({m for m, _ in items}):
        kinds = sorted(kind for m, kind in items if m == model)
        every = [Decision(p, g) for kind in kinds for p, g in items[model, kind]]
        out.append(_quality(model, "all", every, None))
        for kind in kinds:
            fit = calibrate_items(kind, [(np.log(np.maximum(p, EPS)), g) for p, g in items[model, kind]], 1.0)
            out.append(_quality(model, kind, [Decision(p, g) for p, g in items[model, kind]], fit))
    return tuple(out)


def _quality(model: str, kind: str, ds: list[Decision], fit: Calibration | None) -> Quality:
    return Quality(model, kind, len(ds), accuracy(ds), brier(ds), ece(ds), nll(ds), tuple(reliability(ds)), fit)


def join_labels(path: Path, labels: list[Label], matches: dict[int, list[dict[str, Answered]]]
                ) -> tuple[LabelJoin, dict[tuple[str, str], list[tuple[np.ndarray, int]]]]:
    """Each label row with the one decision it names: the join's counts, and (p, gold) per model and question type."""
    items: dict[tuple[str, str], list[tuple[np.ndarray, int]]] = {}
    joined = unmatched = ambiguous = invalid = 0
    problems: list[str] = []
    for label in labels:
        found = matches.get(label.line, [])
        where = f"question {label.question!r} of request {label.request_id!r}"
        if not found:
            unmatched += 1
            problems.append(f"line {label.line}: no decision in the log answered {where}"
                            + (" for that state_sha256" if label.state_sha256 else ""))
            continue
        if len(found) > 1:
            ambiguous += 1
            problems.append(f"line {label.line}: {len(found)} decisions answered {where} (the states of a batch): "
                            "add the state_sha256 of the one labelled")
            continue
        joined += 1
        bad = []
        for model, answer in found[0].items():
            gold = label.gold(answer)
            if gold is None:
                bad.append(f"{model}'s options are {list(answer.options)}")
            else:
                items.setdefault((model, answer.type), []).append((answer.p, gold))
        if bad:
            invalid += 1
            problems.append(f"line {label.line}: label {label.label!r} of {where} is not an option: {'; '.join(bad)}")
    join = LabelJoin(str(path), len(labels), joined, unmatched, ambiguous, invalid, tuple(problems[:SHOWN_PROBLEMS]))
    return join, items


def build_report(log: Path, labels_path: Path | None = None, bucket_hours: float = DEFAULT_BUCKET_HOURS
                 ) -> ReportResult:
    """The report of the log at `log` (a file, its rotated files read first, or the folder holding it)."""
    files = log_paths(log)
    labels = load_labels(labels_path) if labels_path is not None else []  # its errors before the long read
    reader = _Reader(bucket_hours * 3600, labels)
    for record in read_records(files):
        reader.add(record)
    join, items = join_labels(labels_path, labels, reader.matches) if labels_path is not None else (None, {})
    return ReportResult(str(log), tuple(str(f) for f in files), reader.decisions, reader.skipped, reader.untimed,
                        utc(reader.first) if reader.first is not None else None,
                        utc(reader.last) if reader.last is not None else None,
                        dict(reader.models.most_common()), dict(reader.shadow_models.most_common()), bucket_hours,
                        reader.agreement(), reader.drifts(), join, quality(items))


def _file_name(*parts: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", "-".join(parts))


def write_plots(result: ReportResult, folder: Path) -> list[str]:
    """PNGs in folder: a reliability diagram per model (with labels), the answers over time per model and question;
    what was written, or that matplotlib is missing."""
    from . import plots

    if not plots.available():
        return [f"matplotlib is not installed (pip install '.[plots]'): no plots written to {folder}"]
    folder.mkdir(parents=True, exist_ok=True)
    notes, used = [], set()

    def path(*parts: str) -> Path:
        name, n = _file_name(*parts), 1
        while name in used:
            n += 1
            name = _file_name(*parts, str(n))
        used.add(name)
        return folder / f"{name}.png"

    for model in dict.fromkeys(q.model for q in result.quality):
        bins = {f"{model} {q.type}": list(q.reliability) for q in result.quality if q.model == model}
        notes.append(plots.reliability_diagrams(bins, path("reliability", model)))
    for d in result.drift:
        starts = [b.start for b in d.buckets]
        notes.append(plots.drift_chart(f"{d.model} / {d.question}", starts,
                                       {o: [b.top_share[o] for b in d.buckets] for o in d.options},
                                       {o: [b.mean_p[o] for b in d.buckets] for o in d.options},
                                       path("drift", d.model, d.question)))
    return notes
