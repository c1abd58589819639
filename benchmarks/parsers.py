"""`python -m benchmarks parsers`: pydantic v2, msgspec and today's own code (orjson.loads + head.schema.parse_request,
and the server's own path, bridge/server/body.parse_json + parse_request) weighed on System One request bodies, from
bytes to the DecisionRequest the encoder reads: a 4 MB body, 10,000 small ones (do all accept the same?), a body with
planted problems (each one reported, with its location?), bodies only a strict JSON reader refuses, import cost, and
whether the declaration can emit a JSON Schema. The pydantic and msgspec declarations mirror parse_request's rules."""

# No `from __future__ import annotations`: the declarations are built inside functions (their limits are arguments),
# and msgspec resolves string annotations in the module's globals only, where those local names are not.

import json
import random
import re
import statistics
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Any, Callable, Literal, Union

import orjson
from clef_bridge.head.errors import RequestInvalid
from clef_bridge.head.schema import NOUL_DEFAULTS, DecisionRequest, Limits, Question, json_depth, option_order, \
    parse_request, render

ROOT = Path(__file__).resolve().parent.parent
OWN, SERVER, PYDANTIC, MSGSPEC = "own (orjson)", "own (server json)", "pydantic", "msgspec"
BIG_BYTES = 4_000_000  # under max_body_bytes' default, 4 MiB
WORDS = ("invoice refund export dashboard finance report nightly job failed stale numbers customer account "
         "password login latency outage billing contract renewal shipment delayed warehouse café naïve 東京 "
         "Straße señal").split()  # a few non-ASCII words: own code's Unicode check leaves its fast path for them
Loc = tuple[Union[str, int], ...]


@dataclass(frozen=True)
class Parser:
    """One way from bytes to a checked request: validate() gives the library's own value, parse() a DecisionRequest."""

    name: str
    validate: Callable[[bytes], Any]
    to_request: Callable[[Any], DecisionRequest]
    refusals: tuple[type[Exception], ...]
    problems: Callable[[Exception], list[tuple[Loc, str]]]  # each refusal's (location from the body, message)
    schema: Callable[[], dict] | None = None
    converts: bool = True  # validate() gives the library's value, to_request() converts it; False: one step
    decode: Callable[[bytes], Any] | None = None  # the same library's JSON reader without the declaration

    def parse(self, data: bytes) -> DecisionRequest:
        """bytes -> DecisionRequest, or one of self.refusals."""
        return self.to_request(self.validate(data))


@dataclass(frozen=True)
class ParsersBench:
    versions: dict[str, str]  # parser -> its JSON reader or library, with the version
    missing: dict[str, str]  # parser -> why it was left out
    bodies: dict[str, int]  # body kind -> bytes (the small ones: their count and mean size)
    # body -> parser -> {request_ms: to a DecisionRequest, validated_ms: to the library's value, json_ms: its JSON
    # reader alone, no declaration} (medians; own code validates into the DecisionRequest in one step)
    big: dict[str, dict[str, dict[str, float]]]
    small: dict[str, dict[str, float]]  # parser -> the same, the whole set of small bodies, median of rounds
    agreement: dict[str, Any]
    planted: list[dict[str, Any]]  # each planted problem: its label, where it is, and per parser the locations found
    bad: dict[str, dict[str, Any]]  # parser -> {planted, errors, found, located, unplaced (errors placed at none)}
    strict: list[dict[str, Any]]  # each strict-JSON case: per parser "refused at LOC" or "accepted"
    imports: dict[str, dict[str, float]]  # parser -> {import_ms: over a bare interpreter, ready_ms: import + declare
    # over an interpreter that has own code loaded (what the server would add)}
    schema: dict[str, dict[str, Any]]
    setup: dict[str, Any] = field(default_factory=dict)


def _build(model: str, state: Any, questions: list[tuple[str, str, Any, Any]]) -> DecisionRequest:
    """The DecisionRequest parse_request builds, from (id, type, instructions, criteria) as validated."""
    built = []
    for qid, qtype, instructions, criteria in questions:
        if qtype == "noul":
            merged = NOUL_DEFAULTS | dict(criteria or {})
            options, keys = tuple((k, merged[k]) for k in option_order(qtype, merged)), ("true", "false")
        elif qtype == "choice":
            named = criteria if isinstance(criteria, dict) else dict.fromkeys(criteria)
            options, keys = tuple((k, named[k]) for k in option_order(qtype, named)), tuple(named)
        else:
            keys = tuple(str(i) for i in range(len(criteria)))
            options = tuple(zip(keys, criteria))
        built.append(Question(qid, qtype, instructions, options, keys))
    return DecisionRequest(model, state, tuple(built))


def _state_error(state: Any, limits: Limits) -> str:
    """parse_request's state size and body depth rules, as the declarations run them on the state alone."""
    if len(render(state).encode("utf-8", "surrogatepass")) > limits.max_state_bytes:
        return f"the state is larger than {limits.max_state_bytes} bytes (max_state_bytes)"
    return _too_deep([state], limits.max_json_depth - 1, limits)


def _too_deep(values: Any, levels: int, limits: Limits) -> str:
    """Nested values may go `levels` deep: where they sit in the body spends the rest of max_json_depth (neither
    library has a depth limit of its own); a string is never deep."""
    if any(not isinstance(v, str) and v is not None and json_depth(v) > levels for v in values):
        return f"the JSON is nested deeper than {limits.max_json_depth} levels (max_json_depth)"
    return ""


def _named_twice(names: list[str]) -> str:
    return "an option is named twice" if len(set(names)) != len(names) else ""


def _empty_id(questions: dict[str, Any]) -> str:
    """The prompt falls back to a question's id as its instruction: an empty id needs instructions."""
    if "" in questions and questions[""].instructions in (None, ""):
        return "a question with an empty id needs non-empty instructions"
    return ""


def _refuse(*whys: str) -> None:
    """Raise the first reason given (the libraries turn a ValueError into a validation error at its place)."""
    if why := next(filter(None, whys), ""):
        raise ValueError(why)


def own_parsers(limits: Limits) -> list[Parser]:
    """Today's code: orjson.loads, and the server's strict json.loads (no duplicate keys, NaN or infinities)."""
    from clef_bridge.bridge.server.body import parse_json

    def problems(exc: Exception) -> list[tuple[Loc, str]]:
        if isinstance(exc, RequestInvalid):
            return [(p.loc[1:] if p.loc[:1] == ("body",) else p.loc, p.msg) for p in exc.problems]
        return [((), str(exc))]  # orjson's JSONDecodeError: the body as a whole

    same = lambda request: request  # noqa: E731 - parse_request's value is the DecisionRequest itself
    return [Parser(OWN, lambda data: parse_request(orjson.loads(data), limits), same,
                   (RequestInvalid, orjson.JSONDecodeError), problems, converts=False, decode=orjson.loads),
            Parser(SERVER, lambda data: parse_request(parse_json(data), limits), same, (RequestInvalid,), problems,
                   converts=False, decode=parse_json)]


def declare_pydantic(limits: Limits) -> type:
    """The request as pydantic v2 models: strict (no coercion), limits as constraints, the rest as validators."""
    from pydantic import AfterValidator, BaseModel, ConfigDict, Field

    def rule(why: Callable[[Any], str]) -> AfterValidator:
        """A validator refusing a value for the reason why(value) gives ('' passes it)."""
        return AfterValidator(lambda value: _refuse(why(value)) or value)

    def text(levels: int) -> Any:
        room = rule(lambda value: _too_deep([value], levels, limits))  # strings need no depth check
        return Union[str, Annotated[dict[str, Any], room], Annotated[list[Any], room]]

    deep = limits.max_json_depth
    # named apart from the fields: `instructions: instructions = None` in a class body reads the name just assigned
    asked, described = Union[text(deep - 3), None], Union[text(deep - 4), None]
    options = Field(min_length=2, max_length=limits.max_options)

    class Strict(BaseModel):
        model_config = ConfigDict(strict=True, extra="ignore")  # parse_request ignores fields it does not read

    class Noul(Strict):
        type: Literal["noul"]
        instructions: asked = None
        criteria: Union[dict[Literal["true", "false"], described], None] = None

    class Choice(Strict):
        type: Literal["choice"]
        instructions: asked = None
        criteria: Union[Annotated[dict[str, described], options],
                        Annotated[list[str], options, rule(_named_twice)]]

    class Score(Strict):
        type: Literal["score"]
        instructions: asked = None
        criteria: Annotated[list[text(deep - 4)], Field(min_length=2, max_length=limits.max_levels)]

    empty = Annotated[Union[list[Any], None], Field(max_length=0)]  # media: only through the server's media path

    class Request(Strict):
        model: Annotated[str, Field(min_length=1)]
        state: Annotated[Union[str, dict[str, Any], list[Any]], rule(lambda state: _state_error(state, limits))]
        questions: Annotated[dict[str, Annotated[Union[Noul, Choice, Score], Field(discriminator="type")]],
                             Field(min_length=1, max_length=limits.max_questions), rule(_empty_id)]
        images: empty = None
        audio: empty = None
        videos: empty = None
        assets: empty = None

    return Request


def pydantic_parser(limits: Limits) -> Parser:
    """The pydantic declaration behind model_validate_json."""
    from pydantic import ValidationError
    from pydantic_core import from_json

    request = declare_pydantic(limits)

    def to_request(r: Any) -> DecisionRequest:
        return _build(r.model, r.state, [(k, q.type, q.instructions, q.criteria) for k, q in r.questions.items()])

    def problems(exc: Exception) -> list[tuple[Loc, str]]:
        return [(tuple(e["loc"]), e["msg"]) for e in exc.errors(include_url=False)]

    return Parser(PYDANTIC, request.model_validate_json, to_request, (ValidationError,), problems,
                  request.model_json_schema, decode=from_json)


def declare_msgspec(limits: Limits) -> type:
    """The request as msgspec Structs: a tagged union of question types, limits as Meta, the rest in __post_init__."""
    import msgspec
    from msgspec import Meta, Struct

    deep = limits.max_json_depth
    text = Union[str, dict[str, Any], list[Any]]
    described = Union[text, None]
    options = Meta(min_length=2, max_length=limits.max_options)

    class Asked(Struct, tag_field="type", kw_only=True):  # kw_only: required criteria may follow the default
        instructions: described = None

    class Noul(Asked, tag="noul"):
        criteria: Union[dict[Literal["true", "false"], described], None] = None

        def __post_init__(self) -> None:
            _refuse(_too_deep([self.instructions], deep - 3, limits),
                    _too_deep((self.criteria or {}).values(), deep - 4, limits))

    class Choice(Asked, tag="choice"):
        criteria: Union[Annotated[dict[str, described], options], Annotated[list[str], options]]

        def __post_init__(self) -> None:
            named = isinstance(self.criteria, list)
            _refuse(_too_deep([self.instructions], deep - 3, limits), _named_twice(self.criteria) if named else
                    _too_deep(self.criteria.values(), deep - 4, limits))

    class Score(Asked, tag="score"):
        criteria: Annotated[list[text], Meta(min_length=2, max_length=limits.max_levels)]

        def __post_init__(self) -> None:
            _refuse(_too_deep([self.instructions], deep - 3, limits), _too_deep(self.criteria, deep - 4, limits))

    empty = Union[Annotated[list[Any], Meta(max_length=0)], None]

    class Request(Struct):
        model: Annotated[str, Meta(min_length=1)]
        state: text
        questions: Annotated[dict[str, Union[Noul, Choice, Score]], Meta(min_length=1, max_length=limits.max_questions)]
        images: empty = None
        audio: empty = None
        videos: empty = None
        assets: empty = None

        def __post_init__(self) -> None:
            _refuse(_state_error(self.state, limits), _empty_id(self.questions))

    msgspec.json.Decoder(Request)  # as the server would: once, at start
    return Request


MSGSPEC_PATH = re.compile(r"\.(\w+)|\[(\d+)\]|\[\.\.\.\]")


def msgspec_problems(exc: Exception) -> list[tuple[Loc, str]]:
    """msgspec's one message, its `$.a[...].b` path as a loc; a dict key it does not name is '?'."""
    message, _, where = str(exc).rpartition(" - at `")
    if not message:
        return [((), str(exc))]
    path = where.rstrip("`").rpartition("`")[2] or where.rstrip("`")  # "key` in `$.x" names the key's dict
    loc = tuple(m.group(1) or (int(m.group(2)) if m.group(2) else "?") for m in MSGSPEC_PATH.finditer(path))
    return [(loc, message)]


def msgspec_parser(limits: Limits) -> Parser:
    """The msgspec declaration behind a reused msgspec.json.Decoder."""
    import msgspec

    request = declare_msgspec(limits)
    decoder = msgspec.json.Decoder(request)

    def to_request(r: Any) -> DecisionRequest:
        return _build(r.model, r.state, [(k, type(q).__struct_config__.tag, q.instructions, q.criteria)
                                         for k, q in r.questions.items()])

    return Parser(MSGSPEC, decoder.decode, to_request, (msgspec.DecodeError,), msgspec_problems,
                  lambda: msgspec.json.schema(request), decode=msgspec.json.Decoder().decode)


def parsers(limits: Limits, missing: dict[str, str]) -> list[Parser]:
    """Own code's two paths, then each library that is installed (the others noted in missing)."""
    found = own_parsers(limits)
    for name, make in ((PYDANTIC, pydantic_parser), (MSGSPEC, msgspec_parser)):
        try:
            found.append(make(limits))
        except ImportError:
            missing[name] = f"{name}: not installed (pip install {name})"
    return found


def _text(rng: random.Random, words: int) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(words))


def _fit(text: str, most: int) -> str:
    """text cut to at most `most` UTF-8 bytes, on a character boundary."""
    return text.encode()[:most].decode("utf-8", "ignore")


def big_bodies(rng: random.Random) -> dict[str, bytes]:
    """~4 MB each: the largest valid body under the default limits (a state just under max_state_bytes, 64
    questions of up to 255 described options), and one whose bulk is its state (max_state_bytes raised)."""
    state = _fit(_text(rng, 90_000), 500_000)  # max_state_bytes is 524,288

    def questions(described: int) -> dict[str, Any]:
        qs: dict[str, Any] = {}
        for i in range(64):
            kind = ("choice", "choice", "choice", "choice", "choice", "choice", "score", "noul")[i % 8]
            if kind == "choice":
                crit: Any = {f"opt_{i}_{j}": _text(rng, described) for j in range(255)}
            elif kind == "score":
                crit = [_text(rng, 12) for _ in range(10)]
            else:
                crit = {"true": _text(rng, 12), "false": _text(rng, 12)}
            qs[f"q{i}"] = {"type": kind, "instructions": _text(rng, 20), "criteria": crit}
        return qs

    # the description length that brings the options-heavy body to BIG_BYTES
    small = orjson.dumps({"model": "jev-latest", "state": state, "questions": questions(1)})
    per_word = len(orjson.dumps(_text(rng, 1000))) / 1000
    described = max(1, round((BIG_BYTES - len(small)) / (48 * 255 * per_word)) + 1)
    options = orjson.dumps({"model": "jev-latest", "state": state, "questions": questions(described)})
    few = {f"q{i}": {"type": "noul", "instructions": _text(rng, 20)} for i in range(64)}
    state_bytes = BIG_BYTES - len(orjson.dumps(few)) - 100
    long_state = _fit(_text(rng, state_bytes // 5), state_bytes)
    heavy = orjson.dumps({"model": "jev-latest", "state": long_state, "questions": few})
    return {"4 MB, 64 questions x 255 options": options, "4 MB, state string (limit 8 MiB)": heavy}


def _nested(levels: int) -> Any:
    value: Any = "x"
    for _ in range(levels):
        value = [value]
    return value


# Defects parse_request refuses, one a body: a field of the body replaced, or a bad question added (as `bad`);
# "state missing", "instructions a number" and "65 questions" are made in _break
BAD_FIELDS = {"model empty": {"model": ""}, "model a number": {"model": 7}, "state a number": {"state": 12.5},
              "questions empty": {"questions": {}}, "images not empty": {"images": ["data:image/png;base64,iVBO="]},
              "state nested too deep": {"state": {"deep": _nested(Limits().max_json_depth)}}}
BAD_QUESTIONS = {
    "unknown type": {"type": "yesno"}, "box type": {"type": "box", "instructions": "Where?"},
    "choice without criteria": {"type": "choice", "instructions": "Which?"},
    "choice of 1 option": {"type": "choice", "criteria": {"only": "one"}},
    "choice of 256 options": {"type": "choice", "criteria": [f"o{j}" for j in range(256)]},
    "option named twice": {"type": "choice", "criteria": ["a", "b", "a"]},
    "option name a number": {"type": "choice", "criteria": ["a", 2]},
    "description a number": {"type": "choice", "criteria": {"a": 1, "b": "two"}},
    "score of 1 level": {"type": "score", "criteria": ["only"]},
    "score of 11 levels": {"type": "score", "criteria": [str(j) for j in range(11)]},
    "score with a null level": {"type": "score", "criteria": ["low", None, "high"]},
    "noul criteria key 'maybe'": {"type": "noul", "criteria": {"true": "y", "maybe": "?"}},
    "noul criteria an array": {"type": "noul", "criteria": ["yes", "no"]},
    "question not an object": "noul"}
DEFECTS = (*BAD_FIELDS, *BAD_QUESTIONS, "state missing", "instructions a number", "65 questions",
           "empty id without instructions")


def _break(body: dict[str, Any], defect: str) -> None:
    """Give a valid body one defect that parse_request refuses."""
    qs = body["questions"]
    if defect in BAD_FIELDS:
        body.update(json.loads(json.dumps(BAD_FIELDS[defect])))  # a copy: bodies are serialized, never shared
    elif defect in BAD_QUESTIONS:
        qs["bad"] = BAD_QUESTIONS[defect]
    elif defect == "state missing":
        del body["state"]
    elif defect == "instructions a number":
        next(iter(qs.values()))["instructions"] = 3
    elif defect == "65 questions":
        qs.update({f"extra{j}": {"type": "noul"} for j in range(65 - len(qs))})
    else:
        qs[""] = {"type": "noul"}


def _question(rng: random.Random, i: int) -> dict[str, Any]:
    """One valid question, touching each form parse_request takes."""
    kind = rng.choice(("noul", "choice", "score"))
    q: dict[str, Any] = {"type": kind}
    forms = (_text(rng, rng.randint(3, 12)) + f" #{i}", {"ask": _text(rng, 4), "n": i}, [_text(rng, 3), i], None)
    q["instructions"] = rng.choices(forms, (75, 10, 5, 10))[0]
    if kind == "noul" and rng.random() < 0.6:  # else no criteria at all
        described = {k: _text(rng, 5) for k in rng.sample(("true", "false"), rng.randint(1, 2))}
        q["criteria"] = rng.choice((None, described))
    elif kind == "choice":
        n = rng.choice((2, 3, 4, 5, 8, 255)) if rng.random() < 0.05 else rng.randint(2, 6)
        names = [f"o{j}_{rng.choice(WORDS)}" for j in range(n)]
        q["criteria"] = names if rng.random() < 0.25 else \
            {name: (None if rng.random() < 0.1 else _text(rng, rng.randint(1, 6))) for name in names}
    elif kind == "score":
        q["criteria"] = [_text(rng, rng.randint(1, 4)) for _ in range(rng.randint(2, 10))]
    return q


def small_bodies(rng: random.Random, n: int) -> tuple[list[bytes], list[str]]:
    """n distinct small bodies, about one in eight with one defect; each body's defect ('' when valid)."""
    bodies, defects = [], []
    for i in range(n):
        form = rng.random()
        if form < 0.7:
            state: Any = f"ticket {i}: " + _text(rng, rng.randint(5, 60))
        elif form < 0.85:
            state = {"ticket": i, "text": _text(rng, 20), "tags": rng.sample(WORDS, 3)}
        elif form < 0.95:
            state = [{"role": "user", "content": _text(rng, 15)}, {"role": "assistant", "content": f"turn {i}"}]
        else:
            state = {"ticket": i, "nested": _nested(Limits().max_json_depth - 2)}  # exactly at max_json_depth
        body: dict[str, Any] = {"model": rng.choice(("jev-latest", "clef-flash", "clef")), "state": state,
                                "questions": {f"{rng.choice(WORDS)}_{j}": _question(rng, i)
                                              for j in range(rng.randint(1, 4))}}
        if rng.random() < 0.02:
            body["questions"][""] = {"type": "noul", "instructions": "An empty id with instructions."}
        if rng.random() < 0.05:
            body.update(images=[], x_trace=str(i))  # empty media and unknown fields: both accepted
        defect = rng.choice(DEFECTS) if rng.random() < 0.125 else ""
        if defect:
            _break(body, defect)
        bodies.append(orjson.dumps(body))
        defects.append(defect)
    return bodies, defects


# Problems planted in one body, each where only it is (its anchor): does each parser report each, and where?
PLANTED = (("model a number", ("model",), BAD_FIELDS["model a number"]),
           ("state missing", ("state",), None),
           ("unknown question type 'yesno'", ("questions", "a"), {"a": BAD_QUESTIONS["unknown type"]}),
           ("choice without criteria", ("questions", "b"), {"b": BAD_QUESTIONS["choice without criteria"]}),
           ("choice of 1 option", ("questions", "c"), {"c": BAD_QUESTIONS["choice of 1 option"]}),
           ("score with a null level", ("questions", "d"), {"d": BAD_QUESTIONS["score with a null level"]}),
           ("noul criteria key 'maybe'", ("questions", "e"), {"e": {"type": "noul", "criteria": {"maybe": "?"}}}),
           ("empty id without instructions", ("questions", ""), {"": {"type": "noul"}}))


def planted_body() -> bytes:
    """One body holding every planted problem (the state left out) and one good question."""
    body: dict[str, Any] = {"questions": {"ok": {"type": "noul", "instructions": "Is it fine?"}}}
    for _, anchor, value in PLANTED:
        (body["questions"] if anchor[0] == "questions" else body).update(value or {})
    return orjson.dumps(body)


def _try(p: Parser, data: bytes) -> tuple[DecisionRequest | None, list[tuple[Loc, str]]]:
    """p's DecisionRequest and no problems, or None and the problems p reports."""
    try:
        return p.parse(data), []
    except p.refusals as exc:
        return None, p.problems(exc)


def _owner(loc: Loc) -> Loc | None:
    """The one planted problem's anchor that loc lies at or under; None when none does, or several do (msgspec's
    '?', a dict key it does not name, matches every question)."""
    owners = [a for _, a, _ in PLANTED if len(loc) >= len(a) and all(x == y or x == "?" for x, y in zip(loc, a))]
    return owners[0] if len(owners) == 1 else None


def _where(loc: Loc) -> str:
    return ".".join('""' if part == "" else str(part) for part in loc) or "(the body)"


def weigh_planted(found: list[Parser]) -> tuple[list[dict[str, Any]], dict[str, dict[str, Any]]]:
    """The planted body through each parser: which problems it reports, each with its location."""
    data = planted_body()
    reported = {p.name: _try(p, data)[1] for p in found}
    planted = [{"problem": label, "at": _where(anchor),
                "found": {name: [_where(loc) for loc, _ in problems if _owner(loc) == anchor]
                          for name, problems in reported.items()}} for label, anchor, _ in PLANTED]
    summary = {}
    for name, problems in reported.items():
        unplaced = [f"{_where(loc)}: {msg}" for loc, msg in problems if _owner(loc) is None]
        summary[name] = {"planted": len(PLANTED), "errors": len(problems),
                         "found": sum(1 for row in planted if row["found"][name]),
                         "located": sum(1 for loc, _ in problems if loc and "?" not in loc),  # every key named
                         "unplaced": unplaced}
    return planted, summary


VALID = b'"model":"m","questions":{"q":{"type":"noul","instructions":"Is it?"}}'
STRICT = (("duplicate key", b'{"state":"a","state":"b",' + VALID + b"}"),
          ("NaN in the state", b'{"state":{"x":NaN},' + VALID + b"}"),
          ("1e999 in the state", b'{"state":{"x":1e999},' + VALID + b"}"),
          ("lone surrogate \\ud800", b'{"state":"a\\ud800b",' + VALID + b"}"),
          ("invalid UTF-8", b'{"state":"a\xffb",' + VALID + b"}"),
          ("unknown field 70 deep", b'{"state":"a","x":' + orjson.dumps(_nested(70)) + b"," + VALID + b"}"))


def weigh_strict(found: list[Parser]) -> list[dict[str, Any]]:
    """Bodies a strict JSON reader refuses (the server's does): accepted, or refused and where."""
    rows = []
    for label, data in STRICT:
        tried = {p.name: _try(p, data) for p in found}
        rows.append({"case": label, "verdict": {
            n: "accepted" if out else "refused at " + ", ".join(sorted({_where(loc) for loc, _ in problems}))
            for n, (out, problems) in tried.items()}})
    return rows


def weigh_agreement(found: list[Parser], bodies: list[bytes], defects: list[str]) -> dict[str, Any]:
    """Does each parser accept exactly the bodies own code accepts, into the same DecisionRequest?"""
    accepted = {p.name: 0 for p in found}
    agree, disagreements, kinds = 0, [], {}
    for data, defect in zip(bodies, defects):
        outcomes = {p.name: _try(p, data)[0] for p in found}
        for name, out in outcomes.items():
            accepted[name] += out is not None
        own = outcomes[OWN]
        if all(out == own for out in outcomes.values()):
            agree += 1
            continue
        differ = sorted(n for n, out in outcomes.items() if (out is None) != (own is None) or out != own)
        key = (defect or "valid", tuple(differ))
        kinds[key] = kinds.get(key, 0) + 1
        if len(disagreements) < 8 and kinds[key] == 1:
            disagreements.append({"defect": defect or "(valid)", "own": "accepted" if own else "refused",
                                  "differ": {n: "accepted" if outcomes[n] is not None else "refused" for n in differ},
                                  "body": data[:160].decode("utf-8", "replace")})
    return {"bodies": len(bodies), "valid_by_generator": defects.count(""), "accepted": accepted, "agree": agree,
            "disagreeing": {f"{d} ({', '.join(n)})": c for (d, n), c in sorted(kinds.items())},
            "examples": disagreements}


def _in_turns(found: list[Parser], fn: Callable[[Parser], Callable[[], Any]], repeats: int) -> dict[str, float]:
    """Median ms of each parser's call, the parsers timed in turns (a drifting machine moves each alike)."""
    calls = {p.name: fn(p) for p in found}
    for call in calls.values():
        call()  # warm-up
    times: dict[str, list[float]] = {name: [] for name in calls}
    for _ in range(repeats):
        for name, call in calls.items():
            t0 = time.perf_counter()
            call()
            times[name].append((time.perf_counter() - t0) * 1e3)
    return {name: round(statistics.median(ts), 3) for name, ts in times.items()}


def _timed(found: list[Parser], make: Callable[[Callable, tuple], Callable[[], Any]], runs: int):
    """Each parser's request_ms, validated_ms and json_ms: make(step, refusals) is what one timed run calls."""
    request = _in_turns(found, lambda p: make(p.parse, p.refusals), runs)
    validated = request | _in_turns([p for p in found if p.converts], lambda p: make(p.validate, p.refusals), runs)
    decoded = _in_turns(found, lambda p: make(p.decode, ()), runs)  # every body is JSON: none may raise
    return {n: {"request_ms": request[n], "validated_ms": validated[n], "json_ms": decoded[n]} for n in request}


def _each(bodies: list[bytes], call: Callable[[bytes], Any], refusals: tuple[type[Exception], ...]):
    def run() -> None:
        for data in bodies:
            try:
                call(data)
            except refusals:
                pass
    return run


IMPORTS = {OWN: ("import orjson, clef_bridge.head.schema", ""),
           PYDANTIC: ("import pydantic", "import pydantic, benchmarks.parsers as p; p.declare_pydantic(p.Limits())"),
           MSGSPEC: ("import msgspec", "import msgspec, benchmarks.parsers as p; p.declare_msgspec(p.Limits())")}


def weigh_imports(names: list[str], runs: int = 5) -> dict[str, dict[str, float]]:
    """import X in a fresh interpreter minus a bare one; and import + declaring the request minus an interpreter
    with own code loaded (the module that declares it imports own code): what the server would add to its start.
    The second can be the smaller: what X shares with own code (typing, re, dataclasses) is loaded already."""
    import os
    import subprocess
    import tempfile

    commands = {"bare": "pass", "own": "import benchmarks.parsers"}
    for name in (n for n in names if n in IMPORTS):
        commands[f"{name} import"], commands[f"{name} ready"] = IMPORTS[name]  # own code: nothing to declare
    times: dict[str, list[float]] = {key: [] for key in commands}
    with tempfile.TemporaryDirectory() as cache:
        # compiled once, as an installed server's modules are: with PYTHONDONTWRITEBYTECODE set, every interpreter
        # would compile the checkout's modules again (pip compiled the libraries' at install); the .pyc files go to
        # a folder of their own, not into the checkout
        env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"} | {"PYTHONPYCACHEPREFIX": cache}
        for i in range(runs + 1):  # the first round writes the .pyc files; the commands in turns, so a busy
            for key, code in commands.items():  # machine slows a command and its baseline alike
                if code:
                    t0 = time.perf_counter()
                    subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, check=True)
                    if i:
                        times[key].append((time.perf_counter() - t0) * 1e3)

    def over(key: str, base: str) -> float:
        """The median of the round-by-round differences."""
        return round(statistics.median(a - b for a, b in zip(times[key], times[base])), 1) if times[key] else 0.0

    return {name: {"import_ms": over(f"{name} import", "bare"), "ready_ms": over(f"{name} ready", "own")}
            for name in names if name in IMPORTS}


def weigh_schema(found: list[Parser]) -> dict[str, dict[str, Any]]:
    """Can the declaration emit a JSON Schema, and which of the limits does it carry?"""
    out = {}
    for p in found:
        if p.schema is None:
            out[p.name] = {"emits": False}
            continue
        text = json.dumps(p.schema())
        out[p.name] = {"emits": True, "bytes": len(text), "discriminator": '"discriminator"' in text,
                       "keywords": sorted(set(re.findall(r'"((?:min|max)(?:Length|Items|Properties))"', text)))}
    return out


def run(count: int = 10_000, repeats: int = 7, rounds: int = 3, seed: int = 0) -> ParsersBench:
    """Every measurement, in the order the module's docstring lists them."""
    import os
    from importlib import metadata  # here: the import cost's baseline imports this module, and metadata is slow

    missing: dict[str, str] = {}
    default = parsers(Limits(), missing)
    roomy = parsers(Limits(max_state_bytes=8 * 2**20), {})
    rng = random.Random(seed)
    big = big_bodies(rng)
    bodies, defects = small_bodies(rng, count)
    for (label, data), found in zip(big.items(), (default, roomy)):
        for p in found:  # a refused big body would time the refusal: a bug of this benchmark, said as one
            if (refused := _try(p, data)[1]):
                raise RuntimeError(f"{p.name} refuses the body {label!r}: {refused[:3]}")
    big_ms = {label: _timed(found, lambda fn, _: lambda: fn(data), repeats)
              for (label, data), found in zip(big.items(), (default, roomy))}
    small = _timed(default, lambda fn, refusals: _each(bodies, fn, refusals), rounds)
    planted, bad = weigh_planted(default)
    sizes = {label: len(data) for label, data in big.items()}
    sizes.update({"small bodies": count, "small mean bytes": round(sum(map(len, bodies)) / count)})
    return ParsersBench(
        versions={OWN: "orjson " + metadata.version("orjson"), SERVER: "json (stdlib)",
                  **{p.name: metadata.version(p.name) for p in default if p.name in (PYDANTIC, MSGSPEC)}},
        missing=missing, bodies=sizes, big=big_ms,
        small=small,
        agreement=weigh_agreement(default, bodies, defects), planted=planted, bad=bad,
        strict=weigh_strict(default), imports=weigh_imports([p.name for p in default]),
        schema=weigh_schema(default),
        setup={"python": sys.version.split()[0], "cpus": os.cpu_count(), "load": round(os.getloadavg()[0], 2),
               "repeats": repeats, "rounds": rounds, "seed": seed})
