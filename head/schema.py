"""Validation of System One request bodies into typed questions, per the Jev contract."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field, replace
from functools import cache, cached_property
from typing import Any, Callable, Mapping

from .declaration import Bound, Node, check, check_field, node
from .errors import Problem, RequestInvalid
from .media import ASSETS_FIELD, IMAGE, MEDIA_KINDS

QUESTION_TYPES = {"noul": 0, "choice": 1, "score": 2}
# Jev 1.14's question type that typesafe-sdk 0.7.5 sends: refused by name, with why
BOX, NO_BOX_HEAD = "box", "Clef has no box head (a box question needs a model that locates regions in an image)"
NOUL_DEFAULTS = {
    "true": "The proposition is true or the answer is yes.",
    "false": "The proposition is false or the answer is no.",
}
# every body field that carries media, each with the problem type of its refusal on this text-only path (assets
# hold images or audio: refused as images, as before audio had a field of its own)
MEDIA_FIELDS = {**{kind.field: kind.error_type for kind in MEDIA_KINDS.values()}, ASSETS_FIELD: IMAGE.error_type}
TEXT_FIELDS = ("model", "state", "questions")  # what reaches the prompt or the answer; other fields are ignored
SURROGATE = re.compile("[\ud800-\udfff]")  # in a str only unpaired ones remain: JSON's "\ud800" alone
MAX_TEXT_PROBLEMS = 16


@dataclass(frozen=True)
class Limits:
    """Per-request limits; each refusal names the models.toml [server] key that sets it."""

    max_questions: int = 64
    max_options: int = 255
    max_levels: int = 10
    max_state_bytes: int = 512 * 1024  # the rendered state, before tokenizing it
    max_json_depth: int = 64


TEXT_TYPES = ("string", "object", "array")  # what a state, instructions, a description may be: text or JSON
# a state as declared (its size, max_state_bytes, is checked on its rendered text: checked_state)
STATE = node(*TEXT_TYPES, msg="state must be a string, an object or an array", missing="state is required")


@cache
def question_declaration(limits: Limits) -> Node:
    """A System One question as declared: its type, its instructions and its criteria (whose shape follows the
    type: _options checks them)."""
    types = ", ".join(QUESTION_TYPES)
    return node("object", msg="a question must be an object with 'type'", ref="Question", required=("type",), fields={
        "type": node(enum=tuple(QUESTION_TYPES), enum_msg=f"type must be one of {types}; got {{got!r}}",
                     missing=f"type must be one of {types}; got None", missing_type="value_error",
                     refused={BOX: (f"{NO_BOX_HEAD}: it answers {types} questions; ask a choice or a score about the "
                                    "image instead", "box_not_supported")}, published={"type": "string"}),
        "instructions": node(*TEXT_TYPES, "null", msg="instructions must be a string, an object, an array or null"),
        "criteria": node(description=f"choice: object name -> description (2 to {limits.max_options} options, "
                                     f"max_options); score: array of 2 to {limits.max_levels} levels (max_levels), "
                                     "lowest first; noul: null or {true?, false?}")})


@cache
def questions_declaration(limits: Limits) -> Node:
    """A request's questions: id -> question, 1 to max_questions of them."""
    return node("object", msg="questions must be a non-empty object of id -> question", missing_type="type_error",
                nonempty=True, values=question_declaration(limits),
                bound=Bound(limits.max_questions, "at most {most} questions per request (max_questions), got {got}",
                            "too_many_questions"), description="max_questions; the Workers AI routes take fewer "
                                                               "(see their 422)")


@cache
def request_declaration(limits: Limits, name_resolved: bool = False) -> Node:
    """System One's text request as head/ checks it (media taken out of the body before): model, state, questions.
    name_resolved: the caller resolves the model's name, an empty one included."""
    return node("object", msg="the body must be a JSON object", required=("model", "state", "questions"), fields={
        "model": node("string", msg="model must be a non-empty string", missing_type="type_error",
                      nonblank=not name_resolved),
        "state": replace(STATE, description=f"at most {limits.max_state_bytes} bytes rendered (max_state_bytes)"),
        "questions": questions_declaration(limits)})


def json_depth(value: Any) -> int:
    """Nesting depth of a decoded JSON value (a scalar is 0), without recursion."""
    deepest, stack = 0, [(value, 0)]
    while stack:
        node, depth = stack.pop()
        if isinstance(node, (dict, list)):
            deepest = max(deepest, depth + 1)
            stack.extend((child, depth + 1) for child in (node.values() if isinstance(node, dict) else node))
    return deepest


def render(value: Any) -> str:
    """A text value as the prompt writes it: strings as they are, objects and arrays as compact sorted JSON."""
    if isinstance(value, str):
        return value
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"), sort_keys=True)


def option_order(qtype: str, keys: Any) -> list[Any]:
    """The order the prompt lists a question's criteria in: noul true then false, choice by code point (so
    request order cannot move an answer), score levels as given. Media placeholders are numbered in it."""
    if qtype == "noul":
        return [k for k in ("true", "false") if k in keys]
    return sorted(keys) if qtype == "choice" or isinstance(keys, dict) else list(keys)


def is_unicode(text: str) -> bool:
    """False when text holds an unpaired surrogate, which no UTF-8 encoder, tokenizer or JSON writer takes."""
    return text.isascii() or SURROGATE.search(text) is None


def unpaired_surrogates(roots: list[tuple[Any, tuple]]) -> list[Problem]:
    """A problem at each key or string under the (value, location) roots that is not valid Unicode (the first
    few)."""
    problems: list[Problem] = []
    stack = list(reversed(roots))
    while stack and len(problems) < MAX_TEXT_PROBLEMS:
        node, loc = stack.pop()
        if isinstance(node, str) and not is_unicode(node):
            problems.append(Problem(loc, "holds an unpaired surrogate (a lone \\ud800-\\udfff escape): text must "
                                    "be valid Unicode; send the character itself or a complete surrogate pair",
                                    "value_error.unicode"))
        elif isinstance(node, dict):
            for key, value in reversed(node.items()):
                if is_unicode(key):
                    stack.append((value, loc + (key,)))
                else:
                    problems.append(Problem(loc + (key,), "this key holds an unpaired surrogate (a lone "
                                            "\\ud800-\\udfff escape): keys must be valid Unicode",
                                            "value_error.unicode"))
        elif isinstance(node, list):
            stack.extend((value, loc + (i,)) for i, value in reversed(list(enumerate(node))))
    return problems


def _rendered(state: Any) -> str | None:
    try:
        return render(state)
    except (TypeError, ValueError):
        return None  # unrenderable states are refused by the encoder, with their location


Loc = tuple[str | int, ...]


@dataclass(frozen=True)
class Where:
    """Where the request as its front door received it holds a question's parts, so that a problem found after the
    door (a limit, an option no tokenizer can encode, instructions of no tokens) names the field the client sent."""

    question: Loc
    instructions: Loc
    criteria: Loc
    # option id or level index -> its location, where the door's shape is not criteria + that key
    options: Mapping[str | int, Loc] = field(default_factory=dict, hash=False)

    @classmethod
    def systemone(cls, qid: str) -> "Where":
        """A System One question's: body.questions[qid], its instructions and criteria by their names."""
        at = ("body", "questions", qid)
        return cls(at, at + ("instructions",), at + ("criteria",))

    def option(self, key: str | int) -> Loc:
        return self.options.get(key, self.criteria + (key,))


@dataclass(frozen=True)
class Question:
    id: str
    type: str
    instructions: Any  # str, dict, list or None, as sent
    options: tuple[tuple[str, Any], ...]  # (option id, description or None) in prompt order
    answer_keys: tuple[str, ...]  # option ids in the order the answer lists them
    at: Where | None = field(default=None, compare=False, repr=False)  # None: body.questions[id] (System One's)

    @property
    def type_id(self) -> int:
        return QUESTION_TYPES[self.type]

    @property
    def where(self) -> Where:
        return self.at if self.at is not None else Where.systemone(self.id)

    def decides(self) -> tuple[Any, ...]:
        """What of the question decides its answer (its location in the door's body does not)."""
        return self.id, self.type, self.instructions, self.options, self.answer_keys


@dataclass(frozen=True)
class DecisionRequest:
    model: str
    state: Any
    questions: tuple[Question, ...]
    state_at: Loc = ("body", "state")  # where the door's body holds the state
    # the state as the prompt writes it, where the door's validation rendered it (its size is checked on it)
    rendered: str | None = field(default=None, compare=False, repr=False)

    @cached_property
    def state_text(self) -> str:
        """The state rendered once for all who read it: the encoder, the answer's key, the decision log."""
        return self.rendered if self.rendered is not None else render(self.state)


def rendered_state(request: DecisionRequest) -> str:
    """request.state_text, or a 422 where the request holds the state when it is no JSON (a caller's Python value)."""
    try:
        return request.state_text
    except (TypeError, ValueError) as exc:
        raise RequestInvalid([Problem(request.state_at, f"cannot be rendered as text: {exc}", "value_error")]) from None


def _is_text(value: Any) -> bool:
    return value is None or isinstance(value, (str, dict, list))


def _text_problem(loc: tuple, what: str) -> Problem:
    return Problem(loc, f"{what} must be a string, an object, an array or null", "type_error")


def _named(names: list[Any], loc: tuple, problems: list[Problem]) -> dict[str, None]:
    """A choice's option names as given in a list: the object {name: null} they mean."""
    for i, name in enumerate(names):
        if not isinstance(name, str):
            problems.append(Problem(loc + (i,), "an option name must be a string", "type_error"))
        elif name in names[:i]:
            problems.append(Problem(loc + (i,), f"option {name!r} is named twice", "value_error"))
    return {name: None for name in names if isinstance(name, str)}


def _options(at: Where, qtype: str, criteria: Any, limits: Limits, problems: list[Problem]):
    loc = at.criteria
    if qtype == "noul":
        if criteria is None:
            criteria = {}
        if not isinstance(criteria, dict):
            problems.append(Problem(loc, "noul criteria must be null or an object with 'true' and/or 'false'",
                                    "type_error"))
            return None
        extra = sorted(set(criteria) - {"true", "false"})
        if extra:
            problems.append(Problem(loc, f"noul criteria take only 'true' and 'false', not {extra}", "value_error"))
        for key, value in criteria.items():
            if not _is_text(value):
                problems.append(_text_problem(at.option(key), "a criterion"))
        merged = NOUL_DEFAULTS | {k: v for k, v in criteria.items() if k in NOUL_DEFAULTS}
        return tuple((k, merged[k]) for k in option_order(qtype, merged)), ("true", "false")
    if qtype == "choice":
        if isinstance(criteria, list):  # laya-serve's form: option names, none described
            criteria = _named(criteria, loc, problems)
        if not isinstance(criteria, dict):
            problems.append(Problem(loc, "choice criteria must be an object of option name -> description (or an "
                                    "array of option names)", "type_error"))
            return None
        if not 2 <= len(criteria) <= limits.max_options:
            problems.append(Problem(loc, f"a choice needs 2 to {limits.max_options} options (max_options), "
                                    f"got {len(criteria)}", "value_error"))
        for key, value in criteria.items():
            if not _is_text(value):
                problems.append(_text_problem(at.option(key), "an option description"))
        return tuple((k, criteria[k]) for k in option_order(qtype, criteria)), tuple(criteria)
    if not isinstance(criteria, list):
        problems.append(Problem(loc, "score criteria must be an array of levels, lowest first", "type_error"))
        return None
    if not 2 <= len(criteria) <= limits.max_levels:
        problems.append(Problem(loc, f"a score needs 2 to {limits.max_levels} levels (max_levels), "
                                f"got {len(criteria)}", "value_error"))
    for i, value in enumerate(criteria):
        if value is None or not _is_text(value):  # a null level would leave a null in the answer's legend
            problems.append(Problem(at.option(i), "a level must be a string, an object or an array", "type_error"))
    keys = tuple(str(i) for i in range(len(criteria)))
    return tuple(zip(keys, criteria)), keys


def _question(qid: str, raw: Any, limits: Limits, problems: list[Problem], at: Where, declared: Node
              ) -> Question | None:
    loc = at.question
    if not (check(declared, raw, loc, problems, deep=False) and check_field(declared, raw, "type", loc, problems)):
        return None
    qtype, instructions = raw["type"], raw.get("instructions")
    readable = check(declared.fields["instructions"], instructions, at.instructions, problems)
    if readable and qid == "" and instructions in (None, ""):
        # The prompt falls back to the id as the instruction; an empty one leaves nothing to read.
        problems.append(Problem(loc, "a question with an empty id needs non-empty instructions", "value_error"))
    if qtype != "noul" and "criteria" not in raw:
        problems.append(Problem(at.criteria, f"a {qtype} question needs criteria", "missing"))
        return None
    built = _options(at, qtype, raw.get("criteria"), limits, problems)
    if built is None:
        return None
    options, keys = built
    return Question(qid, qtype, instructions, options, keys, at)


# Media left in a state's text: a data URL, or base64 that starts as an image or a clip does (PNG, JPEG, WebP/WAV's
# RIFF, GIF, MP3's ID3) or runs long; natural text, hashes and ids do neither
DATA_URL = re.compile(r"data:[a-z]+/[a-z0-9.+-]+;base64,", re.IGNORECASE)
MEDIA_BASE64 = re.compile(r"(?:iVBORw0KGgo|/9j/|UklGR|R0lGOD|SUQz)[A-Za-z0-9+/]{52,}|[A-Za-z0-9+/]{1024,}")


def embedded_media(state: Any) -> tuple[str, ...]:
    """What a response says (x_warnings) of a state whose text still holds media after the media fields were taken
    out: the model reads it as text, never as an image or a clip."""
    text = render(state)
    found = DATA_URL.search(text) or MEDIA_BASE64.search(text)
    if found is None:
        return ()
    what = "a data URL" if found.re is DATA_URL else f"a base64 run of {len(found.group())} characters"
    return (f"state.embedded_media: the state holds {what} at character {found.start()}; it is read as text, not as "
            "media: send images in `images` (or as image_url parts of a chat-message state), audio in `audio`, "
            "videos in `videos`",)


def check_depth(body: Any, limits: Limits) -> None:
    """A body as sent nested deeper than max_json_depth is a 422 (a door that renders part of it into text, as
    OpenAI's input_json, checks it before: the rendered text has no depth left to check)."""
    if json_depth(body) > limits.max_json_depth:
        raise RequestInvalid([Problem(("body",), f"the JSON is nested deeper than {limits.max_json_depth} levels "
                                      "(max_json_depth)", "json_too_deep")])


def parse_request(body: Any, limits: Limits = Limits(), *, name_resolved: bool = False) -> DecisionRequest:
    """Validate a decoded request body; every problem found is reported in one RequestInvalid. name_resolved: the
    caller resolves a string `model` against the names it serves (a server answers an empty one as a model it does not
    serve), so only a model that is no string is refused here."""
    declared, problems = request_declaration(limits, name_resolved), []
    if not check(declared, body, ("body",), problems, deep=False):
        raise RequestInvalid(problems)
    check_depth(body, limits)
    # text no tokenizer can encode, refused before any is tokenized
    problems = unpaired_surrogates([(body[f], ("body", f)) for f in TEXT_FIELDS if f in body])
    check_field(declared, body, "model", ("body",), problems)
    text = None
    if "state" in body:
        text = checked_state(body["state"], limits, problems)
    else:
        check_field(declared, body, "state", ("body",), problems)  # its absence
    for field, error_type in MEDIA_FIELDS.items():  # the server takes media out of the body before parsing it
        if body.get(field):
            problems.append(Problem(("body", field), "this path reads text only: send media through the server or "
                                    "the decision service (bridge/service), which take them out of the body first",
                                    error_type))
    questions = parse_questions(body.get("questions"), limits, problems)
    if problems:
        raise RequestInvalid(problems)
    return DecisionRequest(body["model"], body["state"], questions, rendered=text)


def checked_state(state: Any, limits: Limits, problems: list[Problem], loc: tuple = ("body", "state")
                  ) -> str | None:
    """A state as sent, rendered as the prompt writes it (DecisionRequest.rendered); what it gets wrong in its type
    or its size added to problems (its text's Unicode: unpaired_surrogates)."""
    if not check(STATE, state, loc, problems):
        return None
    text = _rendered(state)
    if text is not None and len(text.encode("utf-8", "surrogatepass")) > limits.max_state_bytes:
        problems.append(Problem(loc, f"the state is larger than {limits.max_state_bytes} bytes (max_state_bytes)",
                                "state_too_large"))
    return text


def parse_questions(raw_questions: Any, limits: Limits, problems: list[Problem],
                    where: Callable[[str], Where] = Where.systemone) -> tuple[Question, ...]:
    """A body's `questions` as typed questions in the request's order, each problem added to problems; where: each
    question's place in the door's body (a door whose shape is not System One's gives its own)."""
    declared = questions_declaration(limits)
    if not check(declared, raw_questions, ("body", "questions"), problems, deep=False):
        return ()
    typed = (_question(qid, raw, limits, problems, where(qid), declared.values) for qid, raw in raw_questions.items())
    return tuple(q for q in typed if q is not None)
