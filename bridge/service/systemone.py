"""The System One body (Jev's and the reference's shape; Workers AI's, Vercel's and Deqio's doors translate into it,
the CLI reads it) as the typed request the decision service takes: parsed once, by the door that read it.

The text is validated here, the media only found (their placeholders replaced by markers, their counts and sizes
checked from the body alone): the service decodes their base64 only for a request it has admitted (the model named
exists and takes them, its media queue has room)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

from ...head.errors import Problem, RequestInvalid
from ...head.schema import MEDIA_FIELDS, DecisionRequest, Limits, is_unicode, parse_request
from ..config.registry import ServerSpec
from ..media.request import FormPart, References, chat_images, find_references
from .decision import INLINE_BYTES, Decision, DecisionInput, DecisionService, off_loop
from .errors import BodyTooLarge


@dataclass(frozen=True)
class Contract:
    """A front door's own limits on a body (Workers AI's hosted ones), beyond the server's."""

    problems: Callable[[Any, Limits], list[Problem]]  # what it refuses in a body that the server's limits may take
    replaces: frozenset[str] = frozenset()  # the server's problem types that say the same, left out beside its own


@dataclass(frozen=True)
class Parsed:
    """A System One body parsed: its typed request and its media's references."""

    request: DecisionRequest
    media: References


def validate(body: Any, limits: Limits = Limits(), contract: Contract | None = None) -> DecisionRequest:
    """head.schema.parse_request, its one call on the request path (the model named is the service's to resolve); a
    front door's contract's problems come in the same 422 as the body's other ones."""
    extra = contract.problems(body, limits) if contract is not None else []
    if not extra:
        return parse_request(body, limits, name_resolved=True)
    try:
        parse_request(body, limits, name_resolved=True)
    except RequestInvalid as exc:
        extra = [p for p in exc.problems if p.type not in contract.replaces] + extra
    raise RequestInvalid(extra)


def text_of(body: Any) -> Any:
    """A body without its media fields: what validate() reads when the model named is not a name (nothing found for
    a request that is refused anyway)."""
    return {k: v for k, v in body.items() if k not in MEDIA_FIELDS} if isinstance(body, dict) else body


def check_body_cap(json_bytes: int, inline_chars: int, server: ServerSpec) -> None:
    """The request's JSON text, without the base64 of its media, must fit max_body_bytes."""
    if json_bytes - inline_chars > server.max_body_bytes:
        raise BodyTooLarge(f"the request's JSON exceeds {server.max_body_bytes} bytes"
                           f"{' without its images and audio' if inline_chars else ''} (max_body_bytes "
                           "in models.toml [server])")


def parse_text(body: Any, model: Any, parts: dict[str, FormPart] | None, json_bytes: int, server: ServerSpec,
               contract: Contract | None) -> Parsed:
    """The body's media found and its text validated (blocking: a big body's parse runs in a thread)."""
    body = chat_images(body)  # llama-server's image_url parts, as `images`
    if not isinstance(body, dict) or not isinstance(model, str) or not is_unicode(model):
        validate(text_of(body))  # every problem of the body at once, the model's among them
    text, references = find_references(body, parts, server.media_limits, server.limits)
    check_body_cap(json_bytes, references.inline_chars, server)
    return Parsed(validate(text, server.limits, contract), references)


async def parse_systemone(body: Any, model: Any, server: ServerSpec, parts: dict[str, FormPart] | None = None,
                          json_bytes: int = 0, contract: Contract | None = None) -> Parsed:
    """A System One body (a multipart body's `request` part and its media parts) as its typed request and media
    references; every problem of its text at once (RequestInvalid), a body over max_body_bytes without its media
    a BodyTooLarge."""
    big = parts is not None or json_bytes > INLINE_BYTES
    return await off_loop(big, parse_text, body, model, parts, json_bytes, server, contract)


async def decide_systemone(service: DecisionService, body: Any, model: Any) -> Decision:
    """A System One body decided by the service, parsed as the doors parse it (the CLI's path)."""
    parsed = await parse_systemone(body, model, service.server)
    return await service.decide(DecisionInput(parsed.request, model, parsed.media))
