"""A decision log read back for `clef-bridge report`: its files (rotated ones first, oldest first), each line's answers
as probability vectors (the primary model's, and each shadow model's under "shadows"), and a labels file to join.

A line is the decision log's record (bridge/server/decision_log.py); shadow models add, per line,
`"shadows": [{"model": NAME, "outcome": "answered", "questions": [...]}]`: each question's id and answer, its type and
options those of the line's own question of that id where the shadow's leaves them out (a shadow whose outcome is
"dropped" or "failed: ..." comes without questions). A noul answer is the vector
(p("true"), p("false")); a choice's or a score's, its probabilities in the line's `options` order (the answer's own
order where a line has no options). The logged probabilities are rounded to 4 decimals: each vector is divided by its
sum, as `eval` does.
"""

from __future__ import annotations

import csv
import io
import json
import math
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Iterator

import numpy as np

from ..bridge.config.registry import DECISION_LOG_NAME
from ..bridge.server.decision_log import log_files, read_log
from ..head.errors import Category, ClefError
from ..head.schema import QUESTION_TYPES
from .evaldata import DataError

LABEL_COLUMNS = ("request_id", "question", "label")
SHOWN = 20  # problems of a labels file listed in its error


class LogError(ClefError):
    """The log named cannot be read (a usage error: the command was pointed at the wrong path)."""

    category = Category.USAGE
    error_type = "log_unreadable"


@dataclass(frozen=True)
class Answered:
    """One question as one model answered it on one line."""

    type: str
    options: tuple[str, ...]
    p: np.ndarray  # in the options' order, summing to 1

    @property
    def top(self) -> str:
        return self.options[int(np.argmax(self.p))]  # the first maximum on ties, as the answers and scoring do


@dataclass(frozen=True)
class Line:
    """One decision line: when, which request (and state), and the answers of the primary model and its shadows."""

    time: float | None  # seconds since the epoch; None where the line's time cannot be read
    request_id: str
    state_sha256: str | None
    model: str
    answers: dict[str, Answered]  # question id -> the primary model's answer
    shadows: dict[str, dict[str, Answered]]  # shadow model -> question id -> its answer (the shadows that answered)
    outcomes: dict[str, str]  # shadow model -> "answered", "dropped", "failed: ...": every shadow the line names


def _number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def answered(question: Any) -> tuple[str, Answered] | None:
    """A logged question's id and answer; None where it is not one (a field missing, a probability out of range)."""
    if not isinstance(question, dict) or not isinstance(question.get("id"), str) or \
            question.get("type") not in QUESTION_TYPES:
        return None
    answer = question.get("answer")
    if not isinstance(answer, dict):
        return None
    if question["type"] == "noul":
        value = answer.get("noul")
        if not _number(value) or not 0 <= value <= 1:
            return None
        options: tuple[str, ...] = ("true", "false")
        p = np.array([value, 1 - value], dtype=float)
    else:
        probabilities = answer.get("probabilities")
        if not isinstance(probabilities, dict) or not probabilities or \
                not all(_number(v) for v in probabilities.values()):
            return None
        listed = question.get("options")
        same = isinstance(listed, list) and all(isinstance(o, str) for o in listed) and \
            len(listed) == len(probabilities) and set(listed) == set(probabilities)
        options = tuple(listed) if same else tuple(probabilities)
        p = np.array([probabilities[o] for o in options], dtype=float)
    if (p < 0).any() or p.sum() <= 0:
        return None
    return question["id"], Answered(question["type"], options, p / p.sum())


def _answers(questions: Any, primary: dict[str, dict[str, Any]] | None = None) -> dict[str, Answered]:
    """The questions' answers by id; a shadow's question takes the type and options of the primary's of its id where
    it does not name its own."""
    if not isinstance(questions, list):
        return {}
    if primary is not None:
        questions = [{k: v for k, v in primary.get(q.get("id"), {}).items() if k in ("type", "options")} | q
                     if isinstance(q, dict) and isinstance(q.get("id"), str) else q for q in questions]
    found = (answered(q) for q in questions)
    return dict(a for a in found if a is not None)


def seconds(value: Any) -> float | None:
    """A logged time ("2026-12-06T09:55:38.391Z") as seconds since the epoch; None where it is not one."""
    if not isinstance(value, str):
        return None
    try:
        moment = datetime.fromisoformat(value)
    except ValueError:
        return None
    return (moment if moment.tzinfo else moment.replace(tzinfo=timezone.utc)).timestamp()


def utc(at: float, timespec: str = "milliseconds") -> str:
    """Seconds since the epoch as the log writes times: ISO 8601, UTC, with a Z."""
    return datetime.fromtimestamp(at, timezone.utc).isoformat(timespec=timespec).replace("+00:00", "Z")


def parse_line(record: dict[str, Any]) -> Line | None:
    """A record of the log as a Line; None where it holds no question the report can read."""
    questions = record.get("questions")
    answers = _answers(questions)
    if not answers:
        return None
    primary = {q["id"]: q for q in questions if isinstance(q, dict) and isinstance(q.get("id"), str)}
    shadows: dict[str, dict[str, Answered]] = {}
    outcomes: dict[str, str] = {}
    listed = record.get("shadows")
    for shadow in listed if isinstance(listed, list) else ():
        if isinstance(shadow, dict) and isinstance(shadow.get("model"), str):
            has_questions = isinstance(shadow.get("questions"), list)
            outcome = shadow.get("outcome")
            outcomes[shadow["model"]] = outcome if isinstance(outcome, str) else "answered" if has_questions else "?"
            if has_questions:
                shadows[shadow["model"]] = _answers(shadow["questions"], primary)
    rid, sha, model = record.get("request_id"), record.get("state_sha256"), record.get("model")
    return Line(seconds(record.get("time")), rid if isinstance(rid, str) else "",
                sha if isinstance(sha, str) else None, model if isinstance(model, str) else "?", answers, shadows,
                outcomes)


def log_paths(path: Path) -> list[Path]:
    """The files of the log at path (a file, or a folder holding decisions.jsonl), oldest first: its rotated files
    (.N ... .1), then itself."""
    target = path / DECISION_LOG_NAME if path.is_dir() else path
    fix = ("pass the file, or the folder, that models.toml's [server] decision_log names (its rotated files, "
           f"{DECISION_LOG_NAME}.1 and on, are read too)")
    try:
        files = log_files(target)
    except OSError as exc:
        raise LogError(f"cannot read the decision log {path}: {exc.strerror or exc}", fix=fix) from None
    if not files:
        where = f"{path} holds no {DECISION_LOG_NAME} nor rotated {DECISION_LOG_NAME}.N files" if path.is_dir() \
            else f"no decision log at {path} (nor rotated {path.name}.N files beside it)"
        raise LogError(where, fix=fix)
    return files


def read_records(files: list[Path]) -> Iterator[dict[str, Any]]:
    """Every record of the files, in order (read_log's: whole lines only, a torn last line left out)."""
    for file in files:
        try:
            yield from read_log(file)
        except OSError as exc:
            raise LogError(f"cannot read the decision log file {file}: {exc.strerror or exc}",
                           fix="run the report as a user who may read the log (the server writes it 0600)") from None


@dataclass(frozen=True)
class Label:
    """One labelled question of one logged decision."""

    line: int  # in the labels file (a CSV's header is line 1)
    request_id: str
    question: str
    label: str  # the option as the log names it: a choice's option, a score's level index, true/false for a noul
    state_sha256: str | None  # which state of a batch (several lines share its request id); None: any

    @property
    def key(self) -> tuple[str, str, str | None]:
        return self.request_id, self.question, self.state_sha256

    def gold(self, answer: Answered) -> int | None:
        """The label's index among the answer's options; None where it is not one of them."""
        name = self.label.lower() if answer.type == "noul" else self.label
        return answer.options.index(name) if name in answer.options else None


def _label_text(value: Any) -> str | None:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int) or (isinstance(value, float) and value.is_integer()):
        return str(int(value))
    if isinstance(value, str) and value.strip():
        return value.strip()
    return None


def _rows(path: Path, text: str) -> Iterator[tuple[int, Any]]:
    """(line number, row) of a CSV file (by its suffix, or where the text does not start with '{') or JSON lines."""
    if path.suffix.lower() == ".csv" or not text.lstrip().startswith("{"):
        reader = csv.DictReader(io.StringIO(text))
        missing = [c for c in LABEL_COLUMNS if c not in (reader.fieldnames or ())]
        if missing:
            raise DataError(f"{path}: a labels CSV needs the columns {', '.join(LABEL_COLUMNS)} (state_sha256 "
                            f"optional); {', '.join(missing)} missing from its header {reader.fieldnames or []}",
                            fix="or write JSON lines: {\"request_id\": ..., \"question\": ..., \"label\": ...}")
        for row in reader:
            yield reader.line_num, row
        return
    for number, line in enumerate(text.splitlines(), start=1):
        if line.strip():
            try:
                yield number, json.loads(line)
            except json.JSONDecodeError as exc:
                yield number, f"not JSON: {exc}"


def load_labels(path: Path) -> list[Label]:
    """A labels file, every row checked; one error lists the problems with their line numbers."""
    try:
        text = Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise DataError(f"{path}: cannot read: {exc}") from None
    labels, problems, seen = [], [], {}
    for number, row in _rows(Path(path), text):
        if isinstance(row, str):
            problems.append(f"line {number}: {row}")
            continue
        if not isinstance(row, dict):
            problems.append(f"line {number}: expected {{\"request_id\": ..., \"question\": ..., \"label\": ...}}")
            continue
        rid, question, sha = row.get("request_id"), row.get("question"), row.get("state_sha256") or None
        label = _label_text(row.get("label"))
        why = ("request_id must be a non-empty string" if not isinstance(rid, str) or not rid else
               "question must be a non-empty string (the question's id)" if not isinstance(question, str) or
               not question else
               "label must be an option: a choice's option, a score's level index, true or false" if label is None
               else "state_sha256 must be a string (the line's state_sha256)" if sha is not None and
               not isinstance(sha, str) else "")
        if why:
            problems.append(f"line {number}: {why}")
            continue
        item = Label(number, rid, question, label, sha)
        if item.key in seen:
            problems.append(f"line {number}: a second label for question {question!r} of request {rid!r}"
                            + (f" (state {sha[:12]})" if sha else "") + f"; the first is on line {seen[item.key]}")
            continue
        seen[item.key] = number
        labels.append(item)
    if problems:
        shown = problems[:SHOWN] + ([f"... and {len(problems) - SHOWN} more"] if len(problems) > SHOWN else [])
        raise DataError(f"{path}: {len(problems)} problem(s):\n" + "\n".join(f"  {p}" for p in shown))
    if not labels:
        raise DataError(f"{path}: no labels", fix="one {\"request_id\": ..., \"question\": ..., \"label\": ...} a line")
    return labels
