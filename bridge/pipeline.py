"""One served model: parse -> encode -> prefill -> head -> answer."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

import llama_cpp
import numpy as np

from ..head.answer import AnswerOptions, answers
from ..head.config import HeadConfig, config_path_for, load_config
from ..head.encoder import Encoded, EncodeOptions, encode
from ..head.errors import ClefError, HeadConfigError
from ..head.model import joint_schema_head
from ..head.schema import DecisionRequest, Limits, Question, parse_request
from ..head.weights import load_params
from .backbone import Backbone, BackboneOptions
from .embedding import OutputEmbedding
from .fit import gpu_layers_for
from .registry import ModelSpec


class PairMismatch(ClefError):
    """The head was not built for this backbone."""

    error_type = "pair_mismatch"


def array_module_for(device: str) -> Any:
    if device == "cpu":
        return np
    try:
        import cupy
    except ImportError:
        raise HeadConfigError("head_device = \"cuda\" needs CuPy: pip install 'clef-bridge[cuda]' "
                              "(or set head_device = \"cpu\")") from None
    return cupy


@dataclass
class Timings:
    """Seconds spent in each stage of one request."""

    tokenize: float = 0.0
    backbone: float = 0.0
    head: float = 0.0
    batch_size: int = 1


@dataclass(frozen=True)
class Decision:
    response: dict[str, Any]
    input_tokens: int
    timings: Timings = field(compare=False)


@dataclass(frozen=True)
class Prepared:
    """A validated, encoded request waiting for its prefill."""

    request: DecisionRequest
    encoded: Encoded
    tokenize_s: float


@dataclass(frozen=True)
class Prefilled:
    """A request whose backbone has run: the hidden states wait for the head."""

    prepared: Prepared
    hidden: np.ndarray  # [t, H]
    backbone_s: float
    batch_size: int


class ClefModel:
    """A GGUF backbone and its joint head, loaded from one models.toml entry."""

    def __init__(self, spec: ModelSpec, limits: Limits = Limits()):
        self.spec = spec
        self.limits = limits
        spec.ensure_files()
        self.head_config: HeadConfig = load_config(config_path_for(spec.head))
        self.xp = array_module_for(spec.head_device)
        self.params = load_params(spec.head, self.head_config, self.xp)
        # warnings it is served with: the memory plan's here, integrity findings from integrity.load_checked
        n_gpu_layers, self.warnings = gpu_layers_for(spec.gguf, spec.n_gpu_layers, spec.n_ctx, spec.n_seq_max,
                                                     spec.n_ubatch, spec.head_device == "cuda",
                                                     self.head_config.hidden_size)
        self.backbone = Backbone(spec.gguf, BackboneOptions(
            n_ctx=spec.n_ctx, n_gpu_layers=n_gpu_layers, n_seq_max=spec.n_seq_max, n_ubatch=spec.n_ubatch,
            n_threads=spec.n_threads))
        self.backbone_on_gpu = n_gpu_layers != 0 and bool(llama_cpp.llama_supports_gpu_offload())
        if self.backbone.n_embd != self.head_config.hidden_size:
            self.backbone.close()
            raise PairMismatch(f"{spec.head}: the head expects hidden_size {self.head_config.hidden_size} but "
                               f"{spec.gguf} has embedding length {self.backbone.n_embd}; this head belongs to "
                               "another model")
        self.embedding = OutputEmbedding(spec.gguf)
        self.encode_options = EncodeOptions(
            max_length=spec.max_length, truncate_state=spec.truncate_state,
            parse_special_in_user_text=spec.parse_special_in_user_text, blind_ids=spec.question_ids == "blind")
        self.answer_options = AnswerOptions(temperature=spec.temperature, confidence=spec.confidence)

    def close(self) -> None:
        self.backbone.close()

    def prepare(self, body: Any) -> Prepared:
        """Validate and encode (no llama.cpp decode): raises RequestInvalid or ContextLengthExceeded."""
        t0 = time.perf_counter()
        request = parse_request(body, self.limits)
        encoded = encode(request, self.backbone.tokenize, self.encode_options)
        return Prepared(request, encoded, time.perf_counter() - t0)

    def logits(self, encoded: Encoded, hidden: np.ndarray) -> np.ndarray:
        """The head's flat option logits for one prefilled request, on the host."""
        xp = self.xp
        rows = self.embedding.rows(encoded.option_token_ids)  # [s, H]
        out = joint_schema_head(xp.asarray(hidden), xp.asarray(rows), encoded.layout, self.head_config.heads,
                                **self.params)
        return out if xp is np else xp.asnumpy(out)

    def prefill_batch(self, batch: list[Prepared]) -> list[Prefilled]:
        """Several prepared requests through ONE batched llama_decode."""
        t0 = time.perf_counter()
        hidden = self.backbone.prefill_many([p.encoded.input_ids for p in batch])
        backbone_s = time.perf_counter() - t0
        return [Prefilled(p, h, backbone_s, len(batch)) for p, h in zip(batch, hidden)]

    def finish(self, item: Prefilled) -> Decision:
        """The head and the answers for one prefilled request."""
        t0 = time.perf_counter()
        prepared = item.prepared
        logits = self.logits(prepared.encoded, item.hidden)
        body = {
            "model": prepared.request.model,
            "answers": answers(prepared.request, logits, prepared.encoded.layout.option_offsets, self.answer_options),
            "usage": {"input_tokens": int(len(prepared.encoded.input_ids)), "output_tokens": 0},
        }
        timings = Timings(prepared.tokenize_s, item.backbone_s, time.perf_counter() - t0, item.batch_size)
        return Decision(body, len(prepared.encoded.input_ids), timings)

    def decide_many(self, batch: list[Prepared]) -> list[Decision]:
        """One batched prefill, then the head per request."""
        return [self.finish(item) for item in self.prefill_batch(batch)]

    def decide(self, body: Any) -> dict[str, Any]:
        """A System One request body in, the response body out."""
        return self.decide_many([self.prepare(body)])[0].response

    def question_logits(self, body: Any) -> list[tuple[Question, np.ndarray]]:
        """Unrounded option logits per question (prompt order, before any temperature)."""
        prepared = self.prepare(body)
        logits = self.logits(prepared.encoded, self.backbone.prefill(prepared.encoded.input_ids))
        bounds = list(prepared.encoded.layout.option_offsets) + [len(logits)]
        return [(q, logits[s:e]) for q, s, e in zip(prepared.request.questions, bounds, bounds[1:])]
