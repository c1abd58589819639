"""Rows of the output embedding (lm_head), read from the GGUF and dequantized on demand."""

from __future__ import annotations

from pathlib import Path

import numpy as np
from gguf import GGMLQuantizationType
from gguf.quants import dequantize

from ..gguf.reader import GGUFInfo, read_gguf, tensor_rows
from .backbone import BackboneError

OUTPUT = "output.weight"
TIED = "token_embd.weight"  # used when the model ties its input and output embeddings
SUPPORTED = {GGMLQuantizationType[n] for n in ("F32", "F16", "BF16", "Q8_0", "Q6_K", "Q5_K", "Q4_K", "Q5_0",
                                                "Q4_0", "Q4_1", "Q5_1", "Q2_K", "Q3_K")}


class OutputEmbedding:
    """Dequantizes only the rows asked for and caches them per token id (up to max_rows)."""

    def __init__(self, path: str | Path, max_rows: int = 16384, info: GGUFInfo | None = None):
        """info: the GGUF's header when the caller read it already."""
        info = info or read_gguf(path)
        tensor = info.tensors.get(OUTPUT) or info.tensors.get(TIED)
        if tensor is None:
            raise BackboneError(f"{path}: neither {OUTPUT} nor {TIED} is in this GGUF; the head needs the output "
                                "embedding")
        if tensor.type not in SUPPORTED:
            name = getattr(tensor.type, "name", tensor.type)
            raise BackboneError(f"{path}: {tensor.name} is {name}, which clef-bridge cannot dequantize; "
                                f"supported: {sorted(t.name for t in SUPPORTED)}")
        self.tensor_name = tensor.name
        self.qtype = tensor.type
        self.n_embd = int(tensor.shape[0])
        self.n_vocab = int(tensor.shape[1])
        self._data = tensor_rows(info, tensor)  # memory-mapped [n_vocab, row bytes]
        self._slot = np.full(self.n_vocab, -1, dtype=np.int64)  # token id -> row of _store, -1 if not cached
        self._store = np.zeros((0, self.n_embd), dtype=np.float32)
        self._used = 0
        self.max_rows = max_rows

    def dequantize(self, ids: np.ndarray) -> np.ndarray:
        """Rows for these ids straight from the file: [n, n_embd] float32."""
        raw = np.asarray(self._data[ids])  # [n, row bytes] copied out of the map
        if self.qtype == GGMLQuantizationType.F32:
            return raw.view(np.float32).reshape(len(ids), self.n_embd).copy()
        return dequantize(raw, self.qtype).reshape(len(ids), self.n_embd).astype(np.float32, copy=False)

    def rows(self, ids: np.ndarray) -> np.ndarray:
        """[len(ids), n_embd] float32 rows, from the cache where it has them."""
        ids = np.asarray(ids, dtype=np.int64)
        if ids.size and (ids.min() < 0 or ids.max() >= self.n_vocab):
            raise ValueError(f"token ids must lie in [0, {self.n_vocab})")
        missing = np.unique(ids[self._slot[ids] < 0])
        room = self.max_rows - self._used
        if len(missing) > room:  # a full cache still answers: uncached rows come from the file
            out = np.empty((len(ids), self.n_embd), dtype=np.float32)
            cached = self._slot[ids] >= 0
            out[cached] = self._store[self._slot[ids[cached]]]
            out[~cached] = self.dequantize(ids[~cached])
            return out
        if len(missing):
            self._grow(self._used + len(missing))
            self._store[self._used:self._used + len(missing)] = self.dequantize(missing)
            self._slot[missing] = np.arange(self._used, self._used + len(missing))
            self._used += len(missing)
        return self._store[self._slot[ids]]

    def _grow(self, need: int) -> None:
        if need > len(self._store):
            size = min(self.max_rows, max(need, 2 * len(self._store), 256))
            store = np.zeros((size, self.n_embd), dtype=np.float32)
            store[:self._used] = self._store[:self._used]
            self._store = store
