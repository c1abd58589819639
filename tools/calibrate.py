"""calibrate: one temperature per question type, fitted on random halves, kept only if it helps held out."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import numpy as np

from .evaldata import Example, gold_index
from .scoring import Decision, brier, ece, fit_temperature, nll, temperature_scaled

SPLITS = 20
MIN_ITEMS = 30  # fewer labelled decisions of a type: held-out halves of ~15 cannot tell temperatures apart
T_BOUNDS = (0.05, 20.0)  # fit_temperature's search interval

# one labelled question: its raw logits (prompt order) and the gold option's index there
Item = tuple[np.ndarray, int]


@dataclass(frozen=True)
class Calibration:
    kind: str
    n: int
    current: float  # the temperature configured now
    fitted: float  # median over the splits
    iqr: tuple[float, float]
    heldout_nll_current: float  # mean over the splits, held-out halves
    heldout_nll_fitted: float
    before: dict[str, float]  # ECE, Brier, NLL on all items at the current temperature
    after: dict[str, float]  # ... at the fitted one

    @property
    def at_bound(self) -> bool:
        return any(abs(self.fitted - b) / b < 0.01 for b in T_BOUNDS)

    @property
    def accepted(self) -> bool:
        return self.n >= MIN_ITEMS and not self.at_bound and self.heldout_nll_fitted < self.heldout_nll_current

    @property
    def reason(self) -> str:
        """Why the fitted temperature was declined ('' when accepted)."""
        if self.n < MIN_ITEMS:
            return (f"too little data: {self.n} labelled {self.kind} decisions, at least {MIN_ITEMS} are needed for "
                    "held-out halves to tell temperatures apart")
        if self.at_bound:
            return (f"the fit hit its search bound ({self.fitted:.3g}, bounds {T_BOUNDS}): the labels and logits "
                    "do not pin a temperature down (too little or degenerate data)")
        if not self.heldout_nll_fitted < self.heldout_nll_current:
            return (f"held-out NLL does not improve ({self.heldout_nll_current:.4f} -> "
                    f"{self.heldout_nll_fitted:.4f})")
        return ""

    @property
    def temperature(self) -> float:
        return round(self.fitted, 3) if self.accepted else self.current


def _decisions(items: list[Item], t: float) -> list[Decision]:
    return [Decision(temperature_scaled(z, t), g) for z, g in items]


def _summary(items: list[Item], t: float) -> dict[str, float]:
    ds = _decisions(items, t)
    return {"ece": ece(ds), "brier": brier(ds), "nll": nll(ds)}


def calibrate_items(kind: str, items: list[Item], current: float = 1.0, splits: int = SPLITS,
                    seed: int = 0) -> Calibration:
    rng = np.random.default_rng(seed)
    fitted, nll_current, nll_fitted = [], [], []
    for _ in range(splits):
        order = rng.permutation(len(items))
        fit_half = [items[i] for i in order[: len(items) // 2]]
        held_out = [items[i] for i in order[len(items) // 2:]]
        t = fit_temperature(fit_half)
        fitted.append(t)
        nll_current.append(nll(_decisions(held_out, current)))
        nll_fitted.append(nll(_decisions(held_out, t)))
    t_median = float(np.median(fitted))
    q25, q75 = (float(v) for v in np.percentile(fitted, [25, 75]))
    return Calibration(kind, len(items), current, t_median, (q25, q75), float(np.mean(nll_current)),
                       float(np.mean(nll_fitted)), _summary(items, current), _summary(items, t_median))


def collect_items(decide: Callable[[Any], Any], examples: list[Example]) -> dict[str, list[Item]]:
    """Raw logits of every labelled question, through a decision service (a body in, its Decision out)."""
    items: dict[str, list[Item]] = {}
    for example in examples:
        for question, logits in decide(example.request).logits:
            if question.id in example.labels:
                order = tuple(oid for oid, _ in question.options)
                items.setdefault(question.type, []).append(
                    (logits, gold_index(question, example.labels[question.id], order)))
    return items


@dataclass(frozen=True)
class CalibrateResult:
    model: str
    calibrations: tuple[Calibration, ...]
    temperatures: dict[str, float]  # what the model should use: accepted fits, current values elsewhere
    written: Path | None  # the models.toml updated with --write

    @property
    def ok(self) -> bool:
        return True

    def to_dict(self) -> dict[str, Any]:
        return {"model": self.model, "temperatures": self.temperatures,
                "written": str(self.written) if self.written else None,
                "types": [{**{k: v for k, v in vars(c).items()}, "accepted": c.accepted, "reason": c.reason}
                          for c in self.calibrations]}


def calibrate(decide: Callable[[Any], Any], examples: list[Example], current: dict[str, float]
              ) -> tuple[Calibration, ...]:
    """One Calibration per question type present in the labelled examples (decide: a decision service's)."""
    items = collect_items(decide, examples)
    return tuple(calibrate_items(kind, kind_items, current[kind]) for kind, kind_items in sorted(items.items()))
