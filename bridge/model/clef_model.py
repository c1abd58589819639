"""One served model: encode -> prefill -> head -> answer (bridge/service validates and decodes first).

A ClefModel is put together from loaded parts by bridge/model/loading.py (the one checked way in);
it owns them and closes the backbone.
"""

from __future__ import annotations

import functools
import time
from dataclasses import dataclass, field, replace
from typing import Any, Sequence

import numpy as np

from ...head.answer import Answer, AnswerOptions, answers
from ...head.config import HeadConfig
from ...head.encoder import Encoded, EncodeOptions, encode
from ...head.model import Layout, hidden_memory, option_logits
from ...head.schema import DecisionRequest, Limits, Question, embedded_media
from ..host.gpu import device_out_of_memory, to_device
from ..llama.adapters import same_hidden_states
from ..llama.embedding import OutputEmbedding
from ..llama.omni_positions import rope_chunks, rope_positions
from ..llama.prefix_cache import PrefillRequest
from ..llama.protocol import BackboneProtocol
from ..llama.vision import EncodedAudio, Projector
from ..media.audio_tower import MIN_AUDIO_SAMPLES, AudioTower, audio_tokens
from ..media.images import ImageGeometry
from ..media.request import AUDIO, IMAGE, NO_MEDIA, VIDEO, Media
from .video_prompt import VideoPrompt, video_prompt

MEMORY_PARAMS = ("hidden_norm", "memory_projection")  # what hidden_memory takes; option_logits the rest


@dataclass(frozen=True)
class Head:
    """The joint head's config and parameters on their array module (numpy, or CuPy on a GPU)."""

    config: HeadConfig
    params: dict[str, Any]
    xp: Any

    def memory(self, hidden: np.ndarray) -> tuple[Any, Any]:
        """Normed states and memory rows of hidden states, on the head's device: [t, H] -> [t, H], [t, w]."""
        return hidden_memory(to_device(self.xp, hidden), self.params["hidden_norm"], self.params["memory_projection"])

    def option_logits(self, hs: Sequence[Any], memories: Sequence[Any], rows: Sequence[np.ndarray],
                      layouts: Sequence[Layout]) -> list[np.ndarray]:
        """Each record's flat option logits on the host, all records in one pass (see head.model.option_logits)."""
        rest = {k: v for k, v in self.params.items() if k not in MEMORY_PARAMS}
        out = option_logits(hs, memories, [to_device(self.xp, r) for r in rows], layouts, self.config.heads, **rest)
        if self.xp is np:
            return out
        flat = self.xp.asnumpy(self.xp.concatenate(out))  # one copy to the host, not one per record
        return np.split(flat, np.cumsum([len(o) for o in out])[:-1])


@dataclass
class Timings:
    """Seconds spent in each stage of one request."""

    tokenize: float = 0.0
    backbone: float = 0.0
    head: float = 0.0
    batch_size: int = 1
    reused_tokens: int = 0  # prompt tokens the prefix cache spared the backbone
    vision: float = 0.0  # the vision tower, for image requests
    audio: float = 0.0  # the audio tower (numpy/CuPy), for audio requests


@dataclass(frozen=True)
class Scored:
    """One request through the head: its typed answers (request order), and each question's unrounded option logits
    (prompt order, before any temperature) for the tools that fit or compare them."""

    answers: tuple[Answer, ...]
    input_tokens: int
    timings: Timings = field(compare=False)
    logits: tuple[tuple[Question, np.ndarray], ...] = field(default=(), compare=False)
    warnings: tuple[str, ...] = ()  # where this answer knowingly departs from the reference's (x_warnings)


@dataclass(frozen=True)
class Prepared:
    """A validated, encoded request waiting for its prefill."""

    request: DecisionRequest
    encoded: Encoded
    tokenize_s: float
    media: Media = NO_MEDIA  # decoded: uint8 [h, w, 3] pixels, float32 16 kHz mono samples, each in prompt order;
    # videos as ONE VideoPrompt (frames at the tower's size, grids, the audio items and token layouts)
    partition: tuple[str, ...] = ()  # the prefix cache's partition (PrefillRequest.partition): the worker sets it
    warnings: tuple[str, ...] = ()  # where this request's answer knowingly departs from the reference's (x_warnings)

    @property
    def has_media(self) -> bool:
        """A request with media decodes alone (llama.cpp takes token ids or embeddings in a batch, not both)."""
        return bool(self.media)



@dataclass(frozen=True)
class HeadInput:
    """A prefilled request whose checkpoint's memory rows the prefix cache has: what the head's decision layers read,
    together with other requests' (ClefModel.head_logits)."""

    item: "Prefilled"
    # [t - reused, H] the normed new rows and [t, w] the whole prompt's memory rows, kept for a numpy head; None for
    # a device head, which computes them again in its pass: device arrays held between calls would outlive an
    # out-of-memory error there, and the pool could not give their blocks back
    h: Any
    memory: Any
    memory_s: float


@dataclass(frozen=True)
class Prefilled:
    """A request whose backbone has run: the hidden states wait for the head."""

    prepared: Prepared
    hidden: np.ndarray  # [t - reused, H]: the rows after the cached prefix
    backbone_s: float
    batch_size: int
    reused: int = 0  # prompt tokens restored from the prefix cache
    prefix_memory: tuple[np.ndarray, ...] = ()  # the head's memory rows of those tokens, in order (host)
    new_segments: tuple[tuple[int, int], ...] = ()  # [start, end) whose memory rows the cache waits for
    ticket: int = 0
    vision_s: float = 0.0
    audio_s: float = 0.0
    prefix_hidden: tuple[np.ndarray, ...] = ()  # keep_hidden: the hidden states of the reused tokens, in order (host)


@dataclass(frozen=True)
class CachedRows:
    """A prefix-cache payload of a model whose head-only shadows score its requests (ClefModel.keep_hidden): its
    head's memory rows of a segment, and the segment's hidden states, which a shadow's head reads where the cache
    spared the backbone."""

    memory: np.ndarray  # [n, w]
    hidden: np.ndarray  # [n, H]

    @property
    def nbytes(self) -> int:  # what the cache's max_mb counts
        return self.memory.nbytes + self.hidden.nbytes


@dataclass(frozen=True)
class HiddenStates:
    """A scored request's prompt and the hidden states of all of it: what a head-only fine-tune over the same backbone
    scores it from, one more head pass and no prefill (prefilled)."""

    prepared: Prepared  # without its decoded media: a head pass reads none
    pieces: tuple[np.ndarray, ...]  # [t_i, H] in prompt order, the cached prefix's segments then the new rows

    def prefilled(self) -> Prefilled:
        """As a prefill of the whole prompt (no cached prefix: the shadow's head computes its own memory rows of every
        token), joined here, in the shadow's thread, not in the primary's."""
        hidden = self.pieces[0] if len(self.pieces) == 1 else np.concatenate(self.pieces)
        return Prefilled(self.prepared, hidden, 0.0, 1)


def _device_memory_errors(method):
    """A CuPy out-of-memory in the head becomes DeviceOutOfMemory (HTTP 503), its arrays dropped and
    CuPy's pool handed back to the driver, where llama.cpp allocates too."""
    @functools.wraps(method)
    def run(self, *args):
        try:
            return method(self, *args)
        except MemoryError as exc:
            if self.head.xp is np:
                raise
            raise device_out_of_memory(self.head.xp, exc) from exc

    return run


def _framed(audio: tuple[np.ndarray, ...]) -> tuple[np.ndarray, ...]:
    """Audio items as the decoding left them; one too short to frame is a caller's bug (bridge/media/kinds.py refuses
    those clips and soundtracks where the request holds them): the feature extractor would fail inside the tower."""
    short = min((len(a) for a in audio), default=MIN_AUDIO_SAMPLES)
    if short < MIN_AUDIO_SAMPLES:
        raise ValueError(f"an audio item of {short} samples reached ClefModel.prepare; decode media through "
                         f"bridge/media/kinds.py, which refuses clips and soundtracks under {MIN_AUDIO_SAMPLES}")
    return audio


class ClefModel:
    """A GGUF backbone and its joint head (and its vision projector and audio tower, if any), with the options of
    one models.toml entry."""

    def __init__(self, name: str, backbone: BackboneProtocol, embedding: OutputEmbedding, head: Head,
                 encode_options: EncodeOptions, answer_options: AnswerOptions, limits: Limits = Limits(),
                 projector: Projector | None = None, audio_tower: AudioTower | None = None):
        if audio_tower is not None and projector is None:
            raise ValueError("an audio tower places its rows through the projector's prompt pieces: give both")
        self.name = name
        self.backbone = backbone
        self.projector = projector
        self.audio_tower = audio_tower
        self.embedding = embedding
        self.head = head
        self.encode_options = encode_options
        self.answer_options = answer_options
        self.limits = limits
        # head-only shadows score its requests (keep_hidden_states, set once before the first request): its cache's
        # payloads carry the hidden states besides the memory rows, and its worker hands each request's over
        self.keep_hidden = False

    @property
    def n_seq_max(self) -> int:
        return self.backbone.options.n_seq_max

    @property
    def geometry(self) -> ImageGeometry | None:
        """How images are sized for this model's projector; None: it takes no images."""
        return self.projector.geometry if self.projector is not None else None

    @property
    def takes_audio(self) -> bool:
        """Clef-omni with its projector's audio encoder: audio clips in requests."""
        return self.audio_tower is not None

    @property
    def media(self) -> tuple[str, ...]:
        """What it reads besides text, as /v1/models' x_media lists it."""
        video = self.takes_audio and self.projector.video_pad is not None  # no <|video_pad|>: no video
        return ((IMAGE,) if self.projector is not None else ()) + ((AUDIO,) if self.takes_audio else ()) + (
            (VIDEO,) if video else ())

    def close(self) -> None:
        if self.projector is not None:
            self.projector.close()
        self.backbone.close()

    def shares_hidden_states(self, other: "ClefModel") -> bool:
        """Whether other gives any request this model's prompt and hidden states (one backbone, the same adapter or
        none, the same prompt options and towers): then this model's head can score other's requests from other's
        hidden states, a head-only fine-tune of it."""
        projector = self.projector.path if self.projector is not None else None
        theirs = other.projector.path if other.projector is not None else None
        return (same_hidden_states(self.backbone, other.backbone) and self.encode_options == other.encode_options
                and projector == theirs and (self.audio_tower is None) == (other.audio_tower is None))

    def keep_hidden_states(self) -> None:
        """Keep what head-only shadows read (the model's worker not started yet: every checkpoint of its cache
        carries the hidden states then)."""
        self.keep_hidden = True

    def hidden_states(self, item: Prefilled) -> HiddenStates:
        """A prefilled request's prompt and all its hidden states (keep_hidden: its cached prefix's come with it)."""
        return HiddenStates(replace(item.prepared, media=NO_MEDIA, tokenize_s=0.0), (*item.prefix_hidden, item.hidden))

    def prepare(self, request: DecisionRequest, media: Media = NO_MEDIA) -> Prepared:
        """Encode a validated request (head.schema.parse_request's) with its decoded media (bridge/media/kinds.py's
        decoding, which refuses clips and soundtracks too short to frame where the request holds them), whose kinds
        the caller has checked against self.media (the decision service does both), no llama.cpp decode: raises
        ContextLengthExceeded."""
        t0 = time.perf_counter()
        factor = self.projector.geometry.factor if media.images else 1
        counts = [(p.shape[0] // factor) * (p.shape[1] // factor) for p in media.images]
        clips = _framed(tuple(np.asarray(a, dtype=np.float32).reshape(-1) for a in media.audio))
        plan = video_prompt(media.of(VIDEO), clips, self.projector.geometry.factor, self.projector.merge) if (
            media.of(VIDEO)) else None
        if plan:
            _framed(plan.audio)
        audio_counts = plan.clip_counts if plan else audio_tokens([len(c) for c in clips])
        encoded = encode(request, self.backbone.tokenize, self.encode_options, self.backbone.min_tokens, counts,
                         audio_counts, plan.layouts if plan else ())
        decoded = media.decoded({**media.items, AUDIO: clips} | ({VIDEO: (plan,)} if plan else {})) if (
            clips or plan) else media
        return Prepared(request, encoded, time.perf_counter() - t0, decoded, warnings=embedded_media(request.state))

    @_device_memory_errors
    def logits(self, encoded: Encoded, hidden: np.ndarray) -> np.ndarray:
        """The head's flat option logits for one request prefilled in full, on the host."""
        h, memory = self.head.memory(hidden)
        return self.head.option_logits([h], [memory], [self.embedding.rows(encoded.option_token_ids)],
                                       [encoded.layout])[0]

    def _memory(self, item: Prefilled) -> tuple[Any, Any]:
        """The normed new rows and the whole prompt's memory rows, on the head's device: [t - reused, H], [t, w]."""
        h, new = self.head.memory(item.hidden)  # [t - reused, H], [t - reused, w]
        return h, self._with_prefix(item, new)

    def _with_prefix(self, item: Prefilled, new: Any) -> Any:
        """The cached prefix's memory rows (uploaded to the head's device) before the new rows': [t, w]."""
        xp = self.head.xp
        return xp.concatenate([to_device(xp, m) for m in item.prefix_memory] + [new]) if item.reused else new

    @_device_memory_errors
    def head_input(self, item: Prefilled) -> HeadInput:
        """The memory rows of a prefilled request's new rows, joined to its cached prefix's.

        The layout's spans and the last token lie after the cached prefix (it ends inside the state), so
        the head's pooling reads only new rows; its attention reads the whole prompt's memory. The new
        rows' memory goes to the cache here, before the head's decision layers, so that a request of the
        next batch can reuse it; only once it is known finite: a fault never leaves a poisoned checkpoint
        behind.
        """
        t0 = time.perf_counter()
        xp, cache = self.head.xp, self.backbone.prefix_cache
        try:
            h, new = self.head.memory(item.hidden)  # [t - reused, H], [t - reused, w]
            if item.ticket and bool(xp.isfinite(new).all()):
                cache.attach(item.ticket, self._payloads(item, new))
            elif item.ticket:
                cache.discard(item.ticket)
            # a device head's pass computes its rows again (HeadInput): the prefix is uploaded there only
            kept = (h, self._with_prefix(item, new)) if xp is np else (None, None)
            return HeadInput(item, *kept, time.perf_counter() - t0)
        except BaseException:
            if item.ticket:
                cache.discard(item.ticket)
            raise

    def _payloads(self, item: Prefilled, new: Any) -> list[Any]:
        """The cache's payload of each new segment: its memory rows, with its hidden states where head-only shadows
        read them (keep_hidden; a host copy, no compute: a shadow's head computes its own rows, later)."""
        xp, cut = self.head.xp, [slice(s - item.reused, e - item.reused) for s, e in item.new_segments]
        # host copies: the cache's budget is host memory, and views would pin whole arrays
        memory = [new[c].copy() if xp is np else xp.asnumpy(new[c]) for c in cut]
        if not self.keep_hidden:
            return memory
        return [CachedRows(m, item.hidden[c].copy()) for m, c in zip(memory, cut)]

    @_device_memory_errors
    def head_logits(self, inputs: Sequence[HeadInput]) -> list[np.ndarray]:
        """Each request's flat option logits, the head's decision layers run once over all of them (their weights
        read once per call, not once per request)."""
        rows = [(i.h, i.memory) if i.h is not None else self._memory(i.item) for i in inputs]
        return self.head.option_logits(
            [h for h, _ in rows], [m for _, m in rows],
            [self.embedding.rows(i.item.prepared.encoded.option_token_ids) for i in inputs],
            [i.item.prepared.encoded.layout.shifted(i.item.reused) for i in inputs])

    def prefill_batch(self, batch: list[Prepared]) -> list[Prefilled]:
        """Text requests through ONE batched llama_decode, each from its longest cached prefix; a request with
        media decodes alone and in full (llama.cpp takes token ids or embeddings in a batch, not both)."""
        if any(p.has_media for p in batch):
            return [item for p in batch for item in
                    (self._prefill_media(p) if p.has_media else self.prefill_batch([p]))]
        t0 = time.perf_counter()
        done = self.backbone.prefill_cached([PrefillRequest(p.encoded.input_ids, p.encoded.state_span, p.partition)
                                             for p in batch])
        backbone_s = time.perf_counter() - t0
        return [Prefilled(p, d.hidden, backbone_s, len(batch), d.reused, **self._prefix(d.prefix_payloads),
                          new_segments=d.new_segments, ticket=d.ticket) for p, d in zip(batch, done)]

    def _prefix(self, payloads: tuple[Any, ...]) -> dict[str, tuple[np.ndarray, ...]]:
        """A hit's payloads as Prefilled's prefix_memory and, keep_hidden, prefix_hidden."""
        if not self.keep_hidden:
            return {"prefix_memory": payloads}
        return {"prefix_memory": tuple(p.memory for p in payloads), "prefix_hidden": tuple(p.hidden for p in payloads)}

    def _prefill_media(self, prepared: Prepared) -> list[Prefilled]:
        """The vision tower over each image and the audio tower over the clips, then the prompt chunk by chunk
        (text, media embeddings, text)."""
        if prepared.media.of(VIDEO):
            return [self._prefill_video(prepared, prepared.media.of(VIDEO)[0])]
        t0 = time.perf_counter()
        media = prepared.media
        images = [self.projector.encode(pixels) for pixels in media.images]
        t1 = time.perf_counter()
        audio = [EncodedAudio(rows) for rows in self.audio_tower.encode(media.audio)] if media.audio else []
        t2 = time.perf_counter()
        hidden = self.projector.prefill(prepared.encoded.input_ids, images, audio)
        return [Prefilled(prepared, hidden, time.perf_counter() - t2, 1, vision_s=t1 - t0, audio_s=t2 - t1)]

    def _prefill_video(self, prepared: Prepared, plan: VideoPrompt) -> Prefilled:
        """Images, audio items and frame pairs through their towers, then the whole prompt at the reference's M-RoPE
        positions (rope_positions: llama.cpp's mtmd numbers a video as plain frames and knows no audio in video)."""
        t0 = time.perf_counter()
        ids = prepared.encoded.input_ids
        images = [self.projector.encode(pixels) for pixels in prepared.media.images]
        frames = np.concatenate([self.projector.encode_frames(f) for f in plan.frames])
        t1 = time.perf_counter()
        sound = self.audio_tower.encode(plan.audio) if plan.audio else []
        t2 = time.perf_counter()
        merge = self.projector.merge
        grids = [(1, i.rows * merge, i.cols * merge) for i in images]
        positions = rope_positions(ids, grids, plan.grids, plan.audio_counts, plan.seconds_per_grid,
                                   plan.audio_in_video, tokens=self.projector.omni_tokens, merge=merge)
        width = self.backbone.n_embd_inp
        rows = {self.projector.image_pad: np.concatenate([i.embd for i in images]) if images else np.zeros((0, width)),
                self.projector.video_pad: frames}
        if sound:
            rows[self.projector.audio_pad] = np.concatenate(sound)
        hidden = self.backbone.decode_media(rope_chunks(ids, positions, rows, width))
        return Prefilled(prepared, hidden, time.perf_counter() - t2, 1, vision_s=t1 - t0, audio_s=t2 - t1)

    def score(self, inputs: Sequence[HeadInput]) -> list[Scored]:
        """The head and the answers of prefilled requests (head_input's), the head's decision layers run once over
        all of them; raises if any one fails (NonFiniteOutput among others): the caller scores them again one by
        one to find which."""
        t0 = time.perf_counter()
        logits = self.head_logits(inputs)
        head_s = time.perf_counter() - t0
        return [self._answer(done, z, head_s) for done, z in zip(inputs, logits)]

    def _answer(self, done: HeadInput, logits: np.ndarray, head_s: float) -> Scored:
        """The typed answers of one request from its option logits (head_s: the head's pass it took part in)."""
        t0 = time.perf_counter()
        item, prepared = done.item, done.item.prepared
        offsets = prepared.encoded.layout.option_offsets
        typed = answers(prepared.request, logits, offsets, self.answer_options)
        head = done.memory_s + head_s + time.perf_counter() - t0
        timings = Timings(prepared.tokenize_s, item.backbone_s, head, item.batch_size, item.reused, item.vision_s,
                          item.audio_s)
        return Scored(typed, len(prepared.encoded.input_ids), timings, per_question(prepared.request, logits, offsets),
                      prepared.warnings)

    def uncached_logits(self, prepared: Prepared) -> tuple[tuple[Question, np.ndarray], ...]:
        """Per-question logits of a text request prefilled in full, the prefix cache untouched (the load-time
        canaries: a model's own check must leave no trace in what it serves)."""
        logits = self.logits(prepared.encoded, self.backbone.prefill(prepared.encoded.input_ids))
        return per_question(prepared.request, logits, prepared.encoded.layout.option_offsets)


def per_question(request: DecisionRequest, logits: np.ndarray, offsets: Sequence[int]
                 ) -> tuple[tuple[Question, np.ndarray], ...]:
    """Flat option logits split by question, in prompt order."""
    bounds = list(offsets) + [len(logits)]
    return tuple((q, logits[s:e]) for q, s, e in zip(request.questions, bounds, bounds[1:]))
