"""One served model: parse -> encode -> prefill -> head -> answer.

A ClefModel is put together from loaded parts by bridge/loading.py (the one checked way in);
it owns them and closes the backbone.
"""

from __future__ import annotations

import time
import traceback
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..head.answer import AnswerOptions, answers
from ..head.config import HeadConfig
from ..head.encoder import Encoded, EncodeOptions, encode
from ..head.model import joint_schema_head
from ..head.schema import DecisionRequest, Limits, Question, parse_request
from .backbone import Backbone
from .embedding import OutputEmbedding
from .gpu import DeviceOutOfMemory, release_cached, to_device


@dataclass(frozen=True)
class Head:
    """The joint head's config and parameters on their array module (numpy, or CuPy on a GPU)."""

    config: HeadConfig
    params: dict[str, Any]
    xp: Any


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
    """A GGUF backbone and its joint head, with the options of one models.toml entry."""

    def __init__(self, name: str, backbone: Backbone, embedding: OutputEmbedding, head: Head,
                 encode_options: EncodeOptions, answer_options: AnswerOptions, limits: Limits = Limits()):
        self.name = name
        self.backbone = backbone
        self.embedding = embedding
        self.head = head
        self.encode_options = encode_options
        self.answer_options = answer_options
        self.limits = limits

    @property
    def n_seq_max(self) -> int:
        return self.backbone.options.n_seq_max

    def close(self) -> None:
        self.backbone.close()

    def prepare(self, body: Any) -> Prepared:
        """Validate and encode (no llama.cpp decode): raises RequestInvalid or ContextLengthExceeded."""
        t0 = time.perf_counter()
        request = parse_request(body, self.limits)
        encoded = encode(request, self.backbone.tokenize, self.encode_options)
        return Prepared(request, encoded, time.perf_counter() - t0)

    def logits(self, encoded: Encoded, hidden: np.ndarray) -> np.ndarray:
        """The head's flat option logits for one prefilled request, on the host.

        Out of GPU memory, the arrays of the failed run are dropped and CuPy's pool hands its blocks
        back to the driver (llama.cpp allocates there too): DeviceOutOfMemory, HTTP 503.
        """
        xp = self.head.xp
        rows = self.embedding.rows(encoded.option_token_ids)  # [s, H]
        try:
            out = joint_schema_head(to_device(xp, hidden), to_device(xp, rows), encoded.layout,
                                    self.head.config.heads, **self.head.params)
            return out if xp is np else xp.asnumpy(out)
        except MemoryError as exc:
            if xp is np:
                raise
            traceback.clear_frames(exc.__traceback__)  # the failed run's device arrays die with its frames
            release_cached(xp, drain=True)
            raise DeviceOutOfMemory(f"the GPU ran out of memory for the head ({exc}); its cached blocks are "
                                    "released, retry shortly", fix="if it recurs: fewer concurrent requests, "
                                    "head_dtype = \"float16\", or a lower n_ctx to leave the head more memory"
                                    ) from exc

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
