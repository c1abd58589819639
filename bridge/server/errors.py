"""Every error's answer, in one table: its category -> the HTTP status the server answers with and the
exit code the CLI returns. The middleware and the CLI both read it; nothing else maps errors."""

from __future__ import annotations

from dataclasses import dataclass

from ...head.errors import Category, ClefError

EXIT_OK, EXIT_REFUSED, EXIT_USAGE = 0, 1, 2  # 1: the request or the files were refused; 2: anything else


@dataclass(frozen=True)
class Answer:
    status: int  # HTTP
    exit_code: int  # the CLI's


ANSWERS: dict[Category, Answer] = {
    Category.INVALID: Answer(422, EXIT_REFUSED),
    Category.TOO_LARGE: Answer(413, EXIT_REFUSED),
    Category.NOT_FOUND: Answer(404, EXIT_USAGE),
    Category.UNAUTHORIZED: Answer(401, EXIT_USAGE),
    Category.FORBIDDEN: Answer(403, EXIT_USAGE),
    Category.BUSY: Answer(429, EXIT_USAGE),
    Category.UNAVAILABLE: Answer(503, EXIT_USAGE),
    Category.MALFORMED: Answer(400, EXIT_USAGE),
    Category.UNSUPPORTED_FORMAT: Answer(415, EXIT_USAGE),
    Category.SLOW_CLIENT: Answer(408, EXIT_USAGE),
    Category.EXPECTATION: Answer(417, EXIT_USAGE),
    # the operator's files, flags and machine: a request reaching one of these meets a server fault
    Category.REFUSED: Answer(500, EXIT_REFUSED),
    Category.CONFIG: Answer(500, EXIT_USAGE),
    Category.USAGE: Answer(500, EXIT_USAGE),
    Category.HOST: Answer(500, EXIT_USAGE),
    Category.INTERNAL: Answer(500, EXIT_USAGE),
}
# Exceptions outside ClefError, by class along the MRO: the host out of memory is worth a retry (503), not a
# bug. Their cause stays hidden from clients, so they answer with the type every unexpected error has.
OTHERS: dict[type[BaseException], Category] = {MemoryError: Category.UNAVAILABLE}
HIDDEN_TYPE = "internal_error"


def category_of(exc: BaseException) -> Category:
    if isinstance(exc, ClefError):
        return exc.category
    for cls in type(exc).__mro__:
        if cls in OTHERS:
            return OTHERS[cls]
    return Category.INTERNAL


def answer_for(exc: BaseException) -> Answer:
    return ANSWERS[category_of(exc)]


def error_type_of(exc: BaseException) -> str:
    return exc.error_type if isinstance(exc, ClefError) else HIDDEN_TYPE
