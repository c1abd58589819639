"""Labelled data: JSONL lines of {"request": <System One request>, "labels": {question_id: gold}}.

gold is the option name for a choice, the level index for a score, and true/false for a noul.
"labels" may be left out (drift needs none; eval and calibrate score only the labelled questions).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from ..bridge.media.request import extract
from ..head.errors import Category, ClefError, RequestInvalid
from ..head.schema import Question, parse_request
from .scoring import Decision


class DataError(ClefError):
    category = Category.CONFIG
    error_type = "data_error"


@dataclass(frozen=True)
class Example:
    line: int
    request: dict[str, Any]
    questions: dict[str, Question]
    labels: dict[str, Any]


def gold_index(question: Question, gold: Any, order: tuple[str, ...]) -> int:
    """The gold option's index in `order` (a tuple of option ids)."""
    if question.type == "noul":
        return order.index("true" if gold else "false")
    return order.index(gold if question.type == "choice" else str(gold))


def _check_gold(question: Question, gold: Any) -> str | None:
    if question.type == "noul":
        return None if isinstance(gold, bool) else "a noul label must be true or false"
    if question.type == "choice":
        options = list(question.answer_keys)
        return None if gold in options else f"{gold!r} is not one of the options {options}"
    if isinstance(gold, bool) or not isinstance(gold, int) or not 0 <= gold < len(question.answer_keys):
        return f"a score label must be a level index from 0 to {len(question.answer_keys) - 1}"
    return None


def load_examples(path: str | Path) -> list[Example]:
    """Every line validated; one error lists the problems with their line numbers."""
    path = Path(path)
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError) as exc:
        raise DataError(f"{path}: cannot read: {exc}") from None
    examples, problems = [], []
    for number, text in enumerate(lines, start=1):
        if not text.strip():
            continue
        try:
            obj = json.loads(text)
        except json.JSONDecodeError as exc:
            problems.append(f"line {number}: not JSON: {exc}")
            continue
        if not isinstance(obj, dict) or not isinstance(obj.get("request"), dict) or \
                not isinstance(obj.get("labels", {}), dict):
            problems.append(f"line {number}: expected {{\"request\": {{...}}, \"labels\": {{question_id: gold}}}} "
                            "(labels may be left out)")
            continue
        try:  # its media taken out first, as the decision service does: a request with images or audio is data too
            request = parse_request(extract(obj["request"]).body)
        except RequestInvalid as exc:
            problems.append(f"line {number}: invalid request: {exc}")
            continue
        questions = {q.id: q for q in request.questions}
        labels = obj.get("labels", {})
        for qid, gold in labels.items():
            if qid not in questions:
                problems.append(f"line {number}: label for {qid!r}, which the request does not ask")
            elif (why := _check_gold(questions[qid], gold)) is not None:
                problems.append(f"line {number}: label {qid!r}: {why}")
        examples.append(Example(number, obj["request"], questions, labels))
    if problems:
        shown = problems[:20] + ([f"... and {len(problems) - 20} more"] if len(problems) > 20 else [])
        raise DataError(f"{path}: {len(problems)} problem(s):\n" + "\n".join(f"  {p}" for p in shown))
    if not examples:
        raise DataError(f"{path}: no examples")
    return examples


def decision_from_answer(question: Question, answer: dict[str, Any], gold: Any) -> Decision:
    """A scored decision from a System One answer (probabilities in the answer's order)."""
    if question.type == "noul":
        p = np.array([answer["noul"], 1 - answer["noul"]], dtype=float)
        order: tuple[str, ...] = ("true", "false")
    else:
        order = question.answer_keys
        p = np.array([answer["probabilities"][k] for k in order], dtype=float)
    return Decision(p / p.sum(), gold_index(question, gold, order))
