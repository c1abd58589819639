"""llama.cpp's log, routed through one callback: quiet by default, and capturable.

llama.cpp has a single process-wide log callback, so this module holds the one sink it writes
to; `capture()` lets the memory planner read what llama.cpp itself reports about its buffers.
"""

from __future__ import annotations

import ctypes
import functools
import sys
import threading
from contextlib import contextmanager
from typing import Iterator

from .native import lc, mtmd

ERROR, WARN, INFO, CONT = 4, 3, 2, 5  # ggml_log_level (ggml.h): NONE 0, DEBUG 1, INFO 2, WARN 3, ERROR 4, CONT 5


class _Sink:
    def __init__(self) -> None:
        self.verbose = False
        self.lines: list[str] | None = None  # set while capturing
        self.lock = threading.Lock()
        self.last_level = INFO

    def write(self, level: int, text: str) -> None:
        if level == CONT:
            level = self.last_level
        self.last_level = level
        with self.lock:
            if self.lines is not None:
                self.lines.append(text)
        if level == ERROR or (self.verbose and level in (WARN, INFO)):
            sys.stderr.write(text)


_SINK = _Sink()


def _write(level: int, text: bytes, _user: ctypes.c_void_p) -> None:
    _SINK.write(level, text.decode("utf-8", "replace"))


@functools.cache
def _callback():
    """The C callback over _write, made once: llama.cpp keeps its pointer for the process's life."""
    return lc.llama_log_callback(_write)


def install(verbose: bool = False) -> None:
    """Route llama.cpp's log here (errors always shown; info and warnings when verbose)."""
    _SINK.verbose = verbose
    lc.llama_log_set(_callback(), ctypes.c_void_p(0))


def install_mtmd(verbose: bool = False) -> None:
    """Route the multimodal projector library's log (mtmd keeps its own callback) to the same sink."""
    install(verbose)
    mtmd.mtmd_helper_log_set(_callback(), ctypes.c_void_p(0))


@contextmanager
def capture() -> Iterator[list[str]]:
    """Collect llama.cpp's log lines (all levels) while the block runs."""
    lines: list[str] = []
    with _SINK.lock:
        _SINK.lines = lines
    try:
        yield lines
    finally:
        with _SINK.lock:
            _SINK.lines = None
