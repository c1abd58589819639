"""A strict, fast GGUF header reader over a memory map.

gguf-py's GGUFReader turns every vocabulary string into Python objects (seconds for a 152k
vocabulary) and trusts the file; this reader skips string arrays (read_strings decodes one on
demand), checks every offset against the file size, and reports problems as GGUFError with the
byte offset. Every key keeps its GGUF value type and byte span, so a writer can copy it exactly.
"""

from __future__ import annotations

import mmap
import struct
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator

import numpy as np
from gguf.constants import GGML_QUANT_SIZES, GGMLQuantizationType
from gguf.quants import dequantize

from ...head.errors import Category, ClefError

MAGIC = b"GGUF"
SUPPORTED_VERSIONS = (2, 3)
DEFAULT_ALIGNMENT = 32

# GGUF value type -> (struct format, numpy dtype) for scalars
_SCALARS = {0: ("<B", "<u1"), 1: ("<b", "<i1"), 2: ("<H", "<u2"), 3: ("<h", "<i2"), 4: ("<I", "<u4"),
            5: ("<i", "<i4"), 6: ("<f", "<f4"), 7: ("<?", "?"), 10: ("<Q", "<u8"), 11: ("<q", "<i8"),
            12: ("<d", "<f8")}
STRING, ARRAY = 8, 9


class GGUFError(ClefError):
    """The file is not a readable GGUF; `code` says how (gguf.magic, gguf.version, gguf.header, gguf.missing,
    gguf.key)."""

    category = Category.CONFIG
    error_type = "gguf_error"

    def __init__(self, message: str, code: str = "gguf.header"):
        self.code = code
        super().__init__(message)


@dataclass(frozen=True)
class StringArray:
    """A string array, not decoded: its length and where its first element lies (read_strings decodes it)."""

    count: int
    offset: int  # absolute file offset of the first element's length prefix


@dataclass(frozen=True)
class KeyField:
    """How a metadata value is stored: its GGUF value type and its bytes in the file."""

    type: int  # GGUFValueType
    element_type: int | None  # GGUFValueType of an array's elements; None for scalars and strings
    start: int  # absolute file offset of the value type (the u32 after the key's name)
    end: int  # one past the value's last byte


@dataclass(frozen=True)
class TensorInfo:
    name: str
    shape: tuple[int, ...]  # ggml order: shape[0] is the row length
    type: GGMLQuantizationType | int  # int when this gguf package does not know the type
    offset: int  # relative to the data section

    @property
    def n_elements(self) -> int:
        return int(np.prod(self.shape, dtype=np.int64))

    @property
    def n_bytes(self) -> int | None:
        sizes = GGML_QUANT_SIZES.get(self.type) if isinstance(self.type, GGMLQuantizationType) else None
        if sizes is None:
            return None
        block, type_size = sizes
        return self.n_elements // block * type_size

    @property
    def row_bytes(self) -> int | None:
        sizes = GGML_QUANT_SIZES.get(self.type) if isinstance(self.type, GGMLQuantizationType) else None
        return None if sizes is None else self.shape[0] // sizes[0] * sizes[1]


@dataclass(frozen=True)
class GGUFInfo:
    path: Path
    version: int
    metadata: dict[str, Any]
    tensors: dict[str, TensorInfo]
    alignment: int
    data_start: int
    file_size: int
    fields: dict[str, KeyField]

    @property
    def architecture(self) -> str | None:
        arch = self.metadata.get("general.architecture")
        return arch if isinstance(arch, str) else None

    def arch_key(self, suffix: str) -> Any:
        return self.metadata.get(f"{self.architecture}.{suffix}")


class _Cursor:
    def __init__(self, buf: memoryview, size: int):
        self.buf, self.size, self.pos = buf, size, 0

    def take(self, n: int, what: str) -> memoryview:
        if n < 0 or self.pos + n > self.size:
            raise GGUFError(f"truncated header: {what} needs {n} bytes at offset {self.pos}, "
                            f"the file has {self.size}")
        out = self.buf[self.pos:self.pos + n]
        self.pos += n
        return out

    def scalar(self, vtype: int, what: str) -> Any:
        fmt = _SCALARS[vtype][0]
        return struct.unpack(fmt, self.take(struct.calcsize(fmt), what))[0]

    def u32(self, what: str) -> int:
        return self.scalar(4, what)

    def u64(self, what: str) -> int:
        return self.scalar(10, what)

    def string(self, what: str) -> str:
        n = self.u64(what)
        raw = self.take(n, what)
        try:
            return str(raw, "utf-8")
        except UnicodeDecodeError:
            raise GGUFError(f"{what} at offset {self.pos - n} is not valid UTF-8") from None

    def skip_strings(self, count: int, what: str) -> None:
        unpack, buf, pos, size = struct.unpack_from, self.buf, self.pos, self.size
        for _ in range(count):
            if pos + 8 > size:
                raise GGUFError(f"truncated header inside {what} at offset {pos}")
            pos += 8 + unpack("<Q", buf, pos)[0]
        if pos > size:
            raise GGUFError(f"truncated header inside {what}")
        self.pos = pos

    def value(self, vtype: int, key: str) -> Any:
        if vtype in _SCALARS:
            return self.scalar(vtype, key)
        if vtype == STRING:
            return self.string(key)
        if vtype != ARRAY:
            raise GGUFError(f"{key}: unknown value type {vtype} at offset {self.pos}")
        etype, count = self.u32(key), self.u64(key)
        if count > self.size:
            raise GGUFError(f"{key}: array of {count} elements cannot fit in a {self.size}-byte file")
        if etype in _SCALARS:
            dtype = np.dtype(_SCALARS[etype][1])
            return np.frombuffer(self.take(count * dtype.itemsize, key), dtype=dtype).copy()
        if etype == STRING:
            start = self.pos
            self.skip_strings(count, key)
            return StringArray(count, start)
        return [self.value(etype, key) for _ in range(count)]


@contextmanager
def _view(path: Path, min_size: int = 24) -> Iterator[tuple[memoryview, int]]:
    try:
        with path.open("rb") as f:
            size = path.stat().st_size
            if size < min_size:
                raise GGUFError(f"{path}: {size} bytes is too short for a GGUF header", "gguf.magic")
            with mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as mm:
                with memoryview(mm) as view:
                    yield view, size
    except OSError as exc:
        raise GGUFError(f"{path}: cannot read: {exc}", "gguf.missing") from None


def read_gguf(path: str | Path) -> GGUFInfo:
    """Parse a GGUF header; string arrays come back as StringArray (decode one with read_strings)."""
    path = Path(path)
    with _view(path) as (view, size):
        return _parse(path, view, size)


def read_strings(info: GGUFInfo, key: str) -> list[str]:
    """Decode the string array stored under key; GGUFError (gguf.key) when it is absent or not one."""
    value = info.metadata.get(key)
    if not isinstance(value, StringArray):
        raise GGUFError(f"{info.path}: {key} is {'missing' if value is None else 'not a string array'}",
                        "gguf.key")
    with _view(info.path, 0) as (view, size):
        cur = _Cursor(view, size)
        cur.pos = value.offset
        return [cur.string(key) for _ in range(value.count)]


def read_raw(info: GGUFInfo, key: str) -> bytes:
    """The stored bytes of a value (its type, then the value), for copying it into another GGUF."""
    field = info.fields[key]
    with info.path.open("rb") as f:
        f.seek(field.start)
        raw = f.read(field.end - field.start)
    if len(raw) != field.end - field.start:
        raise GGUFError(f"{info.path}: {key} was cut short since the header was read")
    return raw


def _parse(path: Path, view: memoryview, size: int) -> GGUFInfo:
    cur = _Cursor(view, size)
    if bytes(cur.take(4, "magic")) != MAGIC:
        raise GGUFError(f"{path}: not a GGUF file (bad magic {bytes(view[:4])!r})", "gguf.magic")
    version = cur.u32("version")
    if version not in SUPPORTED_VERSIONS:
        raise GGUFError(f"{path}: GGUF version {version} is not supported (supported: {SUPPORTED_VERSIONS})",
                        "gguf.version")
    n_tensors, n_kv = cur.u64("tensor count"), cur.u64("metadata count")
    if n_tensors > size or n_kv > size:
        raise GGUFError(f"{path}: header claims {n_tensors} tensors and {n_kv} metadata keys: corrupt")
    metadata: dict[str, Any] = {}
    fields: dict[str, KeyField] = {}
    for _ in range(n_kv):
        key = cur.string("metadata key")
        start = cur.pos
        vtype = cur.u32(key)
        etype = struct.unpack_from("<I", view, cur.pos)[0] if vtype == ARRAY and cur.pos + 4 <= size else None
        metadata[key] = cur.value(vtype, key)
        fields[key] = KeyField(vtype, etype, start, cur.pos)
    tensors: dict[str, TensorInfo] = {}
    for _ in range(n_tensors):
        name = cur.string("tensor name")
        n_dims = cur.u32(name)
        if n_dims > 8:
            raise GGUFError(f"{path}: tensor {name} claims {n_dims} dimensions: corrupt")
        shape = tuple(cur.u64(name) for _ in range(n_dims))
        raw_type = cur.u32(name)
        try:
            ttype: GGMLQuantizationType | int = GGMLQuantizationType(raw_type)
        except ValueError:
            ttype = raw_type
        if name in tensors:
            raise GGUFError(f"{path}: tensor {name} appears twice")
        tensors[name] = TensorInfo(name, shape, ttype, cur.u64(name))
    alignment = metadata.get("general.alignment", DEFAULT_ALIGNMENT)
    if not isinstance(alignment, int) or alignment <= 0 or alignment & (alignment - 1):
        raise GGUFError(f"{path}: general.alignment = {alignment!r} is not a power of two")
    data_start = -(-cur.pos // alignment) * alignment
    return GGUFInfo(path, version, metadata, tensors, alignment, data_start, size, fields)


def tensor_rows(info: GGUFInfo, tensor: TensorInfo) -> np.ndarray:
    """A read-only memory map of a 2-D tensor's rows: [n_rows, row_bytes] uint8."""
    if len(tensor.shape) != 2 or tensor.row_bytes is None:
        raise GGUFError(f"{info.path}: {tensor.name} is not a 2-D tensor of a known type")
    n_rows = tensor.shape[1]
    start = info.data_start + tensor.offset
    if start + n_rows * tensor.row_bytes > info.file_size:
        raise GGUFError(f"{info.path}: {tensor.name} runs past the end of the file (truncated download?)")
    return np.memmap(info.path, dtype=np.uint8, mode="r", offset=start, shape=(n_rows, tensor.row_bytes))


def tensor_end(info: GGUFInfo, tensor: TensorInfo) -> int | None:
    """Absolute file offset one past the tensor's data; None for a type this gguf package does not know."""
    n = tensor.n_bytes
    return None if n is None else info.data_start + tensor.offset + n


def tensor_float32(info: GGUFInfo, tensor: TensorInfo) -> np.ndarray:
    """The tensor dequantized to float32, numpy shape = ggml shape reversed (torch's order)."""
    end = tensor_end(info, tensor)
    if end is None or end > info.file_size:
        raise GGUFError(f"{info.path}: {tensor.name} "
                        + ("has a type this reader cannot decode" if end is None else
                           f"ends at byte {end} but the file has {info.file_size} (truncated download?)"))
    raw = np.fromfile(info.path, dtype=np.uint8, count=tensor.n_bytes, offset=info.data_start + tensor.offset)
    shape = tuple(reversed(tensor.shape))
    if tensor.type == GGMLQuantizationType.F32:
        return raw.view("<f4").reshape(shape).astype(np.float32)
    if tensor.type == GGMLQuantizationType.F16:
        return raw.view("<f2").reshape(shape).astype(np.float32)
    rows = raw.reshape(-1, tensor.row_bytes)  # gguf-py dequantizes along the last (byte) axis
    return dequantize(rows, tensor.type).reshape(shape).astype(np.float32, copy=False)
