"""The one decision service: a typed request in, a typed Decision out.

Every front door (POST /v1/systemone, the Workers AI routes, OpenAI's, the CLI, Ray replicas) parses its wire
format into a DecisionInput (a System One body through bridge/service/systemone.py) and renders the Decision back:
the service never reads a body. It takes a request in cost order: the model it names, resolved once; whether that
model takes the kinds of media it names; each medium's base64 decoded, hashed and checked from its header; the
request's key computed once, so an identical request's answer (cached, or under way) is joined before anything is
decoded; otherwise the request is admitted ONCE (InferenceWorker.reserve: busy, a full queue, the key's share, the
media room), its place held while its media are decoded (audio and video in the decoder processes,
bridge/media/decoders.py: never on the event loop, never in the server's memory; images in a thread) and its prompt
encoded, then queued in that place. It waits for the model's worker within the deadline.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field
from typing import Any, Callable

import numpy as np

from ...head.answer import Answer
from ...head.schema import DecisionRequest, Question, rendered_state
from ..config.registry import ServerSpec, resolve
from ..media.decoders import ISOLATED, DecoderPool
from ..media.kinds import TABLE, DecodeSettings
from ..media.request import (
    NO_MEDIA,
    NO_REFERENCES,
    Loc,
    Media,
    References,
    decode_kind,
    referenced,
    refuse_unsupported,
)
from ..model.worker import InferenceWorker, RequestOptions
from .coalesce import Coalescer, request_key
from .errors import DeadlineExceeded

# a JSON body up to this size is decompressed, parsed, searched for media and validated on the event loop, and media
# up to this size decoded from base64 there; bigger ones off it
INLINE_BYTES = 64 * 1024


@dataclass(frozen=True)
class DecisionInput:
    """What a front door hands the service: the typed request it parsed, its media as the door found them (located,
    not yet decoded), the model it names, and how to wait."""

    request: DecisionRequest
    model: Any  # the model named (the body's `model`, or a route's), as sent: the service resolves it
    media: References = NO_REFERENCES
    options: RequestOptions = RequestOptions()  # how to wait and which cache partition, as the door read them
    model_at: Loc = ("body", "model")  # where the door's request holds the model's name (a route's: its path)


@dataclass(frozen=True)
class Decision:
    """A request decided: its typed answers, and what its front door and the tools report about it. Each door
    renders its own wire shape from it (bridge/server/doors/systemone.py's systemone_body: Jev's, Workers AI's and
    the CLI's; OpenAI's door its own)."""

    model: str  # the served model that answered
    requested: str  # the model as the body named it (an alias, a route's name): Jev's answer echoes it
    answers: tuple[Answer, ...]  # per question, in the request's order
    input_tokens: int
    timings: dict[str, float]  # seconds per stage: queue, tokenize, backbone, head, then each medium's
    reused_tokens: int  # prompt tokens restored from the prefix cache
    batch_size: int
    logits: tuple[tuple[Question, np.ndarray], ...] = field(default=(), compare=False)  # unrounded, per question
    warnings: tuple[str, ...] = ()  # where the answer knowingly departs from the reference's (x_warnings)
    # "": computed for this request; CACHED or JOINED: the answer of an identical request of the same tenant (its
    # timings are this request's own wait, nothing of the request that computed it)
    shared: str = ""
    # what the decision log says of the input (bridge/server/decision_log.py, which hashes the state in its own
    # thread): the state as the prompt writes it (its media as markers; rendered once, at the door's validation), and
    # each medium as (kind, sha256 hex, bytes), never the medium itself
    state: Any = field(default=None, compare=False, repr=False)
    media: tuple[tuple[str, str, int], ...] = ()


CACHED, JOINED = "cache_hit", "coalesced"


def media_digests(media: Media) -> tuple[tuple[str, str, int], ...]:
    """Each medium as found in the body (kind, its digest in hex, its size in bytes): a frame array's size is its
    frames'."""
    return tuple((kind, item.digest.hex(), len(item.data) if getattr(item, "frames", None) is None
                  else item.frames.nbytes) for kind in media.kinds for item in media.of(kind))


async def off_loop(big: bool, fn: Callable[..., Any], *args: Any) -> Any:
    """fn(*args) in a thread where the input is big, else here (a thread hop costs more than a small body)."""
    if not big:
        return fn(*args)
    return await asyncio.get_running_loop().run_in_executor(None, fn, *args)


class DecisionService:
    """The models served (workers by name, and every name a request may use) and the path from a request to its
    Decision."""

    def __init__(self, server: ServerSpec, coalescer: Coalescer, timeout_s: float | None,
                 workers: dict[str, InferenceWorker] | None = None, names: dict[str, str] | None = None,
                 on_queued: Callable[[str, int], None] = lambda model, depth: None):
        self.server = server
        self.coalescer = coalescer
        self.timeout_s = timeout_s  # the deadline once queued (request_timeout_s); None: as long as it takes
        self.workers = {} if workers is None else workers  # the app fills both as its models load
        self.names = {} if names is None else names
        self._on_queued = on_queued
        self.decoders = DecoderPool(server.decoder_limits)  # its processes fork when started, or for a first job
        self.active = 0  # requests being decided now (shadow scorings not counted): shadows run only at 0

    async def decide(self, call: DecisionInput, resolved: Callable[[str], None] = lambda model: None) -> Decision:
        """The request's Decision within request_timeout_s from now, every wait counted (decoding, the queue, the
        model); resolved: told the served model's name as soon as it is known."""
        counted = not call.options.shadow
        self.active += counted
        try:
            if self.timeout_s is None:
                return await self._decide(call, resolved)
            return await asyncio.wait_for(self._decide(call, resolved), self.timeout_s)
        except asyncio.TimeoutError:
            raise DeadlineExceeded(f"no answer within {self.timeout_s:g} s (request_timeout_s), decoding and queue "
                                   "included; the server is busy, retry later") from None
        finally:
            self.active -= counted

    async def _decide(self, call: DecisionInput, resolved: Callable[[str], None]) -> Decision:
        kinds = call.media.named
        name = resolve(self.names, call.model, lambda served: self._takes(served, kinds), call.model_at)
        worker = self.workers[name]
        resolved(name)
        model = worker.model
        refuse_unsupported(kinds, model.media, name, call.media)  # media the model cannot take: before any is read
        request = call.request
        found_media = await off_loop(call.media.size > INLINE_BYTES, referenced, call.media,
                                     self.server.media_limits) if call.media else NO_MEDIA
        # what decides the answer, serialised once: the validated state and questions, each medium's digest
        key = request_key(name, (rendered_state(request), [q.decides() for q in request.questions]), found_media,
                          call.options.partition)
        shared, fresh, decode_s = self.coalescer.join(worker, key), False, {}  # a copy's answer: nothing decoded
        if shared is None:
            slot = worker.reserve(call.options, bool(found_media))  # admitted here, once, its place held till queued
            try:
                media, decode_s = await self._decode(found_media, DecodeSettings(model.geometry,
                                                                                 self.server.media_limits))
                # encoded before the queue, so a prompt over max_length is refused before it waits; in a thread
                # whatever the size (llama.cpp tokenizes 64 KB of text in about 70 ms)
                prepared = await off_loop(True, model.prepare, request, media)
                shared, fresh = self.coalescer.submit(worker, key, prepared, call.options, slot)
            finally:
                worker.release(slot)  # refused, cancelled or joined a copy: its place goes back
        t0 = time.perf_counter()
        try:
            self._on_queued(name, worker.depth)
            scored = await asyncio.shield(shared.future)
        finally:
            shared.leave()
        decoding = {TABLE[kind].field: seconds for kind, seconds in decode_s.items()}  # here, for this request
        if not fresh:  # another request's computation: its answer, and this request's own waits
            return Decision(name, request.model, scored.answers, scored.input_tokens,
                            {"queue": time.perf_counter() - t0, **decoding}, 0, 0, scored.logits, scored.warnings,
                            CACHED if shared.job is None else JOINED, state=request.state_text,
                            media=media_digests(found_media))
        t = scored.timings
        stages = {"queue": shared.queue_s, "tokenize": t.tokenize, "backbone": t.backbone, "head": t.head}
        stages |= decoding  # decoding here (Pillow, PyAV), a tower's time in the worker
        for kind in found_media.kinds:
            for stage, timing in TABLE[kind].towers.items():
                stages[stage] = getattr(t, timing)
        return Decision(name, request.model, scored.answers, scored.input_tokens, stages, t.reused_tokens,
                        t.batch_size, scored.logits, scored.warnings, state=request.state_text,
                        media=media_digests(found_media))

    def _takes(self, name: str, kinds: tuple[str, ...]) -> bool:
        """Whether the served model takes every kind of the request's media."""
        return name in self.workers and all(kind in self.workers[name].model.media for kind in kinds)

    async def _decode(self, media: Media, settings: DecodeSettings) -> tuple[Media, dict[str, float]]:
        """Each kind decoded, in a decoder process where it is ISOLATED (else in a thread), and the seconds it took."""
        items, seconds = {}, {}
        for kind in media.kinds:
            t0 = time.perf_counter()
            inputs = media.of(kind)
            if kind in ISOLATED:
                items[kind] = await self.decoders.run(decode_kind, (kind, inputs, settings), inputs[0].loc[:2],
                                                      kind)
            else:
                items[kind] = await asyncio.get_running_loop().run_in_executor(None, decode_kind, kind, inputs,
                                                                               settings)
            seconds[kind] = time.perf_counter() - t0
        return media.decoded(items), seconds
