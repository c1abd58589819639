"""Cloudflare's clef-omni reference as an oracle: joint_schema_model.py from the ollajev==0.4.0 wheel, pinned
by sha256 and imported by path (nothing of ollajev is imported), as tests/reference.py pins the dense one.

The wheel is fetched once into .fixtures/wheels (tests/run.sh does it too) and that one file taken out of it.
The oracle runs the tiny random Qwen3-Omni (tests/fixturegen_omni.py) in transformers, float32 on the CPU,
with Qwen3-Omni's processor assembled without torchvision (fixturegen_omni.reference_processor).
"""

from __future__ import annotations

import json
import subprocess
import sys
import zipfile
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

import numpy as np

from . import fixturegen_omni
from .fixturegen import FIXTURES, _lock, _log
from .reference import load_pinned

WHEEL = "ollajev==0.4.0"
WHEEL_FILE = "ollajev-0.4.0-py3-none-any.whl"
MEMBER = "ollajev/_vendor/clef_omni/joint_schema_model.py"
REFERENCE_SHA256 = "21d05ebb8cbea26a26af65eca3d16cf4b69bf80a320e2d5b203e86f0d632a670"


def reference_file(root: Path = FIXTURES) -> Path:
    """The reference file taken out of the wheel (downloaded once; Requires-Python >= 3.12, hence --python-version)."""
    wheels = root / "wheels"
    out = wheels / "ollajev-0.4.0" / MEMBER
    with _lock(root):
        if not out.exists():
            if not (wheels / WHEEL_FILE).exists():
                _log(f"downloading {WHEEL} (Cloudflare's clef-omni reference, vendored in it)")
                subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "--python-version", "3.12",
                                "--only-binary=:all:", WHEEL, "-d", str(wheels)], check=True)
            with zipfile.ZipFile(wheels / WHEEL_FILE) as wheel:
                wheel.extract(MEMBER, wheels / "ollajev-0.4.0")
    return out


@cache
def reference() -> Any:
    """The clef-omni joint_schema_model module; refuses a file whose sha256 drifted."""
    return load_pinned(reference_file(), REFERENCE_SHA256, "clef_omni_reference_joint_schema_model")


@dataclass(frozen=True)
class ReferenceRun:
    """One request through the reference: its token ids, unrounded probabilities and systemone answer."""

    input_ids: list[int]
    probabilities: dict[str, np.ndarray]  # question id -> float64 probabilities in the reference's option order
    answer: dict[str, Any]
    hidden: np.ndarray  # [t, H] the thinker's final-norm states (its lm_head is the identity)


class Oracle:
    """The reference ClefModel over the tiny Qwen3-Omni and its head, with the processor."""

    def __init__(self, fx: fixturegen_omni.OmniFixtures):
        import torch
        from safetensors.torch import load_file
        from transformers import AutoConfig, AutoTokenizer, Qwen3OmniMoeForConditionalGeneration

        self.ref = ref = reference()
        config = AutoConfig.from_pretrained(fx.hf_model)
        config.enable_audio_output = False  # as the reference's load_release_model: the thinker only
        backbone = Qwen3OmniMoeForConditionalGeneration.from_pretrained(fx.hf_model, config=config,
                                                                         dtype=torch.float32)
        head = ref.JointSchemaHead(**json.loads((fx.head.parent / "joint_head_config.json").read_text()))
        head.load_state_dict(load_file(str(fx.head)), strict=True)  # the reference's own loader: bf16 tensors
        self.model = ref.ClefModel(backbone.thinker, head.float()).eval()
        self.processor = fixturegen_omni.reference_processor(AutoTokenizer.from_pretrained(fx.hf_model))
        self._hidden: list[np.ndarray] = []
        self.model.thinker.register_forward_hook(lambda m, a, out: self._hidden.append(out.logits[0].numpy()))

    def run(self, request: dict[str, Any]) -> ReferenceRun:
        """request: a reference record (images as PIL images or data URLs, audio as 16 kHz float32 arrays)."""
        import torch

        ref, processor = self.ref, self.processor
        with torch.inference_mode():
            encoded = ref.encode_record(processor.tokenizer, request, processor=processor)
            self._hidden.clear()
            logits = self.model(ref.collate_records([encoded], processor.tokenizer.pad_token_id, torch.device("cpu")))
            hidden = self._hidden[-1].copy()
            answer = ref.systemone(self.model, processor, request)
        probabilities = {q.question_id: ql.double().softmax(-1).numpy() for q, ql in zip(encoded.questions, logits[0])}
        return ReferenceRun(list(encoded.input_ids), probabilities, answer, hidden)
