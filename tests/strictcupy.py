"""A strict stand-in for CuPy on the CPU: "device" arrays that refuse to meet numpy arrays.

As in CuPy, numpy cannot convert a device array implicitly (np.asarray, __array__ raise TypeError),
and an operator, a numpy ufunc or a numpy function given a device array and a numpy array raises
TypeError. Python and numpy scalars mix freely, as CuPy allows. Stricter than CuPy on one point:
numpy arrays and lists as indices raise (CuPy uploads them silently), so every upload is explicit.

Make one per test and put it where `import cupy` finds it:

    xp = StrictCuPy()
    monkeypatch.setitem(sys.modules, "cupy", xp)

Transfers are counted (xp.uploads, xp.downloads; xp.pinned_uploads: ndarray.set from memory that
xp.cuda.alloc_pinned_memory handed out; xp.transfer_threads: the threads that moved data), the
memory pool counts the bytes of live arrays and their peak, and can be limited
(xp.get_default_memory_pool().set_limit(size=...)) to raise CuPy's OutOfMemoryError, and xp.cuda
offers Device(...).synchronize() and alloc_pinned_memory.
"""

from __future__ import annotations

import operator
import threading
import types
import weakref
from typing import Any

import numpy as np

IMPLICIT = ("Implicit conversion to a NumPy array is not allowed. "
            "Please use `.get()` to construct a NumPy array explicitly.")

# numpy functions the module offers (CuPy has each under the same name)
FUNCTIONS = (
    "abs absolute add arange argmax argmin ascontiguousarray broadcast_to clip concatenate cos cumsum diff divide "
    "einsum empty empty_like exp expand_dims full full_like isfinite isnan log log1p matmul maximum mean minimum "
    "multiply negative ones ones_like repeat reshape sin sort sqrt square squeeze stack subtract sum take tanh "
    "transpose where zeros zeros_like"
).split()
CREATORS = {"arange", "empty", "full", "ones", "zeros"}  # make device arrays from Python values, no upload
METHODS = (
    "all any argmax argmin astype clip copy cumsum flatten max mean min prod ravel repeat reshape round squeeze "
    "std sum swapaxes take transpose var"
).split()
DTYPES = "bool_ float16 float32 float64 int8 int16 int32 int64 intp uint8 uint16 uint32 uint64".split()


class OutOfMemoryError(MemoryError):
    """cupy.cuda.memory.OutOfMemoryError: same name, same base, same arguments."""

    def __init__(self, size: int, total: int, limit: int = 0):
        self.size, self.total, self.limit = size, total, limit
        super().__init__(f"Out of memory allocating {size:,} bytes (allocated so far: {total:,} bytes"
                         + (f", limit set to: {limit:,} bytes)." if limit else ")."))


class MemoryPool:
    """CuPy's default pool as seen from outside: bytes in use, bytes held, a limit, free_all_blocks."""

    def __init__(self):
        self._lock = threading.Lock()
        self._live: dict[int, int] = {}  # id of a root numpy buffer -> its bytes
        self._cached = 0  # bytes of dead arrays the pool keeps until free_all_blocks
        self._limit = 0
        self.frees = 0  # free_all_blocks calls
        self.peak = 0  # most bytes of live arrays at any time

    def adopt(self, root: np.ndarray) -> None:
        key, size = id(root), root.nbytes
        with self._lock:
            if key in self._live:
                return
            used = sum(self._live.values())
            if self._limit and used + self._cached + size > self._limit:
                self._cached = 0  # CuPy frees its cached blocks and retries before giving up
                if used + size > self._limit:
                    raise OutOfMemoryError(size, used, self._limit)
            self._live[key] = size
            self.peak = max(self.peak, used + size)
        weakref.finalize(root, self._release, key)

    def _release(self, key: int) -> None:
        with self._lock:
            self._cached += self._live.pop(key, 0)

    def used_bytes(self) -> int:
        with self._lock:
            return sum(self._live.values())

    def total_bytes(self) -> int:
        with self._lock:
            return sum(self._live.values()) + self._cached

    def free_all_blocks(self) -> None:
        with self._lock:
            self._cached = 0
            self.frees += 1

    def set_limit(self, size: int | None = None, fraction: float | None = None) -> None:
        if fraction is not None:
            raise NotImplementedError("the stand-in has no device size; use set_limit(size=...)")
        self._limit = size or 0

    def get_limit(self) -> int:
        return self._limit


class Device:
    """cupy.cuda.Device: the stand-in has one device; synchronize() is counted."""

    def __init__(self, xp: StrictCuPy, device: int = 0):
        self._xp, self.id = xp, device

    def synchronize(self) -> None:
        with self._xp._counting:
            self._xp.synchronizations += 1

    def __enter__(self) -> Device:
        return self

    def __exit__(self, *exc) -> None:
        return None


def _is_device(x: Any) -> bool:
    return isinstance(x, ndarray)


def _refuse(x: Any) -> None:
    raise TypeError(f"Unsupported type {type(x)}: a numpy array met a device array; "
                    "upload it with cupy.asarray or download with cupy.asnumpy")


def _plain(x: Any) -> Any:
    """Device arrays to their numpy storage, through lists and tuples; numpy arrays refused."""
    if isinstance(x, ndarray):
        return x._a
    if isinstance(x, np.ndarray):
        _refuse(x)
    if isinstance(x, (list, tuple)):
        return type(x)(_plain(v) for v in x)
    return x


def _index(key: Any) -> Any:
    """An index on a device array: ints, slices, None, Ellipsis and device arrays only."""
    if isinstance(key, tuple):
        return tuple(_index(k) for k in key)
    if isinstance(key, ndarray):
        return key._a
    if isinstance(key, (np.ndarray, list)):
        raise TypeError(f"index of type {type(key).__name__} on a device array: upload it with cupy.asarray "
                        "first (CuPy would copy it to the device on every call)")
    return key


class ndarray:  # noqa: N801 - CuPy's name
    """A device array: numpy storage that numpy may not see."""

    __array_priority__ = 100  # above numpy's, as CuPy's

    def __init__(self, a: np.ndarray, xp: StrictCuPy):
        self._a, self._xp = a, xp

    # -- what CuPy refuses or allows at the host boundary
    def __array__(self, *args, **kwargs):
        raise TypeError(IMPLICIT)

    def __array_namespace__(self, *, api_version: str | None = None) -> StrictCuPy:
        return self._xp

    def __array_ufunc__(self, ufunc, method, *inputs, **kwargs):
        fn = ufunc if method == "__call__" else getattr(ufunc, method)
        return self._xp._wrap(fn(*_plain(inputs), **{k: _plain(v) for k, v in kwargs.items()}))

    def __array_function__(self, func, types_, args, kwargs):
        home = self._xp.linalg if func.__module__ == "numpy.linalg" else self._xp
        mine = getattr(home, func.__name__, None)
        if not callable(mine):
            return NotImplemented  # numpy then raises TypeError, as with a CuPy function CuPy lacks
        return mine(*args, **kwargs)

    def get(self, stream: Any = None, order: str = "C", out: np.ndarray | None = None) -> np.ndarray:
        return self._xp.asnumpy(self, out=out)

    def set(self, arr: np.ndarray, stream: Any = None) -> None:
        """Upload into this array, as CuPy's ndarray.set: numpy source, same dtype and shape."""
        if not isinstance(arr, np.ndarray):
            raise TypeError("Only numpy.ndarray can be set to cupy.ndarray")
        if arr.dtype != self.dtype:
            raise TypeError(f"{arr.dtype} array cannot be set to {self.dtype} array")
        if arr.shape != self.shape:
            raise ValueError(f"Shape mismatch. Old shape: {self.shape}, new shape: {arr.shape}")
        self._xp._count_upload(arr)
        self._a[...] = arr

    def item(self) -> Any:
        return self.get().item()

    def tolist(self) -> Any:
        return self.get().tolist()

    def __float__(self) -> float:
        return float(self.get())

    def __int__(self) -> int:
        return int(self.get())

    def __bool__(self) -> bool:
        return bool(self.get())

    def __repr__(self) -> str:
        return f"strictcupy.ndarray({self._a!r})"

    __hash__ = None  # type: ignore[assignment]

    # -- array attributes and methods
    shape = property(lambda self: self._a.shape)
    dtype = property(lambda self: self._a.dtype)
    ndim = property(lambda self: self._a.ndim)
    size = property(lambda self: self._a.size)
    nbytes = property(lambda self: self._a.nbytes)
    itemsize = property(lambda self: self._a.itemsize)
    strides = property(lambda self: self._a.strides)
    flags = property(lambda self: self._a.flags)
    T = property(lambda self: self._xp._wrap(self._a.T))

    def __getattr__(self, name: str) -> Any:
        if name not in METHODS:
            raise AttributeError(f"strictcupy.ndarray has no attribute {name!r}")
        method = getattr(self._a, name)
        return lambda *args, **kwargs: self._xp._wrap(
            method(*_plain(args), **{k: _plain(v) for k, v in kwargs.items()}))

    def __len__(self) -> int:
        return len(self._a)

    def __iter__(self):
        return (self._xp._wrap(row) for row in self._a)

    def __getitem__(self, key: Any) -> ndarray:
        return self._xp._wrap(self._a[_index(key)])

    def __setitem__(self, key: Any, value: Any) -> None:
        self._a[_index(key)] = _plain(value)


def _binary(op):
    def forward(self, other):
        return self._xp._wrap(op(self._a, _plain(other)))

    def reflected(self, other):
        return self._xp._wrap(op(_plain(other), self._a))

    return forward, reflected


def _inplace(op):
    def method(self, other):
        op(self._a, _plain(other))  # numpy's in-place operator writes into the storage
        return self

    return method


for _name, _op in {"add": operator.add, "sub": operator.sub, "mul": operator.mul, "truediv": operator.truediv,
                   "floordiv": operator.floordiv, "mod": operator.mod, "pow": operator.pow,
                   "matmul": operator.matmul, "and": operator.and_, "or": operator.or_, "xor": operator.xor,
                   "lshift": operator.lshift, "rshift": operator.rshift}.items():
    _forward, _reflected = _binary(_op)
    setattr(ndarray, f"__{_name}__", _forward)
    setattr(ndarray, f"__r{_name}__", _reflected)
    setattr(ndarray, f"__i{_name}__", _inplace(getattr(operator, f"i{_name}")))
for _name in ("eq", "ne", "lt", "le", "gt", "ge"):
    setattr(ndarray, f"__{_name}__", _binary(getattr(operator, _name))[0])
for _name, _op in {"neg": operator.neg, "pos": operator.pos, "abs": operator.abs, "invert": operator.invert}.items():
    setattr(ndarray, f"__{_name}__", lambda self, _op=_op: self._xp._wrap(_op(self._a)))


class CUDARuntimeError(RuntimeError):
    """cupy.cuda.runtime's: what getDeviceCount raises without a driver."""


class StrictCuPy(types.ModuleType):
    """The module: the subset of cupy's API clef-bridge uses, over strict device arrays."""

    ndarray = ndarray
    inf, nan, pi, newaxis = np.inf, np.nan, np.pi, np.newaxis

    def __init__(self, name: str = "cupy"):
        super().__init__(name, __doc__)
        self.uploads = self.upload_bytes = 0
        self.downloads = self.download_bytes = 0
        self.synchronizations = 0
        self.pinned_uploads = 0
        self.transfer_threads: set[str] = set()
        self._counting = threading.Lock()  # the worker's two threads both move data
        self._pinned: dict[int, weakref.ref] = {}  # id -> buffer handed out by alloc_pinned_memory
        self._pool = MemoryPool()
        for dtype in DTYPES:
            setattr(self, dtype, getattr(np, dtype))
        for fname in FUNCTIONS:
            setattr(self, fname, self._function(fname))
        self.linalg = types.SimpleNamespace(norm=self._function("norm", np.linalg.norm))
        memory = types.SimpleNamespace(OutOfMemoryError=OutOfMemoryError)
        self.cuda = types.SimpleNamespace(
            memory=memory, Device=lambda device=0: Device(self, device),
            alloc_pinned_memory=self._alloc_pinned,
            runtime=types.SimpleNamespace(getDeviceCount=lambda: 1, CUDARuntimeError=CUDARuntimeError))

    def _wrap(self, x: Any) -> Any:
        """numpy results to device arrays (numpy scalars become 0-d arrays, as CuPy returns them)."""
        if isinstance(x, np.generic):
            x = np.asarray(x)
        if isinstance(x, np.ndarray):
            root = x
            while isinstance(root.base, np.ndarray):
                root = root.base
            self._pool.adopt(root)
            return ndarray(x, self)
        if isinstance(x, (tuple, list)):
            return type(x)(self._wrap(v) for v in x)
        return x

    def _function(self, name: str, fn: Any = None) -> Any:
        fn = fn or getattr(np, name)

        def on_device(*args, **kwargs):
            host_lists = [a for a in args if isinstance(a, list) and not all(map(_is_device, _flat(a)))]
            if host_lists and name not in CREATORS:
                raise TypeError(f"cupy.{name} got a list of host values; upload it with cupy.asarray first")
            return self._wrap(fn(*_plain(args), **{k: _plain(v) for k, v in kwargs.items()}))

        on_device.__name__ = name
        return on_device

    # -- explicit transfers
    def _alloc_pinned(self, nbytes: int) -> np.ndarray:
        """Page-locked host memory: a buffer numpy can view (np.frombuffer), remembered as pinned."""
        buf = np.empty(nbytes, np.uint8)
        key = id(buf)
        self._pinned[key] = weakref.ref(buf)
        weakref.finalize(buf, self._pinned.pop, key, None)
        return buf

    def is_pinned(self, host: np.ndarray) -> bool:
        root = host
        while isinstance(root.base, np.ndarray):
            root = root.base
        ref = self._pinned.get(id(root))
        return ref is not None and ref() is root

    def _count_upload(self, host: np.ndarray, pinned_path: bool = True) -> None:
        with self._counting:
            self.uploads += 1
            self.upload_bytes += host.nbytes
            self.pinned_uploads += pinned_path and self.is_pinned(host)
            self.transfer_threads.add(threading.current_thread().name)

    def asarray(self, a: Any, dtype: Any = None) -> ndarray:
        """Upload host data (a device array passes through, cast if asked).

        CuPy copies host data into a pinned staging buffer of its own first, pinned or not: not a
        pinned upload.
        """
        if isinstance(a, ndarray):
            return a if dtype is None or a.dtype == dtype else a.astype(dtype)
        host = np.array(_plain(a) if isinstance(a, (list, tuple)) else a, dtype=dtype, copy=True)  # the device's copy
        self._count_upload(host, pinned_path=False)
        return self._wrap(host)

    array = asarray

    def asnumpy(self, a: Any, stream: Any = None, order: str = "C", out: np.ndarray | None = None) -> np.ndarray:
        """Download to a new numpy array, or into out (host data passes through, as in CuPy)."""
        if not isinstance(a, ndarray):
            return np.asarray(a)
        with self._counting:
            self.downloads += 1
            self.download_bytes += a._a.nbytes
            self.transfer_threads.add(threading.current_thread().name)
        if out is None:
            return np.array(a._a, order=order, copy=True)
        out[...] = a._a
        return out

    def get_array_module(self, *args: Any) -> Any:
        return self if any(_is_device(a) for a in args) else np

    def get_default_memory_pool(self) -> MemoryPool:
        return self._pool


def _flat(x: Any):
    if isinstance(x, (list, tuple)):
        for v in x:
            yield from _flat(v)
    else:
        yield x

