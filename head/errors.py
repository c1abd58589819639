"""Typed errors of the Clef domain; the server maps each class to one HTTP status."""

from __future__ import annotations

from dataclasses import dataclass


class ClefError(Exception):
    """Base of every error clef-bridge raises on purpose; `fix` says what the user can do about it."""

    error_type = "clef_error"

    def __init__(self, message: str = "", fix: str = ""):
        super().__init__(message)
        self.fix = fix


@dataclass(frozen=True)
class Problem:
    """One validation problem: where it is (JSON path from the body root) and what is wrong."""

    loc: tuple[str | int, ...]
    msg: str
    type: str


class RequestInvalid(ClefError):
    """The request body breaks the System One contract; carries every problem found."""

    error_type = "validation_error"

    def __init__(self, problems: list[Problem]):
        self.problems = tuple(problems)
        super().__init__("; ".join(f"{'.'.join(map(str, p.loc))}: {p.msg}" for p in problems))


class ContextLengthExceeded(ClefError):
    """The encoded prompt is longer than the model's max_length."""

    error_type = "context_length_exceeded"

    def __init__(self, n_tokens: int, limit: int, detail: str = ""):
        self.n_tokens = n_tokens
        self.limit = limit
        super().__init__(
            f"the request needs {n_tokens} tokens but this model accepts at most {limit}{detail}; "
            "shorten the state or the schema, or raise max_length (and n_ctx) in models.toml"
        )


class HeadConfigError(ClefError):
    """joint_head_config.json is missing, unreadable or inconsistent."""

    error_type = "head_config_error"


class HeadWeightsError(ClefError):
    """joint_head.safetensors does not hold exactly the tensors the config implies."""

    error_type = "head_weights_error"

    def __init__(self, path: str, problems: list[str]):
        self.path = path
        self.problems = tuple(problems)
        listing = "\n".join(f"  - {p}" for p in problems)
        super().__init__(f"{path}: {len(problems)} problem(s) with the head weights:\n{listing}")
