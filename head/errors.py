"""Typed errors of the Clef domain: each class names its kind of failure (a Category) and its error type;
bridge/server/errors.py maps each category to the HTTP status and the CLI exit code."""

from __future__ import annotations

import difflib
import enum
from dataclasses import dataclass
from typing import Iterable


def printable(text: str) -> str:
    """text with each unpaired surrogate written as its escape (\\ud800), so it encodes as UTF-8."""
    if text.isascii():
        return text
    return text.encode("utf-8", "backslashreplace").decode("utf-8")


def did_you_mean(word: object, choices: Iterable[str]) -> str:
    """'did you mean NAME? ' for the choice nearest a misspelt word (difflib's ratio of at least 0.6), else ''."""
    close = difflib.get_close_matches(word, list(choices), n=1) if isinstance(word, str) else []
    return f"did you mean {close[0]}? " if close else ""


class Category(enum.Enum):
    """What kind of failure an error is, in the domain's words (no protocol's): what a caller can do about it."""

    INVALID = "invalid"  # the request breaks the contract: fix the request
    TOO_LARGE = "too_large"  # the request is over a limit: send less
    NOT_FOUND = "not_found"  # the request names something not served
    UNAUTHORIZED = "unauthorized"  # no valid API key
    FORBIDDEN = "forbidden"  # a valid key, used for what it may not do (its scope)
    BUSY = "busy"  # the queue is full or the model busy: retry shortly
    UNAVAILABLE = "unavailable"  # the backend cannot answer now (out of memory, stopping, a failed batch)
    MALFORMED = "malformed"  # the request's bytes cannot be read (its encoding, a header)
    UNSUPPORTED_FORMAT = "unsupported_format"  # a body format this service does not read
    SLOW_CLIENT = "slow_client"  # the body did not arrive in time
    EXPECTATION = "expectation"  # an Expect the service cannot meet
    REFUSED = "refused"  # files that failed their checks: the check ran and said no
    CONFIG = "config"  # the configuration, files or data given cannot be used
    USAGE = "usage"  # a command called wrongly (its flags)
    HOST = "host"  # this machine stopped the work (a full disk, a signal, a package missing)
    INTERNAL = "internal"  # none of the above: a fault of clef-bridge itself


class ClefError(Exception):
    """Base of every error clef-bridge raises on purpose; `fix` says what the user can do about it.

    Messages are made printable here, so any error can be written into a JSON body or a log line,
    whatever text from the request it quotes.
    """

    category = Category.INTERNAL
    error_type = "clef_error"

    def __init__(self, message: str = "", fix: str = ""):
        super().__init__(printable(message))
        self.fix = printable(fix)


@dataclass(frozen=True)
class Problem:
    """One validation problem: where it is (JSON path from the body root) and what is wrong.

    Keys quoted in loc and msg are made printable on construction (a lone surrogate in a question id
    becomes its escape), so every problem serializes.
    """

    loc: tuple[str | int, ...]
    msg: str
    type: str

    def __post_init__(self) -> None:
        object.__setattr__(self, "loc", tuple(printable(p) if isinstance(p, str) else p for p in self.loc))
        object.__setattr__(self, "msg", printable(self.msg))


class RequestInvalid(ClefError):
    """The request body breaks the System One contract; carries every problem found."""

    category = Category.INVALID
    error_type = "validation_error"

    def __init__(self, problems: list[Problem]):
        self.problems = tuple(problems)
        super().__init__("; ".join(f"{'.'.join(map(str, p.loc))}: {p.msg}" for p in problems))


class ContextLengthExceeded(ClefError):
    """The encoded prompt is longer than the model's max_length."""

    category = Category.TOO_LARGE
    error_type = "context_length_exceeded"

    def __init__(self, n_tokens: int, limit: int, detail: str = "", at_least: bool = False):
        """at_least: n_tokens is a lower bound (the check stopped before tokenizing everything)."""
        self.n_tokens = n_tokens
        self.limit = limit
        self.detail, self.at_least = detail, at_least  # a front door restates it (the batch names its state)
        # "maximum context length" is what harnesses (decision-index among them) match to tell a too-long input
        # from an error worth retrying
        super().__init__(
            f"the request needs {'at least ' if at_least else ''}{n_tokens} tokens but this model accepts at most "
            f"{limit}{detail}: over its maximum context length; "
            "shorten the state or the schema, or raise max_length (and n_ctx) in models.toml"
        )


class HeadConfigError(ClefError):
    """joint_head_config.json is missing, unreadable or inconsistent."""

    category = Category.CONFIG
    error_type = "head_config_error"


class HeadWeightsError(ClefError):
    """joint_head.safetensors does not hold exactly the tensors the config implies."""

    category = Category.CONFIG
    error_type = "head_weights_error"

    def __init__(self, path: str, problems: list[str]):
        self.path = path
        self.problems = tuple(problems)
        listing = "\n".join(f"  - {p}" for p in problems)
        super().__init__(f"{path}: {len(problems)} problem(s) with the head weights:\n{listing}")
