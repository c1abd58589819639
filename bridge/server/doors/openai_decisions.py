"""OpenAI's Decisions API (POST /v1/decisions) as a front door: the request becomes the equivalent System One body
(predicate -> noul, choice -> choice, score -> score; same instructions, options and order, so the same prompt and
the same probabilities), the service decides it, and the answers come back in OpenAI's shape. The rendering of an
input message list into Clef's state is described in docs/api.md ("OpenAI's Decisions API")."""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field, replace
from types import MappingProxyType
from typing import Any, Callable, Mapping

from aiohttp import web

from ....head.answer import Answer, ChoiceAnswer, NoulAnswer
from ....head.declaration import Bound, Node, check, check_field, json_schema, node
from ....head.errors import Problem, RequestInvalid
from ....head.schema import (
    BOX,
    NO_BOX_HEAD,
    DecisionRequest,
    Limits,
    Where,
    check_depth,
    checked_state,
    parse_questions,
    render,
    unpaired_surrogates,
)
from ...config.registry import ServerSpec
from ...media.kinds import IMAGE, TABLE
from ...media.request import MARKER, NO_REFERENCES, References, UnsupportedMediaType, data_url, located
from ...model.worker import RequestOptions
from ...service.decision import Decision, DecisionInput
from ...service.systemone import check_body_cap
from ..appstate import REGISTRY
from ..context import Door, json_response
from ..routes import OPENAI_SHAPE, PATHS
from .decisions import decide, extensions, read_body
from .systemone import systemone_answer

Loc = tuple[str | int, ...]
# What Clef asks for each of OpenAI's question types
QUESTION_TYPES = {"predicate": "noul", "choice": "choice", "score": "score"}
# The parts each input item's content (or output) may hold
PARTS = {"user": {"input_text", "input_image", "input_json"}, "developer": {"input_text"},
         "system": {"input_text"}, "assistant": {"output_text", "refusal"},
         "tool_output": {"input_text", "input_image"}, "instructions": {"input_text", "input_image", "input_json"}}
CALLS = {"function_call": "function_call_output", "custom_tool_call": "custom_tool_call_output"}
# An OpenAI answer's status -> its error type (the SDK reads `type`); other 4xx are invalid requests
ERROR_TYPES = {401: "authentication_error", 403: "permission_error", 404: "not_found_error",
               429: "rate_limit_error"}
# An input too long for a limit (the body's bytes, the state's bytes, the prompt's tokens), by its error or problem
# type: each answers OpenAI's context_length_exceeded, the code its clients read as a context overflow
CONTEXT_LENGTH_EXCEEDED = "context_length_exceeded"
TOO_LONG = frozenset({"request_too_large", "state_too_large", CONTEXT_LENGTH_EXCEEDED})


@dataclass
class Parsed:
    """An OpenAI request parsed once, at this door: the typed request and its media references, each part located
    in the OpenAI body (a refusal past the door names the field the client sent), the model, the prefix cache's
    partition, and each question's name and typed values for the answer."""

    request: DecisionRequest | None = None
    media: References = NO_REFERENCES
    model: Any = None
    partition: tuple[str, ...] = ()
    ids: list[str] = field(default_factory=list)  # each question's id, in the request's order
    names: list[str | None] = field(default_factory=list)
    values: dict[str, list[Any]] = field(default_factory=dict)  # question id -> typed choice values or level labels
    where: dict[str, Where] = field(default_factory=dict)  # question id -> its parts' places in the OpenAI body


class _Problems(list):
    def add(self, loc: Loc, msg: str, kind: str = "value_error") -> None:
        self.append(Problem(("body",) + loc, msg, kind))


def param(loc: Loc) -> str | None:
    """An OpenAI `param`: questions[0].choices[1] for ("body", "questions", 0, "choices", 1)."""
    out = ""
    for part in loc[1:] if loc[:1] == ("body",) else loc:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out or None


OPENAI_ERROR = node("object", required=("error",), fields={"error": node(
    "object", required=("message", "type", "param", "code"), fields={
        "message": node("string"), "type": node("string"), "param": node("string", "null"), "code": node("string")})})


def openai_error(exc: BaseException | None, status: int, error_type: str, message: str) -> dict[str, Any]:
    """OpenAI's error shape: {"error": {message, type, param, code}}; an invalid request's param names the first
    offending field (a too-long input's first), its code says what is wrong with it (context_length_exceeded for
    any input over a length limit, the limit in the message). The message starts with the field, or else the code
    (context_length_exceeded always): the SDK's exception text holds only the message, and clients read it
    (langchain-openai looks for context_length_exceeded there)."""
    kind = ERROR_TYPES.get(status, "invalid_request_error" if status < 500 else "server_error")
    if isinstance(exc, RequestInvalid) and exc.problems:
        first = next((p for p in exc.problems if p.type in TOO_LONG), exc.problems[0])
        message = "; ".join(f"{param(p.loc) or 'body'}: {p.msg}" for p in exc.problems)
        code = _code(first.type)
        lead = f"{code}: " if code == CONTEXT_LENGTH_EXCEEDED else ""
        return {"error": {"message": lead + message, "type": kind, "param": param(first.loc), "code": code}}
    code = _code(error_type)
    return {"error": {"message": f"{code}: {message}", "type": kind, "param": None, "code": code}}


def _code(error_type: str) -> str:
    return CONTEXT_LENGTH_EXCEEDED if error_type in TOO_LONG else error_type


# --- the request -------------------------------------------------------------------------------------------

MAX_CACHE_KEY = 256  # a prompt_cache_key partitions within its tenant: a name, not a payload (1 MB ones came)
# a content, an output or instructions: text, or parts (each part's own fields are _parts' to read)
PARTS_TEXT = node("string", "array", msg="must be a string or an array of content parts",
                  published={"items": {"type": "object", "required": ["type"]}})
# OpenAI's request declared once: parse() checks it (each item, part, choice and level is read by its function
# below, which the declaration describes), /openapi.json publishes it
ITEM = node("object", msg="an input item must be an object (a message, a call or a call's output)",
            description="a message {role, content}, a call {type, call_id, name, arguments or input} or a call's "
                        "output {type, call_id, output}")
QUESTION = node("object", msg="a question must be an object with type and instructions",
                required=("type", "instructions"), fields={
                    "type": node(enum=tuple(QUESTION_TYPES), enum_msg="type must be predicate, choice or score; got "
                                 "{got!r}", enum_type="invalid_value", missing="type must be predicate, choice or "
                                 "score; got None", missing_type="invalid_value", published={"type": "string"},
                                 refused={BOX: (f"{NO_BOX_HEAD}: it answers {', '.join(QUESTION_TYPES)} questions; ask "
                                                "a choice or a score about the image instead", "box_not_supported")}),
                    "name": node("string", "null", msg="name must be a string"),
                    "instructions": replace(PARTS_TEXT, missing="instructions are required: text or text parts"),
                    "choices": node("array", msg="choices must be an array of {value, description?}", published={
                        "minItems": 2, "items": {"type": "object", "required": ["value"], "properties": {
                            "value": {"type": ["string", "boolean"]}, "description": {"type": "string"}}}}),
                    "levels": node("array", msg="levels must be an array of {label, description?}, lowest first",
                                   published={"minItems": 2, "items": {
                                       "type": "object", "required": ["label"], "properties": {
                                           "label": {"type": "string"}, "description": {"type": "string"}}}})})
REQUEST = node("object", msg="the body must be a JSON object", required=("model", "input", "questions"), fields={
    "model": node("string", msg="model is required: a served model's name", null_missing=True, nonblank=True,
                  blank="model must be a non-empty string"),
    "input": node("string", "array", msg="input must be a string or a non-empty array of messages, calls and outputs",
                  null_missing=True, nonempty=True, items=ITEM,
                  description="a string (the state), or messages, calls and outputs (a JSON state, see docs/api.md); "
                              "images as input_image base64 data URLs, never URLs"),
    "questions": node("array", msg="questions must be a non-empty array of predicate, choice and score questions",
                      null_missing=True, nonempty=True, items=QUESTION),
    "prompt_cache_key": node("string", "null", msg="must be a string", description="partitions the prefix cache",
                             bound=Bound(MAX_CACHE_KEY, "must be at most {most} characters, got {got}",
                                         "string_too_long")),
    "prompt_cache_options": node("object", "null", msg="must be an object {mode?, ttl?}", fields={
        "mode": node(enum=("implicit", "explicit", None), enum_msg="mode must be implicit or explicit",
                     enum_type="invalid_value"),
        "ttl": node(enum=("30m", None), enum_msg="ttl must be 30m", enum_type="invalid_value")},
        description="accepted; changes nothing"),
    "safety_identifier": node("string", "null", msg="must be a string", description="accepted and ignored")})

class _Images:
    """input_image parts as the prompt reads them: each one's marker in the text ([image N], numbered in the order
    the prompt renders them: the input's items, then each question's instructions), the image by its location."""

    def __init__(self, problems: _Problems):
        self.problems = problems
        self.sources: list[tuple[Loc, str]] = []  # (its image_url's location, its base64)

    def placeholder(self, part: dict[str, Any], loc: Loc) -> str | None:
        url = part.get("image_url")
        if part.get("file_id") is not None or not isinstance(url, str):
            self.problems.add(loc + ("image_url",), "input_image needs image_url: a base64 data URL such as "
                              "data:image/png;base64,... (file ids are not supported)",
                              "missing" if url is None else "type_error")
            return None
        if url.startswith(("http://", "https://")):
            self.problems.add(loc + ("image_url",), "is a URL; clef-bridge fetches nothing: send the image as a "
                              "base64 data URL (data:image/png;base64,...)", "image_url_not_supported")
            return None
        parsed = data_url(url)
        fmt = parsed.media_type.removeprefix("image/") if parsed and parsed.media_type.startswith("image/") else ""
        if parsed is None or not parsed.base64 or fmt not in TABLE[IMAGE].formats:
            self.problems.add(loc + ("image_url",), "must be a base64 data URL of a PNG, JPEG or WebP image "
                              "(data:image/png;base64,...)", "invalid_image_url")
            return None
        # the bytes decide the real format; the service decodes and hashes them once
        self.sources.append((("body",) + loc + ("image_url",), url[parsed.start:]))
        return MARKER.format(len(self.sources))


def _parts(content: Any, allowed: set[str], loc: Loc, images: _Images) -> Any:
    """A content (or output): a string stays a string; parts become a list of texts, image placeholders, JSON
    data and {"refusal": text} objects."""
    problems = images.problems
    if not check(PARTS_TEXT, content, ("body",) + loc, problems):
        return None
    if isinstance(content, str):
        return content
    out = []
    for j, part in enumerate(content):
        kind = part.get("type") if isinstance(part, dict) else None
        if not isinstance(kind, str) or kind not in allowed:
            problems.add(loc + (j, "type"), f"this content takes parts of type {', '.join(sorted(allowed))}; got "
                         f"{kind!r}", "invalid_type")
        elif kind in ("input_text", "output_text", "refusal"):
            text = part.get("refusal" if kind == "refusal" else "text")
            if not isinstance(text, str):
                problems.add(loc + (j, "refusal" if kind == "refusal" else "text"), "must be a string",
                             "type_error")
            out.append({"refusal": text} if kind == "refusal" else text)
        elif kind == "input_json":
            data = part.get("data")
            if not isinstance(data, (dict, list)):
                problems.add(loc + (j, "data"), "must be a JSON object or an array of objects", "type_error")
            out.append(data)
        else:
            out.append(images.placeholder(part, loc + (j,)))
    return out


def _text(value: Any, loc: Loc, problems: _Problems, required: bool = True) -> Any:
    if isinstance(value, str) or (value is None and not required):
        return value
    problems.add(loc, "must be a string", "missing" if value is None else "type_error")
    return None


def _item(item: Any, i: int, calls: dict[str, set[str]], images: _Images) -> Any:
    """One input item as the state's JSON: a message {role, content[, phase]}, a call {type, call_id, name,
    arguments or input[, namespace]} or an output {type, call_id, output}; item ids and statuses are left out."""
    problems, loc = images.problems, ("input", i)
    if not check(ITEM, item, ("body",) + loc, problems):
        return None
    sent = item.get("type", "message")
    kind = sent if isinstance(sent, str) else ""  # refused below, named as sent
    if kind == "message":
        role = item.get("role")
        if role not in ("user", "developer", "system", "assistant"):
            problems.add(loc + ("role",), f"role must be user, developer, system or assistant; got {role!r}",
                         "invalid_value")
            return None
        out = {"role": role, "content": _parts(item.get("content"), PARTS[role], loc + ("content",), images)}
        if role == "assistant" and item.get("phase") is not None:
            out["phase"] = _text(item["phase"], loc + ("phase",), problems)
        return out
    call = next((c for c, o in CALLS.items() if o == kind), None)  # what an output answers
    if kind not in CALLS and call is None:
        problems.add(loc + ("type",), "an input item's type must be message, function_call, function_call_output, "
                     f"custom_tool_call or custom_tool_call_output; got {sent!r}", "invalid_type")
        return None
    call_id = _text(item.get("call_id"), loc + ("call_id",), problems)
    if call is None:
        calls[kind].add(call_id)
        arguments = "arguments" if kind == "function_call" else "input"
        out = {"type": kind, "call_id": call_id, "name": _text(item.get("name"), loc + ("name",), problems),
               arguments: _text(item.get(arguments), loc + (arguments,), problems)}
        if item.get("namespace") is not None:
            out["namespace"] = _text(item["namespace"], loc + ("namespace",), problems)
        return out
    if isinstance(call_id, str) and call_id not in calls[call]:
        problems.add(loc + ("call_id",), f"no earlier {call} has call_id {call_id!r}: a tool output must follow its "
                     "call", "invalid_value")
    return {"type": kind, "call_id": call_id,
            "output": _parts(item.get("output"), PARTS["tool_output"], loc + ("output",), images)}


def _state(body: dict[str, Any], images: _Images) -> Any:
    if not check_field(REQUEST, body, "input", ("body",), images.problems, deep=False):
        return None
    raw = body["input"]
    if isinstance(raw, str):
        return raw
    calls: dict[str, set[str]] = {kind: set() for kind in CALLS}
    return [_item(item, i, calls, images) for i, item in enumerate(raw)]


def _instructions(raw: Any, loc: Loc, images: _Images) -> str | None:
    """Text, or parts joined into one text (a JSON part as compact sorted JSON, an image as its placeholder)."""
    parts = _parts(raw, PARTS["instructions"], loc, images)
    if not isinstance(parts, list):
        return parts
    return "".join(p if isinstance(p, str) else render(p) for p in parts if p is not None)


def _listed(declared: Node, raw: Any, loc: Loc, problems: _Problems) -> bool:
    """A choice's choices or a score's levels: there (the question's type needs them), and an array."""
    if raw is None:
        problems.add(loc, declared.msg, "missing")
        return False
    return check(declared, raw, ("body",) + loc, problems)


def _choices(raw: Any, loc: Loc, t: Parsed, qid: str, problems: _Problems) -> dict[str, Any]:
    """Choice values as System One options: a value's text names it (a boolean reads true or false), so two values
    of one text cannot both be asked; the answer gives each value back with its type."""
    if not _listed(QUESTION.fields["choices"], raw, loc, problems):
        return {}
    criteria: dict[str, Any] = {}
    values = t.values[qid] = []
    at: dict[str | int, Loc] = {}
    for j, choice in enumerate(raw):
        value = choice.get("value") if isinstance(choice, dict) else None
        if not isinstance(value, (str, bool)):
            problems.add(loc + (j, "value"), "a choice's value must be a string or a boolean",
                         "missing" if value is None else "type_error")
            continue
        text = value if isinstance(value, str) else ("true" if value else "false")
        if text in criteria:
            same = values[list(criteria).index(text)]
            shown, other = json.dumps(value), json.dumps(same)
            problems.add(loc + (j, "value"), f"duplicate choice {shown}: each choice must be unique" if shown == other
                         else f"{shown} and {other} read the same to Clef ({text}): a choice's value enters the "
                         "prompt as text, so a string and a boolean of one text cannot both be choices",
                         "duplicate_choice")
            continue
        criteria[text] = _text(choice.get("description"), loc + (j, "description"), problems, required=False)
        values.append(value)
        at[text] = ("body",) + loc + (j,)
    t.where[qid] = replace(t.where[qid], options=at)
    return criteria


def _levels(raw: Any, loc: Loc, t: Parsed, qid: str, problems: _Problems) -> list[Any]:
    """Score levels: a label alone reads as its text, a label with a description as {"description", "label"}."""
    if not _listed(QUESTION.fields["levels"], raw, loc, problems):
        return []
    levels: list[Any] = []
    labels = t.values[qid] = []
    at: dict[str | int, Loc] = {}
    for j, level in enumerate(raw):
        label = level.get("label") if isinstance(level, dict) else None
        if not isinstance(label, str):
            problems.add(loc + (j, "label"), "a level needs a label (a string)", "missing" if label is None else
                         "type_error")
            continue
        description = _text(level.get("description"), loc + (j, "description"), problems, required=False)
        levels.append(label if description is None else {"label": label, "description": description})
        labels.append(label)
        # a level is its index to the schema's checks and its id, the index's text, to the encoder
        at[len(levels) - 1] = at[str(len(levels) - 1)] = ("body",) + loc + (j,)
    t.where[qid] = replace(t.where[qid], options=at)
    return levels


def _question(raw: Any, i: int, t: Parsed, images: _Images, ids: set[str]) -> tuple[str, dict] | None:
    problems, loc = images.problems, ("questions", i)
    here = ("body",) + loc
    if not (check(QUESTION, raw, here, problems, deep=False) and check_field(QUESTION, raw, "type", here, problems)):
        return None
    kind, name = raw["type"], raw.get("name")
    check_field(QUESTION, raw, "name", here, problems)
    qid = name if isinstance(name, str) else f"question_{i}"  # an id the prompt reads, as System One's
    if qid in ids:
        problems.add(loc + ("name",), f"two questions are named {qid!r}; names must be unique (an unnamed question "
                     f"i is asked as question_i)", "duplicate_name")
        return None
    ids.add(qid)
    t.ids.append(qid)
    t.names.append(name if isinstance(name, str) else None)
    criteria = {"choice": ("choices",), "score": ("levels",)}.get(kind, ())  # a predicate has none
    t.where[qid] = Where(here, here + ("instructions",), here + criteria)
    if "instructions" not in raw:
        check_field(QUESTION, raw, "instructions", here, problems)  # its absence
    question = {"type": QUESTION_TYPES[kind], "instructions": _instructions(raw.get("instructions"),
                                                                             loc + ("instructions",), images)}
    if kind == "choice":
        question["criteria"] = _choices(raw.get("choices"), loc + ("choices",), t, qid, problems)
    elif kind == "score":
        question["criteria"] = _levels(raw.get("levels"), loc + ("levels",), t, qid, problems)
    return qid, question




def _options(body: dict[str, Any], problems: _Problems) -> tuple[str, ...]:
    """The prefix cache's partition from prompt_cache_key; prompt_cache_options and safety_identifier are checked
    and change nothing."""
    for name in ("prompt_cache_key", "safety_identifier", "prompt_cache_options"):
        check_field(REQUEST, body, name, ("body",), problems)
    key = body.get("prompt_cache_key")
    return (key,) if isinstance(key, str) else ()


def parse(body: Any, limits: Limits, media_limits: Mapping[str, Any] = MappingProxyType({})) -> Parsed:
    """The OpenAI request as the typed request the service takes; every problem of it at once (RequestInvalid, each
    located in the OpenAI request): its own shape's first, then Clef's limits on what it asks."""
    problems, t = _Problems(), Parsed()
    if not check(REQUEST, body, ("body",), problems, deep=False):
        raise RequestInvalid(problems)
    check_field(REQUEST, body, "model", ("body",), problems)
    t.model = body.get("model")
    t.partition = _options(body, problems)
    images = _Images(problems)
    state = _state(body, images)
    questions: dict[str, dict] = {}
    if check_field(REQUEST, body, "questions", ("body",), problems, deep=False):
        ids: set[str] = set()
        for i, question in enumerate(body["questions"]):
            built = _question(question, i, t, images, ids)
            if built is not None:
                questions[built[0]] = built[1]
    if problems:
        raise RequestInvalid(problems)
    # text no tokenizer can encode, where the client sent it
    problems += unpaired_surrogates([(body[f], ("body", f)) for f in ("model", "input", "questions") if f in body])
    text = checked_state(state, limits, problems, ("body", "input"))
    typed = parse_questions(questions, limits, problems, t.where.__getitem__)
    if problems:
        raise RequestInvalid(problems)
    t.request = DecisionRequest(t.model, state, typed, ("body", "input"), text)
    t.media = located({IMAGE: images.sources}, media_limits, ("body", "input"))
    return t


# --- the answer --------------------------------------------------------------------------------------------

def _answer(answer: Answer, name: str | None, values: list[Any]) -> dict[str, Any]:
    if isinstance(answer, NoulAnswer):
        return {"type": "predicate", "name": name, "probability": answer.probability}
    probabilities = [p for _, p in answer.probabilities]  # in the request's order: values' order
    if isinstance(answer, ChoiceAnswer):
        best = [key for key, _ in answer.probabilities].index(answer.choice)
        return {"type": "choice", "name": name, "choice": values[best], "confidence": answer.confidence,
                "probabilities": [{"value": v, "probability": p} for v, p in zip(values, probabilities)]}
    return {"type": "score", "name": name, "score": answer.score, "confidence": answer.confidence,
            "probabilities": [{"value": k, "label": label, "probability": p}
                              for k, (label, p) in enumerate(zip(values, probabilities))]}


def to_openai(t: Parsed, decision: Decision, extra: dict[str, Any]) -> dict[str, Any]:
    """The Decision's answers as OpenAI's Decision: in question order, usage with the cached tokens; extra: the
    x_ extensions."""
    tokens, by_id = decision.input_tokens, {a.id: a for a in decision.answers}
    answers = [_answer(by_id[qid], name, t.values.get(qid, [])) for qid, name in zip(t.ids, t.names)]
    reused_tokens = decision.reused_tokens
    return {"model": decision.requested, "answers": answers,
            "usage": {"input_tokens": tokens, "input_tokens_details": {"cached_tokens": reused_tokens,
                                                                       "cache_write_tokens": 0},
                      "output_tokens": 0, "output_tokens_details": {"reasoning_tokens": 0},
                      "total_tokens": tokens}, **extra}


def is_systemone(data: Any) -> bool:
    """A System One body (questions an object, a state, no input), as litellm's perplexity and empiriolabs providers
    post to /v1/decisions: OpenAI's questions are an array and its text is `input`."""
    return isinstance(data, dict) and isinstance(data.get("questions"), dict) and "input" not in data


async def decisions_handler(request: web.Request) -> web.Response:
    start = time.perf_counter()
    body = await read_body(request, kinds=(IMAGE,))  # input_image parts, no audio or video
    if body.parts is not None:
        raise UnsupportedMediaType("POST /v1/decisions takes application/json; send images as input_image data URLs")
    if is_systemone(body.data):  # answered as System One, in System One's shape
        return await systemone_answer(request, body, start)
    server = request.app[REGISTRY].server
    check_depth(body.data, server.limits)  # input_json parts are rendered into text below
    parsed = parse(body.data, server.limits, server.media_limits)
    check_body_cap(body.json_bytes, parsed.media.inline_chars, server)  # its text, without its images' base64
    decision: Decision = await decide(request, DecisionInput(
        parsed.request, parsed.model, parsed.media, RequestOptions(partition=parsed.partition)))
    extra, headers = extensions(request, decision, start, [])
    return json_response(to_openai(parsed, decision, extra), headers=headers)


def openapi_paths(security: list[dict[str, Any]], errors: Callable[..., dict[str, Any]], server: ServerSpec
                  ) -> dict[str, Any]:
    """POST /v1/decisions in /openapi.json: OpenAI's request and answer, its errors in OpenAI's shape."""
    openai = json_schema(REQUEST)
    answer = {"type": "object", "required": ["type", "name"], "properties": {
        "type": {"type": "string", "enum": list(QUESTION_TYPES)}, "name": {"type": ["string", "null"]},
        "probability": {"type": "number"}, "choice": {"anyOf": [{"type": "string"}, {"type": "boolean"}]},
        "score": {"type": "number"}, "confidence": {"type": "number"},
        "probabilities": {"type": "array", "items": {"type": "object"}}}}
    # a System One body (questions an object, no input) is answered as POST /v1/systemone answers it
    request = {"anyOf": [openai, {"$ref": "#/components/schemas/SystemOneRequest"}]}
    decision = {"type": "object", "required": ["model", "answers", "usage"], "properties": {
        "model": {"type": "string"}, "answers": {"type": "array", "items": answer}, "usage": {"type": "object"}}}
    ok = {"description": "OpenAI's Decision, or System One's answer to a System One body", "content": {
        "application/json": {"schema": {"anyOf": [decision, {"$ref": "#/components/schemas/SystemOneResponse"}]}}}}
    failed = "OpenAI's error {error: {message, type, param, code}}; an invalid request is a 400"
    return {PATHS[name]: {"post": {
        "operationId": name, "security": security,
        "requestBody": {"required": True, "content": {"application/json": {"schema": request}}},
        "responses": {"200": ok, **errors(400, 401, 404, 408, 413, 415, 429, 503, description=failed)}}}
        for name in NAMES}


NAMES = ("openai_decisions", *(name for name in PATHS if name.startswith("openai_decisions_at_")))


# OpenAI answers an invalid request 400, where the Jev API answers 422, and a request over a limit 400 too (its
# clients catch BadRequestError, langchain-openai reads code context_length_exceeded there), where Jev answers 413
DOOR = Door(OPENAI_SHAPE, dict.fromkeys(NAMES, decisions_handler), openai_error, OPENAI_ERROR, openapi_paths,
            {422: 400, 413: 400})
