"""What a model's name may be, in one place: models.toml's names and aliases, `pull --name` and the demos all
pass name_problem, so a name that reaches the banner, a log line, the playground or a shell command is plain
text; and the bound on the name a request asks for, refused before it is looked up, compared or echoed."""

from __future__ import annotations

import unicodedata

MAX_NAME_CHARS = 128  # a served name or alias
MAX_REQUESTED_CHARS = 256  # a request's `model`: longer ones are refused unread (twice any name that can match)
SHOWN_CHARS = 32  # what an error quotes of a name too long to echo

# Unicode categories a name may not hold: what would break a line, a terminal, or reorder the text around it
REFUSED_CATEGORIES = {
    "Cc": "a control character",
    "Cf": "a format character (bidirectional controls and invisible marks among them)",
    "Zl": "a line separator",
    "Zp": "a paragraph separator",
    "Cs": "an unpaired surrogate (bytes that are not UTF-8)",
}


def code_point(ch: str) -> str:
    """U+202E RIGHT-TO-LEFT OVERRIDE: a character by its code point and, where Unicode has one, its name."""
    name = unicodedata.name(ch, "")
    return f"U+{ord(ch):04X}{f' {name}' if name else ''}"


def name_problem(name: str) -> str:
    """'' for a name a model may have; else what is wrong with it (the first bad character by code point and
    position), as the end of a sentence that begins with the name's place ("models.x: ...")."""
    if not name:
        return "a name must not be empty"
    if len(name) > MAX_NAME_CHARS:
        return f"the name is {len(name)} characters long; at most {MAX_NAME_CHARS}"
    for position, ch in enumerate(name):
        kind = REFUSED_CATEGORIES.get(unicodedata.category(ch))
        if kind:
            return (f"the name holds {code_point(ch)}, {kind}, at position {position}: names are plain text (they "
                    "land in log lines, the banner and the playground's shell commands); rename it")
    return ""


def shown(name: str) -> str:
    """A name as an error or a log line may quote it: itself when printable and short, else escaped and cut
    (Python's repr escapes what is not printable), with its length."""
    if name.isprintable() and len(name) <= MAX_NAME_CHARS:
        return name
    if len(name) <= SHOWN_CHARS:
        return repr(name)
    return f"{name[:SHOWN_CHARS]!r}... ({len(name)} characters)"
