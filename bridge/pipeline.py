"""One served model: parse -> encode -> prefill -> head -> answer.

A ClefModel is put together from loaded parts by bridge/loading.py (the one checked way in);
it owns them and closes the backbone.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, Sequence

import numpy as np

from ..head.answer import AnswerOptions, answers
from ..head.config import HeadConfig
from ..head.encoder import Encoded, EncodeOptions, encode
from ..head.model import joint_schema_head
from ..head.schema import DecisionRequest, Limits, Question, parse_request
from .assets import decode_all, extract, no_projector
from .backbone import Backbone
from .embedding import OutputEmbedding
from .images import ImageGeometry, ImageLimits
from .vision import Projector


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
    vision: float = 0.0  # the vision tower, for image requests


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
    images: tuple[np.ndarray, ...] = ()  # uint8 [h, w, 3] pixels at the projector's size, in prompt order


@dataclass(frozen=True)
class Prefilled:
    """A request whose backbone has run: the hidden states wait for the head."""

    prepared: Prepared
    hidden: np.ndarray  # [t, H]
    backbone_s: float
    batch_size: int
    vision_s: float = 0.0


class ClefModel:
    """A GGUF backbone and its joint head (and its vision projector, if any), with the options of one
    models.toml entry."""

    def __init__(self, name: str, backbone: Backbone, embedding: OutputEmbedding, head: Head,
                 encode_options: EncodeOptions, answer_options: AnswerOptions, limits: Limits = Limits(),
                 projector: Projector | None = None):
        self.name = name
        self.backbone = backbone
        self.projector = projector
        self.embedding = embedding
        self.head = head
        self.encode_options = encode_options
        self.answer_options = answer_options
        self.limits = limits

    @property
    def n_seq_max(self) -> int:
        return self.backbone.options.n_seq_max

    @property
    def geometry(self) -> ImageGeometry | None:
        """How images are sized for this model's projector; None: it takes no images."""
        return self.projector.geometry if self.projector is not None else None

    def close(self) -> None:
        if self.projector is not None:
            self.projector.close()
        self.backbone.close()

    def prepare(self, body: Any, images: Sequence[np.ndarray] = ()) -> Prepared:
        """Validate and encode a text body (bridge.assets.extract's) with its decoded images (no llama.cpp
        decode): raises RequestInvalid or ContextLengthExceeded."""
        t0 = time.perf_counter()
        request = parse_request(body, self.limits)
        if images and self.projector is None:
            raise no_projector(self.name)
        factor = self.projector.geometry.factor if images else 1
        counts = [(p.shape[0] // factor) * (p.shape[1] // factor) for p in images]
        encoded = encode(request, self.backbone.tokenize, self.encode_options, counts)
        return Prepared(request, encoded, time.perf_counter() - t0, tuple(images))

    def logits(self, encoded: Encoded, hidden: np.ndarray) -> np.ndarray:
        """The head's flat option logits for one prefilled request, on the host."""
        xp = self.head.xp
        rows = self.embedding.rows(encoded.option_token_ids)  # [s, H]
        out = joint_schema_head(xp.asarray(hidden), xp.asarray(rows), encoded.layout, self.head.config.heads,
                                **self.head.params)
        return out if xp is np else xp.asnumpy(out)

    def prefill_batch(self, batch: list[Prepared]) -> list[Prefilled]:
        """Text requests through ONE batched llama_decode; a request with images decodes alone (llama.cpp
        takes token ids or embeddings in a batch, not both)."""
        if any(p.images for p in batch):
            return [item for p in batch for item in
                    (self._prefill_images(p) if p.images else self.prefill_batch([p]))]
        t0 = time.perf_counter()
        hidden = self.backbone.prefill_many([p.encoded.input_ids for p in batch])
        backbone_s = time.perf_counter() - t0
        return [Prefilled(p, h, backbone_s, len(batch)) for p, h in zip(batch, hidden)]

    def _prefill_images(self, prepared: Prepared) -> list[Prefilled]:
        """The vision tower over each image, then the prompt chunk by chunk (text, image embeddings, text)."""
        t0 = time.perf_counter()
        images = [self.projector.encode(pixels) for pixels in prepared.images]
        t1 = time.perf_counter()
        hidden = self.projector.prefill(prepared.encoded.input_ids, images)
        return [Prefilled(prepared, hidden, time.perf_counter() - t1, 1, t1 - t0)]

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
        timings = Timings(prepared.tokenize_s, item.backbone_s, time.perf_counter() - t0, item.batch_size,
                          item.vision_s)
        return Decision(body, len(prepared.encoded.input_ids), timings)

    def decide_many(self, batch: list[Prepared]) -> list[Decision]:
        """One batched prefill, then the head per request."""
        return [self.finish(item) for item in self.prefill_batch(batch)]

    def decide(self, body: Any, image_limits: ImageLimits = ImageLimits()) -> dict[str, Any]:
        """A System One request body in (images in `images` or `assets`, as JSON), the response body out."""
        media = extract(body, None, image_limits, self.limits)
        if media.images and self.projector is None:
            raise no_projector(self.name)
        pixels = decode_all(media.images, self.geometry) if media.images else ()
        return self.decide_many([self.prepare(media.body, pixels)])[0].response

    def question_logits(self, body: Any) -> list[tuple[Question, np.ndarray]]:
        """Unrounded option logits per question (prompt order, before any temperature)."""
        prepared = self.prepare(body)
        logits = self.logits(prepared.encoded, self.backbone.prefill(prepared.encoded.input_ids))
        bounds = list(prepared.encoded.layout.option_offsets) + [len(logits)]
        return [(q, logits[s:e]) for q, s, e in zip(prepared.request.questions, bounds, bounds[1:])]
