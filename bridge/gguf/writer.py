"""A small streaming GGUF writer: tensor data copied from other files in chunks, atomic, interruptible.

Multi-gigabyte GGUFs never pass through memory: a tensor is either a span of a source file (copied
in CHUNK-sized steps, by the kernel where it can) or a few bytes made here (a head matrix). The
output is written under a temporary name in the target folder and renamed into place only when
complete, so a file at the final name is always whole. The writer holds an flock on its temporary
file: one left by a killed writer is unlocked, which is how the next writer knows it is stale and
removes it.
"""

from __future__ import annotations

import fcntl
import logging
import os
import shutil
import signal
import struct
import threading
import time
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterator

import numpy as np
from gguf import GGUFValueType as V

from ...head.errors import Category, ClefError
from ..host.progress import Progress
from .reader import MAGIC, GGUFError

CHUNK = 16 * 2**20  # big enough to stream at disk speed, small enough to keep the footprint flat
HEADROOM = 16 * 2**20  # free space kept beyond the file itself (filesystem metadata, logs)
VERSION = 3
PARTIAL = ".partial"

@contextmanager
def quiet_gguf_py() -> Iterator[None]:
    """gguf-py's GGUFWriter logs at INFO as it goes ("gguf: This GGUF file is for Little Endian only", "Writing
    the following files:"); under `serve`, whose root logger prints INFO, that lands in the banner. Its
    warnings still pass."""
    logger = logging.getLogger("gguf.gguf_writer")

    def warnings_only(record: logging.LogRecord) -> bool:
        return record.levelno >= logging.WARNING

    logger.addFilter(warnings_only)
    try:
        yield
    finally:
        logger.removeFilter(warnings_only)


_SCALAR_FORMATS = {V.UINT8: "<B", V.INT8: "<b", V.UINT16: "<H", V.INT16: "<h", V.UINT32: "<I", V.INT32: "<i",
                   V.FLOAT32: "<f", V.BOOL: "<?", V.UINT64: "<Q", V.INT64: "<q", V.FLOAT64: "<d"}


class NotEnoughDisk(ClefError):
    """The target folder has less free space than the file needs."""

    category = Category.HOST
    error_type = "not_enough_disk"

    def __init__(self, needed: int, free: int, folder: Path, what: str):
        self.needed, self.free, self.folder = needed, free, folder
        super().__init__(f"writing {what} needs {needed} bytes ({needed / 2**30:.2f} GiB) in {folder}, which has "
                         f"{free} bytes ({free / 2**30:.2f} GiB) free; free some space there or write to "
                         "another folder (for the backbone cache: set CLEF_BRIDGE_CACHE)")


class WriteInterrupted(ClefError):
    """A signal stopped the write; the temporary file was removed."""

    category = Category.HOST
    error_type = "write_interrupted"


@dataclass(frozen=True)
class CopyFrom:
    """Tensor data that lies in another file: n bytes from an absolute offset."""

    path: Path
    offset: int


@dataclass(frozen=True)
class OutTensor:
    name: str
    ne: tuple[int, ...]  # ggml order
    type: int  # GGMLQuantizationType
    n_bytes: int
    data: CopyFrom | bytes


@dataclass(frozen=True)
class WriteResult:
    path: Path
    bytes: int
    seconds: float


# --- encoding ----------------------------------------------------------------------------------

def _string(text: str) -> bytes:
    raw = text.encode("utf-8")
    return struct.pack("<Q", len(raw)) + raw


def encode_value(vtype: int, value: object, element_type: int | None = None) -> bytes:
    """A metadata value as stored in GGUF: its u32 type, then the value (arrays: element type and count)."""
    head = struct.pack("<I", vtype)
    if vtype in _SCALAR_FORMATS:
        return head + struct.pack(_SCALAR_FORMATS[V(vtype)], value)
    if vtype == V.STRING:
        return head + _string(str(value))
    if vtype != V.ARRAY or element_type is None:
        raise ValueError(f"cannot encode a value of GGUF type {vtype}")
    items = list(value)  # type: ignore[call-overload]
    head += struct.pack("<IQ", element_type, len(items))
    if element_type == V.STRING:
        return head + b"".join(_string(s) for s in items)
    if element_type in _SCALAR_FORMATS:
        fmt = _SCALAR_FORMATS[V(element_type)]
        return head + np.asarray(items, dtype=np.dtype(fmt)).tobytes()
    raise ValueError(f"cannot encode an array of GGUF type {element_type}")


def _align(n: int, alignment: int) -> int:
    return -(-n // alignment) * alignment


def _header(kvs: list[tuple[str, bytes]], tensors: list[OutTensor], alignment: int) -> tuple[bytes, list[int]]:
    """The header padded to alignment, and each tensor's offset in the data section."""
    parts = [MAGIC, struct.pack("<IQQ", VERSION, len(tensors), len(kvs))]
    parts += [_string(name) + raw for name, raw in kvs]
    offsets, at = [], 0
    for t in tensors:
        parts.append(_string(t.name) + struct.pack(f"<I{len(t.ne)}QIQ", len(t.ne), *t.ne, t.type, at))
        offsets.append(at)
        at = _align(at + t.n_bytes, alignment)
    header = b"".join(parts)
    return header + b"\0" * (_align(len(header), alignment) - len(header)), offsets


def planned_size(kvs: list[tuple[str, bytes]], tensors: list[OutTensor], alignment: int) -> int:
    header, offsets = _header(kvs, tensors, alignment)
    return len(header) + (offsets[-1] + tensors[-1].n_bytes if tensors else 0)


# --- temporary files ------------------------------------------------------------------------------

def partial_name(out: Path) -> Path:
    """out's temporary name: hidden, in the same folder (so the rename is atomic), carrying our pid."""
    return out.with_name(f".{out.name}.{os.getpid()}{PARTIAL}")


def remove_stale(out: Path) -> list[Path]:
    """Remove temporary files of out that no live writer holds (their writer was killed)."""
    removed = []
    for path in out.parent.glob(f".{out.name}.*{PARTIAL}"):
        try:
            with path.open("rb") as f:
                fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)  # a live writer holds it: leave it alone
                path.unlink()
                removed.append(path)
        except (BlockingIOError, FileNotFoundError):
            continue
    return removed


def check_space(folder: Path, needed: int, what: str) -> None:
    free = shutil.disk_usage(folder).free
    if free < needed + HEADROOM:
        raise NotEnoughDisk(needed + HEADROOM, free, folder, what)


class _Interrupted(BaseException):
    def __init__(self, signum: int):
        self.signum = signum


@contextmanager
def _signals_raise() -> Iterator[None]:
    """Turn SIGTERM, SIGINT and SIGHUP into an exception for the duration, so cleanup code runs."""
    if threading.current_thread() is not threading.main_thread():
        yield  # only the main thread may set handlers; a killed process leaves a stale file instead
        return

    def handler(signum, frame):
        raise _Interrupted(signum)

    previous = {s: signal.signal(s, handler) for s in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)}
    try:
        yield
    finally:
        for s, h in previous.items():
            signal.signal(s, h)


# --- writing --------------------------------------------------------------------------------------

def _write_all(dst, data) -> None:
    view = memoryview(data)
    while view:
        view = view[dst.write(view):]


def _copy(dst, src: CopyFrom, n: int, buf: memoryview, tick: Callable[[int], None]) -> None:
    """n bytes from src to dst's position: in the kernel (copy_file_range) where it can, else through buf."""
    with src.path.open("rb") as f:
        offset, left = src.offset, n
        kernel = hasattr(os, "copy_file_range")
        while left:
            step = min(left, len(buf))
            got = 0
            if kernel:
                try:
                    got = os.copy_file_range(f.fileno(), dst.fileno(), step, offset)
                except OSError:  # another filesystem or an old kernel: the same bytes, through user space
                    kernel = False
                    continue
            else:
                f.seek(offset)
                got = f.readinto(buf[:step])
                _write_all(dst, buf[:got])
            if not got:
                raise GGUFError(f"{src.path} ended {left} bytes early while copying from it (was it changed?)")
            offset += got
            left -= got
            tick(got)


def write_gguf(out: str | Path, kvs: list[tuple[str, bytes]], tensors: list[OutTensor], alignment: int = 32,
               progress: bool | None = None, on_chunk: Callable[[int, int], None] | None = None,
               reserve: int = 0) -> WriteResult:
    """Write a GGUF atomically; kvs are (name, encoded value) pairs, tensors are written in order.

    progress: a bar on stderr (None: when stderr is a terminal); on_chunk(done, total) after each chunk;
    reserve: bytes that other files of the same operation will also need in this folder.
    Raises NotEnoughDisk before writing anything, WriteInterrupted after a signal (file removed).
    """
    out = Path(out)
    start = time.monotonic()
    header, offsets = _header(kvs, tensors, alignment)
    total = planned_size(kvs, tensors, alignment)
    remove_stale(out)
    check_space(out.parent, total + reserve, out.name)
    tmp = partial_name(out)
    bar = Progress(f"writing {out.name}", total, progress)
    done = 0

    def tick(n: int) -> None:
        nonlocal done
        done += n
        bar.update(n)
        if on_chunk is not None:
            on_chunk(done, total)

    buf = memoryview(bytearray(CHUNK))
    try:
        # unbuffered: copy_file_range writes at the descriptor's position, so nothing may wait in a buffer
        with _signals_raise(), tmp.open("wb", buffering=0) as f:
            fcntl.flock(f, fcntl.LOCK_EX)
            _write_all(f, header)
            tick(len(header))
            for t, offset in zip(tensors, offsets):
                _write_all(f, b"\0" * (len(header) + offset - f.tell()))
                if isinstance(t.data, CopyFrom):
                    _copy(f, t.data, t.n_bytes, buf, tick)
                else:
                    _write_all(f, t.data)
                    tick(len(t.data))
            os.fsync(f.fileno())
            os.replace(tmp, out)  # still under the lock: nobody can take the file for stale meanwhile
    except BaseException as exc:
        tmp.unlink(missing_ok=True)
        bar.close()
        if isinstance(exc, _Interrupted):
            signal.raise_signal(exc.signum)  # the handler that was there before ours decides what happens
            raise WriteInterrupted(f"writing {out} was interrupted by signal {exc.signum}; nothing was left "
                                   "behind") from None
        raise
    bar.close()
    return WriteResult(out, total, time.monotonic() - start)


@contextmanager
def atomic_file(out: Path) -> Iterator[Path]:
    """A temporary path to write a small file to; renamed to out on success, removed otherwise."""
    tmp = partial_name(out)
    try:
        yield tmp
        os.replace(tmp, out)
    finally:
        tmp.unlink(missing_ok=True)
