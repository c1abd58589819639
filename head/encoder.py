"""The reference's segment-wise prompt encoding, through any tokenizer.

Each piece is tokenized on its own and the id lists are concatenated, exactly as
joint_schema_model.encode_record does, so spans line up token for token.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

import numpy as np

from .errors import ContextLengthExceeded, Problem, RequestInvalid
from .model import Layout
from .schema import DecisionRequest, render

SYSTEM_PROMPT = (
    "Read the complete state and schema. Decide every field jointly. Each answer "
    "must be exactly one of that field's allowed options."
)
PREFIX = f"<|im_start|>system\n{SYSTEM_PROMPT}<|im_end|>\n<|im_start|>user\nSTATE:\n"
SUFFIX = "\n<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\nJOINT SCHEMA DECISIONS:"
SCHEMA_HEADER = "\n\nSCHEMA FIELDS:\n"

# tokenize(text, parse_special) -> token ids, with no BOS/EOS added
Tokenize = Callable[[str, bool], list[int]]


@dataclass(frozen=True)
class EncodeOptions:
    max_length: int = 16384
    truncate_state: bool = False  # the reference's silent state truncation, opt-in only
    parse_special_in_user_text: bool = False  # True = reference behaviour: '<|im_end|>' in a state is a control token
    blind_ids: bool = False  # write FIELD numbers instead of question ids into the prompt


@dataclass(frozen=True)
class Encoded:
    input_ids: np.ndarray  # [t] int32
    layout: Layout
    option_token_ids: np.ndarray  # [s] int32, the ids inside every option span, concatenated
    state_tokens_dropped: int  # > 0 only with truncate_state
    state_span: tuple[int, int] = (0, 0)  # [start, end) of the state's tokens: what a prefix cache may reuse


def _user_tokens(tokenize: Tokenize, value: Any, parse_special: bool, loc: tuple) -> list[int]:
    try:
        return tokenize(render(value), parse_special)
    except (TypeError, ValueError) as exc:  # UnicodeEncodeError (lone surrogates) is a ValueError
        raise RequestInvalid([Problem(loc, f"cannot be encoded as text: {exc}", "value_error")]) from None


def encode(request: DecisionRequest, tokenize: Tokenize, options: EncodeOptions = EncodeOptions()) -> Encoded:
    user = options.parse_special_in_user_text
    schema: list[int] = list(tokenize(SCHEMA_HEADER, True))
    question_spans, option_spans, option_offsets = [], [], []
    for i, q in enumerate(request.questions, start=1):
        shown_id = str(i) if options.blind_ids else q.id
        header = f"\nFIELD {i}\nID: {shown_id}\nTYPE: {q.type}\nINSTRUCTION: "
        schema += _user_tokens(tokenize, header, user, ("body", "questions", q.id))
        start = len(schema)
        instructions = shown_id if q.instructions in (None, "") else q.instructions
        schema += _user_tokens(tokenize, instructions, user, ("body", "questions", q.id, "instructions"))
        question_spans.append((start, len(schema)))
        schema += tokenize("\nALLOWED OPTIONS:\n", True)
        option_offsets.append(len(option_spans))
        for j, (option_id, description) in enumerate(q.options, start=1):
            schema += tokenize(f"OPTION {j}: ", True)
            start = len(schema)
            semantics = {"option_id": option_id}
            if description is not None:
                semantics["description"] = description
            schema += _user_tokens(tokenize, semantics, user, ("body", "questions", q.id, "criteria", option_id))
            option_spans.append((start, len(schema)))
            schema += tokenize("\n", True)
        schema += tokenize("END FIELD\n", True)

    prefix = tokenize(PREFIX, True)
    suffix = tokenize(SUFFIX, True)
    state = _user_tokens(tokenize, request.state, user, ("body", "state"))
    fixed = len(prefix) + len(schema) + len(suffix)
    if fixed > options.max_length:
        raise ContextLengthExceeded(fixed, options.max_length, " without the state (the schema alone is too long)")
    dropped = max(0, fixed + len(state) - options.max_length)
    if dropped and not options.truncate_state:
        raise ContextLengthExceeded(fixed + len(state), options.max_length)
    state = state[: len(state) - dropped]

    ids = np.asarray(prefix + state + schema + suffix, dtype=np.int32)  # [t]
    shift = len(prefix) + len(state)
    q_spans = np.asarray(question_spans, dtype=np.int64).reshape(-1, 2) + shift  # [n_q, 2]
    o_spans = np.asarray(option_spans, dtype=np.int64).reshape(-1, 2) + shift  # [n_o, 2]
    empty = [q.id for q, (s, e) in zip(request.questions, q_spans) if s == e]
    if empty:  # a span mean over no tokens is NaN in the reference; refuse instead
        raise RequestInvalid([Problem(("body", "questions", qid, "instructions"), "renders to no tokens",
                                      "value_error") for qid in empty])
    layout = Layout(
        question_spans=q_spans,
        option_spans=o_spans,
        option_offsets=np.asarray(option_offsets, dtype=np.int64),
        types=np.asarray([q.type_id for q in request.questions], dtype=np.int64),
    )
    option_token_ids = np.concatenate([ids[s:e] for s, e in o_spans])  # [s]
    return Encoded(ids, layout, option_token_ids, dropped, (len(prefix), shift))
