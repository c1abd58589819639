"""Cloudflare's reference code as an oracle, from clef-finetune's unmodified vendored copy.

Used by the tests and by bench-head; it needs the test extra (torch) and
`pip install --no-deps clef-finetune==0.1.0`. The product never imports it.
"""

from __future__ import annotations

import hashlib
import importlib.util
import sys
from functools import cache
from pathlib import Path
from typing import Any

import numpy as np
from clef_bridge.head.config import HeadConfig
from clef_bridge.head.errors import Category, ClefError
from clef_bridge.head.model import Layout

REFERENCE_SHA256 = "0e304cf7c6500e8bb59bef7e2afd2c6373f82596dfb3b57d1aa93c175e2dc3a3"
INSTALL_HINT = "pip install -e '.[test]' && pip install --no-deps clef-finetune==0.1.0"


class ReferenceUnavailable(ClefError):
    """torch or clef-finetune is not installed."""

    category = Category.HOST
    error_type = "reference_unavailable"


@cache
def reference() -> Any:
    """The joint_schema_model module; refuses a vendored file whose sha256 drifted."""
    for package in ("torch", "clef_finetune"):
        if importlib.util.find_spec(package) is None:
            raise ReferenceUnavailable(f"{package} is not installed", fix=INSTALL_HINT)
    spec = importlib.util.find_spec("clef_finetune")
    path = Path(spec.origin).parent / "_vendor" / "joint_schema_model.py"
    return load_pinned(path, REFERENCE_SHA256, "clef_reference_joint_schema_model")


def load_pinned(path: Path, sha256: str, name: str) -> Any:
    """A reference file imported as module `name`, refused when its sha256 is not the pinned one."""
    digest = hashlib.sha256(path.read_bytes()).hexdigest()
    if digest != sha256:
        raise RuntimeError(f"{path}: sha256 {digest}, expected {sha256}; the oracle drifted")
    module_spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(module_spec)
    sys.modules[name] = module  # its dataclasses look the module up in sys.modules
    module_spec.loader.exec_module(module)
    return module


def torch_head(cfg: HeadConfig, flat: dict[str, np.ndarray]) -> Any:
    """The reference JointSchemaHead in float32 holding exactly these weights."""
    import torch

    head = reference().JointSchemaHead(**{k: v for k, v in vars(cfg).items()})
    head.load_state_dict({k: torch.from_numpy(np.array(v, dtype=np.float32)) for k, v in flat.items()}, strict=True)
    return head.eval()


def reference_record(input_ids: np.ndarray, layout: Layout) -> Any:
    """An EncodedRecord for the reference head from our layout."""
    ref = reference()
    bounds = list(layout.option_offsets) + [len(layout.option_spans)]
    questions = tuple(
        ref.EncodedQuestion(
            question_id=f"q{i}",
            question_type=int(layout.types[i]),
            question_span=tuple(int(v) for v in layout.question_spans[i]),
            option_spans=tuple((int(s), int(e)) for s, e in layout.option_spans[bounds[i]:bounds[i + 1]]),
            option_ids=tuple(str(j) for j in range(bounds[i + 1] - bounds[i])),
        )
        for i in range(len(layout.types))
    )
    return ref.EncodedRecord(input_ids=tuple(int(t) for t in input_ids), questions=questions, record_id="x")


def reference_logits(head: Any, hidden: np.ndarray, input_ids: np.ndarray, layout: Layout,
                     output_embedding: np.ndarray) -> np.ndarray:
    """The reference head's logits, flat in layout order, float32."""
    import torch

    record = reference_record(input_ids, layout)
    with torch.inference_mode():
        out = head(
            torch.from_numpy(np.asarray(hidden, dtype=np.float32))[None],
            torch.from_numpy(np.asarray(input_ids, dtype=np.int64))[None],
            torch.ones((1, len(input_ids)), dtype=torch.long),
            [record],
            torch.from_numpy(np.asarray(output_embedding, dtype=np.float32)),
        )[0]
    return torch.cat(out).numpy()


ROUNDING = 5e-5  # answers carry 4 decimals


def assert_same_answers(got: dict[str, dict], want: dict[str, dict], tolerance: float) -> float:
    """Every field of our answers against the reference's systemone answers; the worst probability diff.

    Probabilities (and noul) within tolerance plus both sides' rounding. What follows from them within
    the bound those differences give: `confidence` (the chosen option's or the top probability) by the
    largest difference, the expected level `score` by sum_i i * |dp_i|, `choice` wherever the reference's
    top two are further apart than twice the largest difference. Legends and key order exactly.
    """
    assert list(got) == list(want), "questions differ"
    worst = 0.0
    for qid, ours in got.items():
        ref = want[qid]
        assert set(ours) == set(ref) and ours["type"] == ref["type"], (qid, sorted(ours), sorted(ref))
        if ours["type"] == "noul":
            worst = max(worst, abs(ours["noul"] - ref["noul"]))
            assert abs(ours["noul"] - ref["noul"]) <= tolerance + 2 * ROUNDING, (qid, ours, ref)
            continue
        assert list(ours["probabilities"]) == list(ref["probabilities"]), qid
        dp = {k: abs(ours["probabilities"][k] - p) for k, p in ref["probabilities"].items()}
        largest = max(dp.values())
        worst = max(worst, largest)
        assert largest <= tolerance + 2 * ROUNDING, (qid, dp)
        assert abs(ours["confidence"] - ref["confidence"]) <= largest + 1e-9, (qid, ours, ref)
        if ours["type"] == "score":
            assert ours["legend"] == ref["legend"], qid
            bound = sum(int(k) * (d + 2 * ROUNDING) for k, d in dp.items()) + 2 * ROUNDING
            assert abs(ours["score"] - ref["score"]) <= bound, (qid, ours["score"], ref["score"], bound)
        else:
            low, high = sorted(ref["probabilities"].values())[-2:]
            if high - low > 2 * largest + 4 * ROUNDING:
                assert ours["choice"] == ref["choice"], (qid, ours, ref)
    return worst
