"""The one decision service: a typed request in, a typed Decision out.

Every front door (POST /v1/systemone, the Workers AI routes, the CLI, Ray replicas) translates its wire
format to a DecisionInput and the Decision back. The service admits a request in ONE place, cheapest check
first: the model it names, whether that model takes the kinds of media it names (read from its fields), room
in the model's media queue, then each medium's base64 decoded, sized and checked from its header, the text
validated, the media decoded (audio and video in the decoder processes, bridge/media/decoders.py: never on the
event loop, never in the server's memory; images in a thread) and the prompt encoded; only a request that
passed all of that is queued. It coalesces identical requests and waits for the model's worker within the
deadline.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field, replace
from typing import Any, Callable

import numpy as np

from ...head.answer import Answer
from ...head.errors import Problem, RequestInvalid
from ...head.schema import MEDIA_FIELDS, DecisionRequest, Limits, Question, is_unicode, parse_request
from ..config.registry import ServerSpec, resolve
from ..media.decoders import ISOLATED, DecoderPool
from ..media.kinds import TABLE, DecodeSettings
from ..media.request import (
    NO_MEDIA,
    Extracted,
    FormPart,
    Media,
    chat_images,
    decode_kind,
    extract,
    named_kinds,
    refuse_unsupported,
)
from ..model.worker import InferenceWorker, RequestOptions
from .coalesce import Coalescer, request_key
from .errors import BodyTooLarge, DeadlineExceeded

# a JSON body up to this size is decompressed, parsed, searched for media and validated on the event loop; bigger
# ones off it
INLINE_BYTES = 64 * 1024


@dataclass(frozen=True)
class Contract:
    """A front door's own limits on a body (Workers AI's hosted ones), beyond the server's."""

    problems: Callable[[Any, Limits], list[Problem]]  # what it refuses in a body that the server's limits may take
    replaces: frozenset[str] = frozenset()  # the server's problem types that say the same, left out beside its own


@dataclass(frozen=True)
class DecisionInput:
    """What a front door hands the service: a body as sent (its media fields in), or a text request its door parsed
    already, the model it names, and how to wait."""

    body: Any  # the decoded JSON (a multipart body's `request` part); None with request
    model: Any  # the model named (the body's `model`, or a route's), as sent: the service checks it
    parts: dict[str, FormPart] | None = None  # a multipart body's media parts
    json_bytes: int = 0  # the JSON text's size, media inlined (max_body_bytes caps it without them); 0: no cap
    options: RequestOptions = RequestOptions()  # how to wait and which cache partition, as the door read them
    contract: Contract | None = None  # a front door's own limits (Workers AI's), in the same 422 as the body's
    request: DecisionRequest | None = None  # a text-only request its door validated (no media, no contract)


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
    # thread): the state as validated (its media as markers), and each medium as (kind, sha256 hex, bytes), never
    # the medium itself
    state: Any = field(default=None, compare=False, repr=False)
    media: tuple[tuple[str, str, int], ...] = ()


CACHED, JOINED = "cache_hit", "coalesced"


def media_digests(media: Media) -> tuple[tuple[str, str, int], ...]:
    """Each medium as found in the body (kind, its digest in hex, its size in bytes): a frame array's size is its
    frames'."""
    return tuple((kind, item.digest.hex(), len(item.data) if getattr(item, "frames", None) is None
                  else item.frames.nbytes) for kind in media.kinds for item in media.of(kind))


def validate(body: Any, limits: Limits = Limits(), contract: Contract | None = None) -> DecisionRequest:
    """head.schema.parse_request, its one call on the request path; a front door's contract's problems come in the
    same 422 as the body's other ones."""
    extra = contract.problems(body, limits) if contract is not None else []
    if not extra:
        return parse_request(body, limits)
    try:
        parse_request(body, limits)
    except RequestInvalid as exc:
        extra = [p for p in exc.problems if p.type not in contract.replaces] + extra
    raise RequestInvalid(extra)


async def off_loop(big: bool, fn: Callable[..., Any], *args: Any) -> Any:
    """fn(*args) in a thread where the input is big, else here (a thread hop costs more than a small body)."""
    if not big:
        return fn(*args)
    return await asyncio.get_running_loop().run_in_executor(None, fn, *args)


def text_of(body: Any) -> Any:
    """A body without its media fields: what validate() reads when the model named is not a name (nothing
    decoded for a request that is refused anyway)."""
    return {k: v for k, v in body.items() if k not in MEDIA_FIELDS} if isinstance(body, dict) else body


def find_media(call: DecisionInput, server: ServerSpec) -> Extracted:
    """The body's media found and checked from their headers; its text (the JSON without inlined media) must fit
    max_body_bytes."""
    found = extract(call.body, call.parts, server.media_limits, server.limits)
    if call.json_bytes - found.inline_chars > server.max_body_bytes:
        raise BodyTooLarge(f"the request's JSON exceeds {server.max_body_bytes} bytes"
                           f"{' without its images and audio' if found.inline_chars else ''} (max_body_bytes "
                           "in models.toml [server])")
    return found


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
        if call.request is None:
            call = replace(call, body=chat_images(call.body))  # llama-server's image_url parts, as `images`
            kinds = named_kinds(call.body)
            if not isinstance(call.body, dict) or not isinstance(call.model, str) or not is_unicode(call.model):
                validate(text_of(call.body))  # every problem of the body at once, the model's among them
        else:
            kinds = ()
        name = resolve(self.names, call.model, lambda served: self._takes(served, kinds))
        worker = self.workers[name]
        resolved(name)
        model = worker.model
        refuse_unsupported(kinds, model.media, name)  # media the model cannot take: before any base64 is decoded
        worker.check_media_room(bool(kinds))  # a full media queue: before any is decoded
        if call.request is None:
            big = call.parts is not None or call.json_bytes > INLINE_BYTES
            found = await off_loop(big, find_media, call, self.server)
            request = await off_loop(big, validate, found.body, model.limits, call.contract)
            found_media = found.media
        else:
            request, found_media = call.request, NO_MEDIA
        media, decode_s = await self._decode(found_media, DecodeSettings(model.geometry, self.server.media_limits))
        # what decides the answer, serialised once: the validated state and questions, each medium's digest
        key = request_key(name, (request.state, request.questions), media, call.options.partition)
        shared, fresh = self.coalescer.join(worker, key), False
        if shared is None:
            worker.admit(call.options, bool(media))  # busy, a full queue: before the prompt is encoded
            # encoded before the queue, so a clip too short to frame or a prompt over max_length takes no slot; in a
            # thread whatever the size (llama.cpp tokenizes 64 KB of text in about 70 ms)
            prepared = await off_loop(True, model.prepare, request, media)
            shared, fresh = self.coalescer.submit(worker, key, prepared, call.options)
        t0 = time.perf_counter()
        try:
            self._on_queued(name, worker.depth)
            scored = await asyncio.shield(shared.future)
        finally:
            shared.leave()
        decoding = {TABLE[kind].field: decode_s[kind] for kind in media.kinds}  # here, for this request
        if not fresh:  # another request's computation: its answer, and this request's own waits
            return Decision(name, request.model, scored.answers, scored.input_tokens,
                            {"queue": time.perf_counter() - t0, **decoding}, 0, 0, scored.logits, scored.warnings,
                            CACHED if shared.job is None else JOINED, state=request.state,
                            media=media_digests(found_media))
        t = scored.timings
        stages = {"queue": shared.queue_s, "tokenize": t.tokenize, "backbone": t.backbone, "head": t.head}
        stages |= decoding  # decoding here (Pillow, PyAV), a tower's time in the worker
        for kind in media.kinds:
            for stage, timing in TABLE[kind].towers.items():
                stages[stage] = getattr(t, timing)
        return Decision(name, request.model, scored.answers, scored.input_tokens, stages, t.reused_tokens,
                        t.batch_size, scored.logits, scored.warnings, state=request.state,
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
