"""drift: the same requests through two backbones with one head; how far the probabilities move."""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Any, Callable

import numpy as np

from ..head.answer import softmax64

CONFIDENT = 0.8


@dataclass
class DriftStats:
    decisions: int = 0
    options: int = 0
    max_abs: float = 0.0
    sum_abs: float = 0.0
    flips: int = 0
    confident: int = 0  # decisions where backbone A was at least CONFIDENT sure
    confident_flips: int = 0

    def add(self, a: np.ndarray, b: np.ndarray) -> None:
        diff = np.abs(a - b)
        self.decisions += 1
        self.options += len(a)
        self.max_abs = max(self.max_abs, float(diff.max()))
        self.sum_abs += float(diff.sum())
        flipped = int(a.argmax()) != int(b.argmax())
        self.flips += flipped
        if a.max() >= CONFIDENT:
            self.confident += 1
            self.confident_flips += flipped

    def summary(self) -> dict[str, Any]:
        return {"decisions": self.decisions, "max_abs_dp": round(self.max_abs, 6),
                "mean_abs_dp": round(self.sum_abs / max(self.options, 1), 6), "argmax_flips": self.flips,
                f"decisions_above_{CONFIDENT}": self.confident, f"flips_above_{CONFIDENT}": self.confident_flips}


@dataclass(frozen=True)
class DriftResult:
    a: str
    b: str
    requests: int
    source: str  # "built-in probes" or the data file
    by_type: dict[str, dict[str, Any]]  # "all" and each question type: DriftStats.summary()

    @property
    def ok(self) -> bool:
        return True

    def to_dict(self) -> dict[str, Any]:
        return {"a": self.a, "b": self.b, "requests": self.requests, "source": self.source, **self.by_type}


def drift(decide_a: Callable[[Any], Any], decide_b: Callable[[Any], Any], requests: list[dict[str, Any]]
          ) -> dict[str, dict[str, Any]]:
    """Per question type (and "all"): max and mean |dp|, argmax flips, flips among confident decisions; decide_a and
    decide_b: each backbone's decision service (a body in, its bridge.service Decision out)."""
    stats: dict[str, DriftStats] = {"all": DriftStats()}
    for request in requests:
        for (q, za), (_, zb) in zip(decide_a(request).logits, decide_b(request).logits):
            a, b = softmax64(za), softmax64(zb)
            stats["all"].add(a, b)
            stats.setdefault(q.type, DriftStats()).add(a, b)
    return {kind: s.summary() for kind, s in stats.items()}


STATES = ["My card was charged twice for the same order and I want one refunded.",
          "The nightly export job failed three times; the dashboard shows stale numbers.",
          "Can you add dark mode to the mobile app? I use it at night a lot.",
          "Our contract renews next month; we want 40 more seats and a discount.",
          "The package arrived broken and the support line hung up on me twice.",
          "What is the difference between the Pro and the Team plan?",
          "I love the new search, it found an invoice from 2019 in a second!",
          "Please delete my account and every record you hold about me."]
TEAMS = {"billing": "payments, invoices and refunds", "tech": "bugs and outages", "sales": "plans and pricing",
         "privacy": "data requests", "shipping": "deliveries", "product": "feature requests"}


def probe_requests(n: int = 24, seed: int = 0) -> list[dict[str, Any]]:
    """A built-in, varied probe set: every question type, 2 to 6 options, 3 to 5 levels, mixed schemas.

    24 requests: the demo against itself takes about 7 s on 2 cores (40 took 11 s); a 9B on a GPU, less."""
    rng = random.Random(seed)
    out = []
    for i in range(n):
        names = rng.sample(sorted(TEAMS), rng.randint(2, 6))
        questions: dict[str, Any] = {
            "route": {"type": "choice", "instructions": "Which team should handle it?",
                      "criteria": {k: TEAMS[k] for k in names}},
            "urgent": {"type": "noul", "instructions": "Is it urgent?"},
        }
        if i % 2 == 0:
            levels = ["calm", "annoyed", "angry", "furious", "livid"][: rng.randint(3, 5)]
            questions["mood"] = {"type": "score", "instructions": "How upset is the writer?", "criteria": levels}
        if i % 3 == 0:
            questions["positive"] = {"type": "noul", "instructions": "Is the message positive?",
                                     "criteria": {"true": "praise or thanks"}}
        state: Any = STATES[i % len(STATES)]
        if i % 4 == 1:
            state = {"message": state, "customer": {"plan": rng.choice(["free", "pro", "team"]), "id": 1000 + i}}
        out.append({"model": "probe", "state": state, "questions": questions})
    return out
