"""The Clef-omni test cases: requests with text, images and audio, test clips, and how answers are compared."""

from __future__ import annotations

import io
import wave
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from .fixturegen_vision import encoded, picture

SCHEMA = {
    "urgent": {"type": "noul", "instructions": "Is the customer's problem urgent?"},
    "team": {"type": "choice", "instructions": "Which team should handle it?",
             "criteria": {"billing": "Invoices, refunds and payments", "tech": "Bugs, outages and errors",
                          "sales": "Plans, upgrades and quotes"}},
    "mood": {"type": "score", "instructions": "How upset is the customer?",
             "criteria": ["calm", "annoyed", "angry", "furious"]},
}
STATE = {"ticket": "My dashboard shows a 502 error since this morning and our checkout is down.",
         "customer": {"plan": "pro", "since": 2021}, "attachments": "see the screenshot and the voice note"}


def tone(seconds: float, seed: int = 0, rate: int = 16000) -> np.ndarray:
    """A deterministic test clip: a chirp, a tone and noise, float32 in [-1, 1], on the 16-bit grid (so a 16-bit
    WAV of it decodes to exactly these samples)."""
    rng = np.random.default_rng(seed)
    t = np.arange(int(round(seconds * rate))) / rate
    x = 0.4 * np.sin(2 * np.pi * (200 + 300 * t) * t) + 0.2 * np.sin(2 * np.pi * 1100 * t)
    x += 0.05 * rng.standard_normal(t.shape)
    x *= np.minimum(1, 20 * t)
    return (np.round(x * 32767) / 32768).astype(np.float32)


def wav(samples: np.ndarray, rate: int = 16000) -> bytes:
    """16-bit mono PCM WAV bytes of samples on the 16-bit grid (tone's)."""
    out = io.BytesIO()
    with wave.open(out, "wb") as w:
        w.setnchannels(1)
        w.setsampwidth(2)
        w.setframerate(rate)
        w.writeframes(np.round(np.asarray(samples) * 32768).astype("<i2").tobytes())
    return out.getvalue()


@dataclass(frozen=True)
class Case:
    """One request: its text body, its images (encoded PNG bytes) and audio clips (samples), in prompt order."""

    body: dict[str, Any]
    images: tuple[bytes, ...] = ()
    audio: tuple[np.ndarray, ...] = field(default=(), compare=False)

    @property
    def medium(self) -> str:
        return "audio" if self.audio else "image" if self.images else "text"


def cases() -> dict[str, Case]:
    """Text (short, long), one and two images, clips of 0.5 to 9.3 s (whole seconds, whole frames, and lengths that
    are neither), and an image with two clips of lengths that are not whole frames (the processor batches them)."""
    base = {"model": "clef-omni", "state": STATE, "questions": SCHEMA}
    long_state = {**STATE, "log": " ".join(f"line {i}: retry failed" for i in range(60))}
    png = lambda w, h, seed: encoded(picture(w, h, seed=seed), "PNG")  # noqa: E731
    return {
        "text": Case(base),
        "text_long": Case(dict(base, state=long_state)),
        "image": Case(base, (png(300, 200, 1),)),
        "image2": Case(base, (png(256, 256, 2), png(200, 420, 3))),
        "audio_0.5": Case(base, audio=(tone(0.5, 1),)),
        "audio_1.0": Case(base, audio=(tone(1.0, 2),)),
        "audio_1.7": Case(base, audio=(tone(1.70037, 3),)),
        "audio_9.3": Case(base, audio=(tone(9.3, 5),)),
        "image_audio": Case(base, (png(300, 200, 1),), (tone(1.70037, 3), tone(0.50311, 1))),
    }


def probabilities(model, prepared, hidden: np.ndarray) -> dict[str, np.ndarray]:
    """Our unrounded probabilities per question (the reference's option order) from hidden states."""
    from clef_bridge.head.answer import softmax64

    logits = model.logits(prepared.encoded, hidden)
    bounds = list(prepared.encoded.layout.option_offsets) + [len(logits)]
    return {q.id: softmax64(logits[s:e]) for q, s, e in zip(prepared.request.questions, bounds, bounds[1:])}


def max_dp(ours: dict[str, np.ndarray], ref: dict[str, np.ndarray]) -> float:
    assert ours.keys() == ref.keys()
    return max(float(np.abs(np.asarray(ours[q]) - ref[q]).max()) for q in ours)


def answer_probabilities(answers: dict[str, Any]) -> dict[str, np.ndarray]:
    """Each answer's (rounded) probabilities in option order, for answer_problems' tie check."""
    return {q: np.array([a["noul"], 1 - a["noul"]]) if a["type"] == "noul" else np.array(list(a["probabilities"]
                                                                                             .values()))
            for q, a in answers.items()}


ROUNDING = 5e-5  # answers carry 4 decimals: two roundings apart by at most one unit of the 4th


def answer_problems(ours: dict[str, Any], ref: dict[str, Any], ref_probs: dict[str, np.ndarray],
                    tol: float) -> list[str]:
    """Every field of every answer compared (type, noul, choice, score, confidence, probabilities, legend): values
    within tol plus the rounding; the choice equal unless the reference's top two are within 2 x tol."""
    problems = []
    if ours.keys() != ref.keys():
        return [f"questions {list(ours)} != {list(ref)}"]
    for qid, want in ref.items():
        got = ours[qid]
        if got.keys() != want.keys() or got["type"] != want["type"]:
            problems.append(f"{qid}: fields {sorted(got)} != {sorted(want)}")
            continue
        for key, value in want.items():
            if key == "choice":
                top = np.sort(ref_probs[qid])[-2:]
                if got[key] != value and top[1] - top[0] > 2 * tol:
                    problems.append(f"{qid}.choice {got[key]!r} != {value!r}")
            elif key in ("noul", "score", "confidence"):
                # the score is the expected level index: each level's probability moves it by up to (n - 1) x tol
                bound = tol * (len(want["probabilities"]) - 1 if key == "score" else 1) + 2 * ROUNDING
                if abs(got[key] - value) > bound:
                    problems.append(f"{qid}.{key} {got[key]} != {value}")
            elif key == "probabilities":
                if list(got[key]) != list(value) or any(abs(got[key][k] - v) > tol + 2 * ROUNDING
                                                         for k, v in value.items()):
                    problems.append(f"{qid}.probabilities {got[key]} != {value}")
            elif got[key] != value:
                problems.append(f"{qid}.{key} {got[key]!r} != {value!r}")
    return problems
