"""calibrate: one temperature per question type, fitted on random halves, kept only if it helps held out."""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from .evaldata import Example, gold_index
from .metrics import Decision, brier, ece, fit_temperature, nll, temperature_scaled

SPLITS = 20

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
    def accepted(self) -> bool:
        return self.heldout_nll_fitted < self.heldout_nll_current

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


def collect_items(model, examples: list[Example]) -> dict[str, list[Item]]:
    """Raw logits of every labelled question, through a loaded ClefModel."""
    items: dict[str, list[Item]] = {}
    for example in examples:
        for question, logits in model.question_logits(example.request):
            if question.id in example.labels:
                order = tuple(oid for oid, _ in question.options)
                items.setdefault(question.type, []).append(
                    (logits, gold_index(question, example.labels[question.id], order)))
    return items


def write_temperature(models_toml: Path, name: str, temperatures: dict[str, float]) -> None:
    """Set `temperature = {...}` in the [models.NAME] table, leaving the rest of the file as it is."""
    text = models_toml.read_text(encoding="utf-8")
    header = re.search(rf"^\[models\.{re.escape(name)}\]\s*$", text, flags=re.MULTILINE)
    if header is None:
        raise ValueError(f"{models_toml} has no [models.{name}] table")
    end = re.search(r"^\[", text[header.end():], flags=re.MULTILINE)
    body_end = header.end() + (end.start() if end else len(text) - header.end())
    body = text[header.end():body_end]
    line = "temperature = {" + ", ".join(f"{k} = {v:g}" for k, v in sorted(temperatures.items())) + "}"
    if re.search(r"^temperature\s*=.*$", body, flags=re.MULTILINE):
        body = re.sub(r"^temperature\s*=.*$", line, body, count=1, flags=re.MULTILINE)
    else:
        body = "\n" + line + body
    models_toml.write_text(text[:header.end()] + body + text[body_end:], encoding="utf-8")
