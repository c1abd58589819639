"""Decision-quality metrics over (probabilities, gold) pairs; pure numpy, no model involved.

A decision is one question's answer: `p`, the probabilities of its options (in a fixed order), and
`gold`, the index of the right option. Its prediction is the argmax and its confidence the top
probability (for noul too: max(p, 1 - p)).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..head.answer import softmax64

ECE_BINS = 15
EPS = 1e-12


@dataclass(frozen=True)
class Decision:
    p: np.ndarray  # [n_options], sums to 1
    gold: int

    @property
    def predicted(self) -> int:
        return int(np.argmax(self.p))  # the first maximum on ties, as the answers do

    @property
    def confidence(self) -> float:
        return float(np.max(self.p))

    @property
    def correct(self) -> bool:
        return self.predicted == self.gold


def accuracy(ds: list[Decision]) -> float:
    return float(np.mean([d.correct for d in ds])) if ds else float("nan")


def ece(ds: list[Decision], bins: int = ECE_BINS) -> float:
    """Expected calibration error over equal-width confidence bins; empty bins count nothing."""
    if not ds:
        return float("nan")
    conf = np.array([d.confidence for d in ds])
    hit = np.array([d.correct for d in ds], dtype=float)
    index = np.minimum((conf * bins).astype(int), bins - 1)  # a confidence of 1.0 falls in the last bin
    total = 0.0
    for b in range(bins):
        mask = index == b
        if mask.any():
            total += mask.sum() / len(ds) * abs(hit[mask].mean() - conf[mask].mean())
    return float(total)


def reliability(ds: list[Decision], bins: int = ECE_BINS) -> list[tuple[float, float, int]]:
    """(mean confidence, accuracy, count) per non-empty bin, for reliability diagrams."""
    conf = np.array([d.confidence for d in ds])
    hit = np.array([d.correct for d in ds], dtype=float)
    index = np.minimum((conf * bins).astype(int), bins - 1)
    return [(float(conf[index == b].mean()), float(hit[index == b].mean()), int((index == b).sum()))
            for b in range(bins) if (index == b).any()]


def brier(ds: list[Decision]) -> float:
    """Multi-class Brier score: mean over decisions of sum_k (p_k - y_k)^2 (0 is perfect, 2 the worst)."""
    if not ds:
        return float("nan")
    return float(np.mean([((d.p - np.eye(len(d.p))[d.gold]) ** 2).sum() for d in ds]))


def nll(ds: list[Decision]) -> float:
    """Mean negative log-likelihood of the gold option."""
    if not ds:
        return float("nan")
    return float(np.mean([-np.log(max(float(d.p[d.gold]), EPS)) for d in ds]))


def macro_f1(ds: list[Decision]) -> float:
    """F1 per class (over classes that occur as gold or prediction), averaged."""
    if not ds:
        return float("nan")
    pred = np.array([d.predicted for d in ds])
    gold = np.array([d.gold for d in ds])
    scores = []
    for c in np.union1d(pred, gold):
        tp = np.sum((pred == c) & (gold == c))
        fp = np.sum((pred == c) & (gold != c))
        fn = np.sum((pred != c) & (gold == c))
        scores.append(0.0 if tp == 0 else 2 * tp / (2 * tp + fp + fn))
    return float(np.mean(scores))


def score_errors(ds: list[Decision]) -> dict[str, float]:
    """Scores: exact level, within one level, and the mean absolute error of the expected level."""
    if not ds:
        return {"exact": float("nan"), "within_one": float("nan"), "mae": float("nan")}
    expected = np.array([(np.arange(len(d.p)) * d.p).sum() for d in ds])
    gold = np.array([d.gold for d in ds])
    pred = np.array([d.predicted for d in ds])
    return {"exact": float(np.mean(pred == gold)), "within_one": float(np.mean(np.abs(pred - gold) <= 1)),
            "mae": float(np.mean(np.abs(expected - gold)))}


@dataclass(frozen=True)
class Coverage:
    target: float
    coverage: float  # share of decisions at or above the threshold
    threshold: float | None  # the lowest confidence that still keeps the precision; None: unreachable
    precision: float | None


def coverage_at_precision(ds: list[Decision], target: float) -> Coverage:
    """The largest share of decisions the model can take alone while those taken are right >= target."""
    if not ds:
        return Coverage(target, 0.0, None, None)
    conf = np.array([d.confidence for d in ds])
    hit = np.array([d.correct for d in ds], dtype=float)
    best = Coverage(target, 0.0, None, None)
    for t in np.unique(conf)[::-1]:  # thresholds at the observed confidences, ties taken together
        taken = conf >= t
        precision = hit[taken].mean()
        if precision >= target and taken.mean() > best.coverage:
            best = Coverage(target, float(taken.mean()), float(t), float(precision))
    return best


def temperature_scaled(logits: np.ndarray, t: float) -> np.ndarray:
    return softmax64(logits.astype(np.float64) / t)


def fit_temperature(items: list[tuple[np.ndarray, int]], lo: float = 0.05, hi: float = 20.0) -> float:
    """The T minimising the NLL of softmax(logits / T), by golden-section search on log T."""
    if not items:
        return 1.0

    def loss(log_t: float) -> float:
        t = float(np.exp(log_t))
        return sum(-np.log(max(temperature_scaled(z, t)[g], EPS)) for z, g in items)

    a, b = np.log(lo), np.log(hi)
    ratio = (np.sqrt(5) - 1) / 2
    c, d = b - ratio * (b - a), a + ratio * (b - a)
    fc, fd = loss(c), loss(d)
    for _ in range(60):
        if fc < fd:
            b, d, fd = d, c, fc
            c = b - ratio * (b - a)
            fc = loss(c)
        else:
            a, c, fc = c, d, fd
            d = a + ratio * (b - a)
            fd = loss(d)
    return float(np.exp((a + b) / 2))
