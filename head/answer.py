"""From option logits to typed answers, and System One's shape of them (the reference's systemone_answer, plus
options)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from .errors import Category, ClefError
from .schema import DecisionRequest, Question


class NonFiniteOutput(ClefError):
    """The head produced NaN or infinity: a backend fault, never a valid answer."""

    category = Category.UNAVAILABLE
    error_type = "non_finite_output"


@dataclass(frozen=True)
class AnswerOptions:
    # "<type>" or "<type>.<bucket>" -> T (llama.cpp's clef.decision.temperature.* keys); absent: 1.0
    temperature: dict[str, float] = field(default_factory=dict)
    confidence: str = "reference"  # "reference": p of the chosen option; "jev": TypeSafe's normalised formula

    def temperature_for(self, kind: str, n_options: int) -> float:
        """The bucket's temperature, else the type's, else 1 (llama-server's lookup order)."""
        bucket = next(name for name, most in BUCKETS if n_options <= most)
        return self.temperature.get(f"{kind}.{bucket}", self.temperature.get(kind, 1.0))


# llama-server's option-count buckets for temperatures: n <= 2, <= 5, <= 10, more
BUCKETS = (("2", 2), ("3_5", 5), ("6_10", 10), ("11", float("inf")))


def softmax64(logits: np.ndarray, temperature: float = 1.0) -> np.ndarray:
    """softmax((z - max z) / T) in float64, as llama-server computes it (dividing in float32 would round first)."""
    z = logits.astype(np.float64)
    e = np.exp((z - z.max()) / temperature)
    return e / e.sum()


def jev_choice_confidence(p: np.ndarray) -> float:
    n = len(p)
    return float((p.max() - 1 / n) / (1 - 1 / n))


def jev_score_confidence(p: np.ndarray) -> float:
    n = len(p)
    levels = np.arange(n)
    spread = np.abs(levels - (n - 1) / 2).mean()
    return float(max(0.0, 1 - (p * np.abs(levels - p.argmax())).sum() / spread))


@dataclass(frozen=True)
class NoulAnswer:
    id: str
    probability: float  # of "true", rounded to 4 decimals


@dataclass(frozen=True)
class ChoiceAnswer:
    id: str
    choice: str  # the most probable option, the first in request order on a tie
    confidence: float
    probabilities: tuple[tuple[str, float], ...]  # (option id, p) in the request's order


@dataclass(frozen=True)
class ScoreAnswer:
    id: str
    score: float  # the expected level, levels counted from 0
    confidence: float
    legend: tuple[tuple[str, Any], ...]  # (level "0", "1", ..., its description) lowest first
    probabilities: tuple[tuple[str, float], ...]  # (level, p) lowest first


Answer = NoulAnswer | ChoiceAnswer | ScoreAnswer  # one question's, rounded: what every front door renders


def option_probabilities(a: Answer) -> dict[str, float]:
    """An answer's probability of each option (a noul's of true and false)."""
    if isinstance(a, NoulAnswer):
        return {"true": a.probability, "false": round(1 - a.probability, 4)}
    return dict(a.probabilities)


def top(a: Answer) -> str:
    """The option an answer leans to: a noul's true from 0.5 on, a choice's choice, a score's most probable level."""
    if isinstance(a, NoulAnswer):
        return "true" if a.probability >= 0.5 else "false"
    if isinstance(a, ChoiceAnswer):
        return a.choice
    return max(a.probabilities, key=lambda level: level[1])[0]


def agreement(a: Answer, b: Answer) -> tuple[bool, float]:
    """Whether two answers to one question lean to the same option, and the largest |p_a - p_b| over its options."""
    pa, pb = option_probabilities(a), option_probabilities(b)
    return top(a) == top(b), round(max(abs(pa[k] - pb.get(k, 0.0)) for k in pa), 4)


def answer(question: Question, probabilities: np.ndarray, confidence: str) -> Answer:
    """probabilities: [n_options] in prompt order (question.options)."""
    by_id = {oid: float(p) for (oid, _), p in zip(question.options, probabilities)}
    if question.type == "noul":
        return NoulAnswer(question.id, round(by_id["true"], 4))
    ordered = np.array([by_id[k] for k in question.answer_keys])  # [n] in answer order
    rounded = tuple((k, round(by_id[k], 4)) for k in question.answer_keys)
    if question.type == "choice":
        best = question.answer_keys[int(ordered.argmax())]  # first maximum in request order, as the reference
        conf = by_id[best] if confidence == "reference" else jev_choice_confidence(ordered)
        return ChoiceAnswer(question.id, best, round(conf, 4), rounded)
    conf = float(ordered.max()) if confidence == "reference" else jev_score_confidence(ordered)
    return ScoreAnswer(question.id, round(float(sum(i * p for i, p in enumerate(ordered))), 4), round(conf, 4),
                       question.options, rounded)


def systemone_answer(a: Answer) -> dict[str, Any]:
    """An answer in System One's shape (the reference's systemone_answer; Jev's and Workers AI's answers)."""
    if isinstance(a, NoulAnswer):
        return {"type": "noul", "noul": a.probability}
    if isinstance(a, ChoiceAnswer):
        return {"type": "choice", "choice": a.choice, "confidence": a.confidence,
                "probabilities": dict(a.probabilities)}
    return {"type": "score", "score": a.score, "confidence": a.confidence, "legend": dict(a.legend),
            "probabilities": dict(a.probabilities)}


def systemone_answers(answers: tuple[Answer, ...]) -> dict[str, dict[str, Any]]:
    """System One's `answers`: each question's answer by its id, in the request's order."""
    return {a.id: systemone_answer(a) for a in answers}


def probabilities(request: DecisionRequest, logits: np.ndarray, offsets: np.ndarray,
                  options: AnswerOptions = AnswerOptions()) -> list[np.ndarray]:
    """Unrounded float64 probabilities per question, in prompt order, each at its temperature.

    logits: [n_options] flat in layout order; offsets: [n_q] first option of each question.
    """
    if not np.isfinite(logits).all():
        raise NonFiniteOutput("the head produced non-finite logits; the backend is faulty, retry later")
    bounds = list(offsets) + [len(logits)]
    return [softmax64(logits[start:end], options.temperature_for(q.type, end - start))
            for q, start, end in zip(request.questions, bounds, bounds[1:])]


def answers(request: DecisionRequest, logits: np.ndarray, offsets: np.ndarray,
            options: AnswerOptions = AnswerOptions()) -> tuple[Answer, ...]:
    """The answer of each question (rounded to 4 decimals), in the request's order."""
    return tuple(answer(q, p, options.confidence)
                 for q, p in zip(request.questions, probabilities(request, logits, offsets, options)))
