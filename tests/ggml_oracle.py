"""llama.cpp's own quantizer and dequantizer (libggml-base, shipped inside llama-cpp-python)."""

from __future__ import annotations

import ctypes
from functools import cache
from pathlib import Path

import llama_cpp
import numpy as np


class _TypeTraits(ctypes.Structure):  # struct ggml_type_traits (ggml.h)
    _fields_ = [("type_name", ctypes.c_char_p), ("blck_size", ctypes.c_int64),
                ("blck_size_interleave", ctypes.c_int64), ("type_size", ctypes.c_size_t),
                ("is_quantized", ctypes.c_bool), ("to_float", ctypes.c_void_p), ("from_float_ref", ctypes.c_void_p)]


_TO_FLOAT = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.POINTER(ctypes.c_float), ctypes.c_int64)


@cache
def _lib():
    lib = ctypes.CDLL(str(Path(llama_cpp.__file__).parent / "lib" / "libggml-base.so"))
    lib.ggml_quantize_chunk.argtypes = [ctypes.c_int, ctypes.POINTER(ctypes.c_float), ctypes.c_void_p,
                                        ctypes.c_int64, ctypes.c_int64, ctypes.c_int64, ctypes.c_void_p]
    lib.ggml_quantize_chunk.restype = ctypes.c_size_t
    lib.ggml_row_size.argtypes = [ctypes.c_int, ctypes.c_int64]
    lib.ggml_row_size.restype = ctypes.c_size_t
    lib.ggml_get_type_traits.argtypes = [ctypes.c_int]
    lib.ggml_get_type_traits.restype = ctypes.POINTER(_TypeTraits)
    return lib


def quantize(qtype: int, rows: np.ndarray) -> np.ndarray:
    """[n_rows, n_per_row] float32 -> [n_rows, row_bytes] uint8 in ggml's layout."""
    lib = _lib()
    rows = np.ascontiguousarray(rows, dtype=np.float32)
    n_rows, n = rows.shape
    out = np.zeros((n_rows, lib.ggml_row_size(qtype, n)), dtype=np.uint8)
    lib.ggml_quantize_chunk(qtype, rows.ctypes.data_as(ctypes.POINTER(ctypes.c_float)), out.ctypes.data, 0,
                            n_rows, n, None)
    return out


def dequantize(qtype: int, raw: np.ndarray, n_per_row: int) -> np.ndarray:
    """ggml's to_float over quantized rows: [n_rows, row_bytes] -> [n_rows, n_per_row] float32."""
    traits = _lib().ggml_get_type_traits(qtype).contents
    raw = np.ascontiguousarray(raw)
    out = np.zeros((raw.shape[0], n_per_row), dtype=np.float32)
    _TO_FLOAT(traits.to_float)(raw.ctypes.data, out.ctypes.data_as(ctypes.POINTER(ctypes.c_float)), out.size)
    return out
