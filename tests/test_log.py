"""bridge/llama/log.py: llama.cpp's one log callback, quiet but for errors unless verbose, and capturable.
The callback's function is called here as llama.cpp would call it (level, bytes); nothing is loaded (installing
it, which needs llama.cpp's library, is tests/test_native_llama.py's)."""

from __future__ import annotations

import pytest
from clef_bridge.bridge.llama import log

pytestmark = pytest.mark.unit


@pytest.fixture
def quiet(monkeypatch):
    monkeypatch.setattr(log._SINK, "verbose", False)
    monkeypatch.setattr(log._SINK, "last_level", log.INFO)


def say(level: int, text: str) -> None:
    log._write(level, text.encode(), None)


def test_only_errors_reach_stderr_when_quiet(quiet, capsys):
    say(log.INFO, "loading\n")
    say(log.WARN, "careful\n")
    say(log.ERROR, "failed\n")
    assert capsys.readouterr().err == "failed\n"


def test_verbose_shows_info_and_warnings(quiet, capsys, monkeypatch):
    monkeypatch.setattr(log._SINK, "verbose", True)
    say(log.INFO, "loading\n")
    say(log.WARN, "careful\n")
    say(1, "debug\n")  # ggml's DEBUG level: never shown
    assert capsys.readouterr().err == "loading\ncareful\n"


def test_a_continuation_takes_the_level_of_the_line_it_continues(quiet, capsys):
    say(log.ERROR, "failed: ")
    say(log.CONT, "out of memory\n")
    say(log.INFO, "loading ")
    say(log.CONT, "tensors\n")
    assert capsys.readouterr().err == "failed: out of memory\n"


def test_capture_collects_every_level_while_the_block_runs(quiet, capsys):
    say(log.INFO, "before\n")
    with log.capture() as lines:
        say(1, "tensor blk.0 buffer type overridden\n")
        say(log.INFO, "kv ")
        say(log.CONT, "cache\n")
        say(log.ERROR, "bad\n")
    say(log.INFO, "after\n")
    assert lines == ["tensor blk.0 buffer type overridden\n", "kv ", "cache\n", "bad\n"]
    assert capsys.readouterr().err == "bad\n"  # captured lines still go where they would


def test_undecodable_bytes_are_replaced_not_raised(quiet):
    with log.capture() as lines:
        log._write(log.INFO, b"caf\xc3 \xff\n", None)
    assert lines == ["caf\ufffd \ufffd\n"]
