"""The reference's segment-wise prompt encoding, through any tokenizer.

Each piece is tokenized on its own and the id lists are concatenated, exactly as
joint_schema_model.encode_record does, so spans line up token for token.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Sequence

import numpy as np

from .errors import ContextLengthExceeded, Problem, RequestInvalid
from .model import Layout
from .schema import DecisionRequest, render, rendered_state

SYSTEM_PROMPT = (
    "Read the complete state and schema. Decide every field jointly. Each answer "
    "must be exactly one of that field's allowed options."
)
PREFIX = f"<|im_start|>system\n{SYSTEM_PROMPT}<|im_end|>\n<|im_start|>user\nSTATE:\n"
SUFFIX = "\n<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\nJOINT SCHEMA DECISIONS:"
SCHEMA_HEADER = "\n\nSCHEMA FIELDS:\n"
# Qwen3.5's and Qwen3-Omni's image markup: the processor expands each <|image_pad|> into one token per image token
VISION_START, IMAGE_PAD, VISION_END = "<|vision_start|>", "<|image_pad|>", "<|vision_end|>"
# Qwen3-Omni's audio markup: one <|audio_pad|> per token of the audio tower's output
AUDIO_START, AUDIO_PAD, AUDIO_END = "<|audio_start|>", "<|audio_pad|>", "<|audio_end|>"
VIDEO_PAD = "<|video_pad|>"  # a video's tokens (Qwen3-Omni), between VISION_START and VISION_END
# How the media block after `STATE:\n` reads: "dense" (Clef, Clef-flash): every image's placeholder, then one
# "\n" after them all; "omni" (Clef-omni): each placeholder followed by its own "\n", all images, then all audio.
MEDIA_LAYOUTS = ("dense", "omni")
DEFAULT_MAX_LENGTH = {"dense": 16384, "omni": 64000}  # the references' default max_length

# tokenize(text, parse_special) -> token ids, with no BOS/EOS added
Tokenize = Callable[[str, bool], list[int]]
# min_tokens(text) -> a lower bound on len(tokenize(text, ...)) from the text's size, without tokenizing
MinTokens = Callable[[str], int]


def no_bound(text: str) -> int:
    return 0


@dataclass(frozen=True)
class EncodeOptions:
    max_length: int = DEFAULT_MAX_LENGTH["dense"]
    truncate_state: bool = False  # the reference's silent state truncation, opt-in only
    parse_special_in_user_text: bool = False  # True = reference behaviour: '<|im_end|>' in a state is a control token
    blind_ids: bool = False  # write FIELD numbers instead of question ids into the prompt
    media_layout: str = "dense"  # one of MEDIA_LAYOUTS: the model's reference (Clef-omni's is "omni")

    def __post_init__(self):
        if self.media_layout not in MEDIA_LAYOUTS:
            raise ValueError(f"media_layout {self.media_layout!r}: one of {', '.join(MEDIA_LAYOUTS)}")


@dataclass(frozen=True)
class Encoded:
    input_ids: np.ndarray  # [t] int32
    layout: Layout
    option_token_ids: np.ndarray  # [s] int32, the ids inside every option span, concatenated
    state_tokens_dropped: int  # > 0 only with truncate_state
    state_span: tuple[int, int] = (0, 0)  # [start, end) of the state's tokens: what a prefix cache may reuse


def _text(value: Any, loc: tuple) -> str:
    try:
        return render(value)
    except (TypeError, ValueError) as exc:
        raise RequestInvalid([Problem(loc, f"cannot be rendered as text: {exc}", "value_error")]) from None


def _tokens(tokenize: Tokenize, text: str, parse_special: bool, loc: tuple) -> list[int]:
    try:
        return tokenize(text, parse_special)
    except ValueError as exc:  # UnicodeEncodeError (lone surrogates) is a ValueError
        raise RequestInvalid([Problem(loc, f"cannot be encoded as text: {exc}", "value_error")]) from None


@dataclass(frozen=True)
class _Piece:
    """One user text of the schema, rendered but not tokenized, and the least tokens it can take."""

    text: str
    loc: tuple
    bound: int


def _fields(request: DecisionRequest, options: EncodeOptions, min_tokens: MinTokens) -> list[list[_Piece]]:
    """Per field: its header, its instruction, then one piece per option."""
    def piece(value: Any, loc: tuple) -> _Piece:
        text = _text(value, loc)
        return _Piece(text, loc, min_tokens(text))

    fields = []
    for i, q in enumerate(request.questions, start=1):
        shown_id = str(i) if options.blind_ids else q.id
        at = q.where
        instructions = shown_id if q.instructions in (None, "") else q.instructions
        pieces = [piece(f"\nFIELD {i}\nID: {shown_id}\nTYPE: {q.type}\nINSTRUCTION: ", at.question),
                  piece(instructions, at.instructions)]
        for option_id, description in q.options:
            semantics = {"option_id": option_id}
            if description is not None:
                semantics["description"] = description
            pieces.append(piece(semantics, at.option(option_id)))
        fields.append(pieces)
    return fields


def media_ids(tokenize: Tokenize, image_tokens: Sequence[int], audio_tokens: Sequence[int] = (),
              layout: str = "dense", video_tokens: Sequence[Sequence[bool]] = ()) -> list[int]:
    """The reference's media block for media of these token counts: per image <|vision_start|>, one <|image_pad|>
    per image token, <|vision_end|>; per audio clip the same with <|audio_start|>, <|audio_pad|>, <|audio_end|>;
    per video (video_tokens: each token a video token, True, or its soundtrack's, False) <|vision_start|>, its
    <|video_pad|> tokens, <|vision_end|>, or with a soundtrack interleaved <|vision_start|><|audio_start|>, the
    <|video_pad|> and <|audio_pad|> tokens in that order, <|audio_end|><|vision_end|>.

    dense: one "\\n" after them all (none without media); omni: a "\\n" after each, images, audio, then videos.
    """
    if not image_tokens and not audio_tokens and not video_tokens:
        return []
    image = [tokenize(t, True) for t in (VISION_START, IMAGE_PAD, VISION_END)] if image_tokens else []
    audio = [tokenize(t, True) for t in (AUDIO_START, AUDIO_PAD, AUDIO_END)] if audio_tokens else []
    newline = tokenize("\n", True)
    each = newline if layout == "omni" else []
    block = [t for n in image_tokens for t in image[0] + image[1] * n + image[2] + each]
    block += [t for n in audio_tokens for t in audio[0] + audio[1] * n + audio[2] + each]
    if video_tokens:
        start, end = tokenize(VISION_START, True), tokenize(VISION_END, True)
        pad = {True: tokenize(VIDEO_PAD, True), False: tokenize(AUDIO_PAD, True)}
        for layout_of in video_tokens:
            sound = not all(layout_of)
            open_, close = (start + tokenize(AUDIO_START, True), tokenize(AUDIO_END, True) + end) if sound else (
                start, end)
            block += open_ + [t for is_video in layout_of for t in pad[bool(is_video)]] + close + each
    return block if layout == "omni" else block + newline


def encode(request: DecisionRequest, tokenize: Tokenize, options: EncodeOptions = EncodeOptions(),
           min_tokens: MinTokens = no_bound, image_tokens: Sequence[int] = (), audio_tokens: Sequence[int] = (),
           video_tokens: Sequence[Sequence[bool]] = ()) -> Encoded:
    """The prompt's token ids and spans; image_tokens / audio_tokens: the token count of each image / audio clip,
    video_tokens: each video's token layout, in prompt order (their pad runs sit right after PREFIX, where the
    reference puts them; see media_ids).

    The context check comes first and again before each user text is tokenized: every text's size
    bounds its tokens from below (min_tokens), so a request that cannot fit is refused (413) before
    its bulk is tokenized, whatever its size.
    """
    user = options.parse_special_in_user_text
    prefix = tokenize(PREFIX, True) + media_ids(tokenize, image_tokens, audio_tokens, options.media_layout,
                                                video_tokens)
    suffix = tokenize(SUFFIX, True)
    state_text = rendered_state(request)
    fields = _fields(request, options, min_tokens)
    # the least the texts not yet tokenized need; the state counts unless it may be cut to fit
    pending = sum(p.bound for pieces in fields for p in pieces)
    pending += 0 if options.truncate_state else min_tokens(state_text)
    schema_alone = " without the state (the schema alone is too long)" if options.truncate_state else ""
    schema: list[int] = list(tokenize(SCHEMA_HEADER, True))

    def user_tokens(piece: _Piece) -> list[int]:
        nonlocal pending
        at_least = len(prefix) + len(suffix) + len(schema) + pending
        if at_least > options.max_length:
            raise ContextLengthExceeded(at_least, options.max_length, schema_alone, at_least=True)
        pending -= piece.bound
        return _tokens(tokenize, piece.text, user, piece.loc)

    question_spans, option_spans, option_offsets = [], [], []
    for header, instruction, *option_pieces in fields:
        schema += user_tokens(header)
        start = len(schema)
        schema += user_tokens(instruction)
        question_spans.append((start, len(schema)))
        schema += tokenize("\nALLOWED OPTIONS:\n", True)
        option_offsets.append(len(option_spans))
        for j, option in enumerate(option_pieces, start=1):
            schema += tokenize(f"OPTION {j}: ", True)
            start = len(schema)
            schema += user_tokens(option)
            option_spans.append((start, len(schema)))
            schema += tokenize("\n", True)
        schema += tokenize("END FIELD\n", True)

    fixed = len(prefix) + len(schema) + len(suffix)
    if fixed > options.max_length:
        raise ContextLengthExceeded(fixed, options.max_length, " without the state (the schema alone is too long)")
    if not options.truncate_state and fixed + min_tokens(state_text) > options.max_length:
        raise ContextLengthExceeded(fixed + min_tokens(state_text), options.max_length, at_least=True)
    state = _tokens(tokenize, state_text, user, request.state_at)
    dropped = max(0, fixed + len(state) - options.max_length)
    if dropped and not options.truncate_state:
        raise ContextLengthExceeded(fixed + len(state), options.max_length)
    state = state[: len(state) - dropped]

    ids = np.asarray(prefix + state + schema + suffix, dtype=np.int32)  # [t]
    shift = len(prefix) + len(state)
    q_spans = np.asarray(question_spans, dtype=np.int64).reshape(-1, 2) + shift  # [n_q, 2]
    o_spans = np.asarray(option_spans, dtype=np.int64).reshape(-1, 2) + shift  # [n_o, 2]
    empty = [q for q, (s, e) in zip(request.questions, q_spans) if s == e]
    if empty:  # a span mean over no tokens is NaN in the reference; refuse instead
        raise RequestInvalid([Problem(q.where.instructions, "renders to no tokens", "value_error") for q in empty])
    layout = Layout(
        question_spans=q_spans,
        option_spans=o_spans,
        option_offsets=np.asarray(option_offsets, dtype=np.int64),
        types=np.asarray([q.type_id for q in request.questions], dtype=np.int64),
    )
    option_token_ids = np.concatenate([ids[s:e] for s, e in o_spans])  # [s]
    return Encoded(ids, layout, option_token_ids, dropped, (len(prefix), shift))
