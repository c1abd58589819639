"""JSON request shapes declared once. A declaration checks a decoded body (every problem located, as the Jev 422's
{loc, msg, type}) and writes its own JSON Schema for /openapi.json, so what a door refuses and what it publishes are
one text. What a declaration cannot say (a name used twice, a tool output before its call, criteria whose shape
follows the question's type) stays in the door's code, which runs on what the declaration let through."""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from types import MappingProxyType
from typing import Any, Mapping

from .errors import Problem

Loc = tuple[str | int, ...]
# JSON's types as the decoded value holds them (a boolean is no number here, though Python's bool is an int)
JSON_TYPES: Mapping[str, tuple[type, ...]] = MappingProxyType({
    "string": (str,), "object": (dict,), "array": (list,), "boolean": (bool,), "number": (int, float),
    "integer": (int,), "null": (type(None),)})
EMPTY: Mapping[str, Any] = MappingProxyType({})


@dataclass(frozen=True)
class Bound:
    """At most `most` items (or properties, or characters), and the refusal naming the limit: msg takes {most} and
    {got}."""

    most: int
    msg: str
    type: str = "value_error"


@dataclass(frozen=True, eq=False)
class Node:
    """One JSON value's declaration: its types, its refusal when it has none of them, and what it holds."""

    types: tuple[str, ...] = ()  # (): any JSON value
    msg: str = ""  # the refusal of a value of another type (or an empty one where nonempty)
    shows_value: bool = False  # msg takes {got!r}, the value refused
    type_error: str = "type_error"  # that refusal's problem type
    description: str = ""
    missing: str = ""  # a required field's refusal when it is absent (default: msg)
    missing_type: str = "missing"
    null_missing: bool = False  # a required field's null reads as its absence (OpenAI's doors)
    nonempty: bool = False  # an array or an object needs an item (a string may be empty)
    fewest: int = 0  # an array or an object needs this many items (refused as msg says, as an empty one is)
    nonblank: bool = False  # a string needs a character
    blank: str = ""  # the refusal of an empty string where nonblank (default: msg)
    bound: Bound | None = None
    enum: tuple[Any, ...] = ()
    enum_msg: str = ""  # takes {got!r}
    enum_type: str = "value_error"
    # a value refused by name, before the enum: (msg, type)
    refused: Mapping[str, tuple[str, str]] = field(default_factory=lambda: EMPTY)
    fields: Mapping[str, "Node"] = field(default_factory=lambda: EMPTY)  # an object's known properties
    required: tuple[str, ...] = ()
    values: "Node | None" = None  # an object's other properties (a map's values)
    items: "Node | None" = None  # an array's items
    ref: str = ""  # its name among /openapi.json's components (the schema is written there once)
    published: Mapping[str, Any] = field(default_factory=lambda: EMPTY)  # what only the description says (examples)

    def __post_init__(self) -> None:
        # what check() asks of every value, worked out once: a request walks these nodes many times
        python = tuple(t for name in self.types for t in JSON_TYPES[name])
        numeric = any(name in ("number", "integer") for name in self.types)
        object.__setattr__(self, "_python", python)
        object.__setattr__(self, "_bool", "boolean" in self.types or not numeric)  # bool is an int to Python
        object.__setattr__(self, "_enum", frozenset((type(e), e) for e in self.enum))
        object.__setattr__(self, "_fewest", max(self.fewest, self.nonempty))  # items an array or object needs
        object.__setattr__(self, "_sized", bool(self.nonblank or self._fewest))

    def accepts(self, value: Any) -> bool:
        """Whether value is of one of its JSON types (any value where it names none)."""
        return not self.types or (isinstance(value, self._python) and (self._bool or not isinstance(value, bool)))

    def with_fields(self, required: tuple[str, ...] | None = None, **fields: "Node") -> "Node":
        """This object's declaration with fields added or replaced (a door's shape built on another's: a shape of
        its own, so it keeps no component name)."""
        return replace(self, fields=MappingProxyType({**self.fields, **fields}),
                       required=self.required if required is None else required, ref="")

    def without(self, *names: str) -> "Node":
        """This object's declaration without some fields (a shape of its own, unnamed)."""
        return replace(self, fields=MappingProxyType({k: v for k, v in self.fields.items() if k not in names}),
                       required=tuple(k for k in self.required if k not in names), ref="")


def node(*types: str, **kwargs: Any) -> Node:
    """A declaration (fields given as a dict are kept read-only)."""
    for key in ("fields", "refused"):
        if key in kwargs:
            kwargs[key] = MappingProxyType(dict(kwargs[key]))
    return Node(types, **kwargs)


def said(template: str, **values: Any) -> str:
    """A refusal's words with its placeholders filled ({got!r}, {got}, {most}): by name only, so any other brace in
    the words (an example such as {"rejectIfBusy": true}) stays as written."""
    for name, value in values.items():
        template = template.replace(f"{{{name}!r}}", repr(value)).replace(f"{{{name}}}", str(value))
    return template


def _absent(declared: Node, value: Any) -> bool:
    return value is None and declared.null_missing


def _in_enum(declared: Node, value: Any) -> bool:
    try:
        return (type(value), value) in declared._enum  # True is no 1, 1 is no 1.0: the value as JSON wrote it
    except TypeError:  # an object or an array: in no enum
        return False


def _empty(declared: Node, value: Any) -> bool:
    if isinstance(value, str):
        return declared.nonblank and not value
    return isinstance(value, (list, dict)) and len(value) < declared._fewest


def check(declared: Node, value: Any, loc: Loc, problems: list[Problem], deep: bool = True) -> bool:
    """Whether value has the declared shape; each way it has not added to problems at its location (deep: the
    fields', items' and values' shapes too, else only this value's own)."""
    before = len(problems)
    if declared.refused and isinstance(value, str) and value in declared.refused:
        msg, kind = declared.refused[value]
        problems.append(Problem(loc, msg, kind))
        return False
    if declared.types and not declared.accepts(value):
        problems.append(Problem(loc, said(declared.msg, got=value) if declared.shows_value else declared.msg,
                                declared.type_error))
        return False
    if declared._sized and _empty(declared, value):
        problems.append(Problem(loc, (declared.blank if isinstance(value, str) else "") or declared.msg, "type_error"))
        return False
    if declared.enum and not _in_enum(declared, value):
        problems.append(Problem(loc, said(declared.enum_msg, got=value), declared.enum_type))
        return False
    bound = declared.bound
    if bound is not None and isinstance(value, (str, list, dict)) and len(value) > bound.most:
        problems.append(Problem(loc, said(bound.msg, most=bound.most, got=len(value)), bound.type))
        return False
    if deep and isinstance(value, dict):
        for name in declared.fields:
            check_field(declared, value, name, loc, problems)
        if declared.values is not None:
            for name, item in value.items():
                if name not in declared.fields:
                    check(declared.values, item, loc + (name,), problems)
    elif deep and isinstance(value, list) and declared.items is not None:
        for i, item in enumerate(value):
            check(declared.items, item, loc + (i,), problems)
    return len(problems) == before


def check_field(declared: Node, value: dict[str, Any], name: str, loc: Loc, problems: list[Problem],
                deep: bool = True) -> bool:
    """One field of an object as declared: its absence where it is required, else its value's shape (an optional
    field absent is fine)."""
    sub = declared.fields[name]
    if name not in value or (name in declared.required and _absent(sub, value[name])):
        if name not in declared.required:
            return True
        problems.append(Problem(loc + (name,), sub.missing or sub.msg, sub.missing_type))
        return False
    return check(sub, value[name], loc + (name,), problems, deep)


SIZES = {"array": ("minItems", "maxItems"), "object": ("minProperties", "maxProperties"),
         "string": ("minLength", "maxLength")}


def json_schema(declared: Node, refs: dict[str, Any] | None = None, published: bool = True) -> dict[str, Any]:
    """The declaration as JSON Schema (OpenAPI 3.1's dialect). refs: where named declarations are written once (a
    {"$ref"} stands in their place); None writes every one in place. published: with what only the description says
    (False: exactly what check() checks)."""
    if declared.ref and refs is not None:
        if declared.ref not in refs:
            refs[declared.ref] = {}  # a declaration that holds itself stops here
            refs[declared.ref] = json_schema(replace(declared, ref=""), refs, published)
        return {"$ref": f"#/components/schemas/{declared.ref}"}
    out: dict[str, Any] = {}
    if declared.types:
        out["type"] = declared.types[0] if len(declared.types) == 1 else list(declared.types)
    if declared.enum:
        out["enum"] = list(declared.enum)
    for kind, (least, most) in SIZES.items():
        if kind in declared.types:
            fewest = declared.nonblank if kind == "string" else max(declared.fewest, declared.nonempty)
            if fewest:
                out[least] = int(fewest)
            if declared.bound is not None:
                out[most] = declared.bound.most
    if declared.fields:
        out["properties"] = {name: json_schema(sub, refs, published) for name, sub in declared.fields.items()}
    if declared.required:
        out["required"] = list(declared.required)
    if declared.values is not None:
        out["additionalProperties"] = json_schema(declared.values, refs, published)
    if declared.items is not None:
        out["items"] = json_schema(declared.items, refs, published)
    if declared.description:
        out["description"] = declared.description
    return {**out, **declared.published} if published else out
