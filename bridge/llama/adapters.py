"""One loaded backbone served by several models, each with its own LoRA adapter (or none).

llama.cpp keeps one adapter set per context (`llama_set_adapters_lora`); it changes the set only when it differs
from the current one, and a change makes the next decode reserve its graph anew. Each model sees the shared
backbone through a BackboneView: every decode takes the shared lock, sets the model's adapter and runs, so one
llama_decode (and each of its ubatches) runs ONE adapter, and models' batches take turns on the context: batching
happens within a model, never across adapters. The prefix cache is the backbone's, shared: each view puts its
partition on its requests, so KV cells, recurrent states and head payloads never pass between models.
"""

from __future__ import annotations

import ctypes
import threading
from dataclasses import replace
from pathlib import Path
from typing import Callable

import numpy as np

from .backbone import Backbone, BackboneError, Tokenizer
from .media_batch import MediaChunk
from .native import lc
from .prefix_cache import CachedPrefill, PrefillRequest


class LoraAdapter:
    """A GGUF LoRA loaded for one backbone's llama_model (freed before the model is)."""

    def __init__(self, backbone: Backbone, path: str | Path, scale: float = 1.0):
        self.path, self.scale = Path(path), float(scale)
        self._ptr = lc.llama_adapter_lora_init(backbone.llama_model, str(self.path).encode())
        if not self._ptr:
            raise BackboneError(f"{self.path}: llama.cpp could not load this LoRA adapter for {backbone.path.name} "
                                "(see the log above: a tensor missing from the base, or a shape that differs)")

    @property
    def pointer(self):
        return self._ptr

    def close(self) -> None:
        if self._ptr:
            lc.llama_adapter_lora_free(self._ptr)
            self._ptr = None


class SharedBackbone:
    """One Backbone, its adapters and the lock its views decode under; closed when its last view closes."""

    def __init__(self, backbone: Backbone):
        self.backbone = backbone
        self.lock = threading.RLock()
        self.views: list[BackboneView] = []
        self.adapters: list[LoraAdapter] = []
        self._current: tuple[int, float] | None = None  # (adapter pointer, scale) set on the context now
        self.switches = 0  # adapter-set changes so far (each makes the next decode reserve its graph)

    def view(self, name: str, adapter_path: Path | None = None, scale: float = 1.0) -> "BackboneView":
        """A model's view, with its adapter loaded (None: the base alone)."""
        adapter = LoraAdapter(self.backbone, adapter_path, scale) if adapter_path is not None else None
        if adapter is not None:
            self.adapters.append(adapter)
        view = BackboneView(self, name, adapter)
        self.views.append(view)
        return view

    def select(self, adapter: LoraAdapter | None) -> None:
        """Make the context run `adapter` (the caller holds the lock)."""
        key = (ctypes.cast(adapter.pointer, ctypes.c_void_p).value, adapter.scale) if adapter else None
        if key == self._current:
            return
        ctx = self.backbone.llama_context
        if adapter is None:
            status = lc.llama_set_adapters_lora(ctx, None, 0, None)
        else:
            pointers = (lc.llama_adapter_lora_p_ctypes * 1)(adapter.pointer)
            scales = (ctypes.c_float * 1)(adapter.scale)
            status = lc.llama_set_adapters_lora(ctx, pointers, 1, scales)
        if status != 0:
            raise BackboneError(f"llama_set_adapters_lora failed with status {status}")
        self._current = key
        self.switches += 1

    def release(self, view: "BackboneView") -> None:
        with self.lock:
            if view in self.views:
                self.views.remove(view)
            if self.views:
                return
            for adapter in self.adapters:
                adapter.close()
            self.adapters.clear()
            self.backbone.close()


class BackboneView:
    """What a ClefModel holds (a BackboneProtocol): the shared backbone, decoding with this model's adapter under the
    shared lock."""

    def __init__(self, shared: SharedBackbone, name: str, adapter: LoraAdapter | None):
        self.shared, self.name, self.adapter = shared, name, adapter
        base = shared.backbone
        # its own tokenizer: llama_tokenize reads the vocabulary only, the Tokenizer's buffer is per instance
        self._tokenizer = Tokenizer(base.vocab, base.tokenizer.normalization)
        self.partition = (f"model:{name}",)  # its adapter's KV and its head's payloads are its own

    # the shared backbone's own values (BackboneProtocol's), read through, each named
    path = property(lambda self: self.shared.backbone.path)
    options = property(lambda self: self.shared.backbone.options)
    architecture = property(lambda self: self.shared.backbone.architecture)
    n_embd = property(lambda self: self.shared.backbone.n_embd)
    n_embd_inp = property(lambda self: self.shared.backbone.n_embd_inp)
    decode_budget = property(lambda self: self.shared.backbone.decode_budget)
    batch_budget = property(lambda self: self.shared.backbone.batch_budget)
    prefix_cache = property(lambda self: self.shared.backbone.prefix_cache)
    on_gpu = property(lambda self: self.shared.backbone.on_gpu)
    llama_model = property(lambda self: self.shared.backbone.llama_model)

    def tokenize(self, text: str, parse_special: bool) -> list[int]:
        return self._tokenizer.tokenize(text, parse_special)

    def min_tokens(self, text: str) -> int:
        return self._tokenizer.min_tokens(text)

    def prefill(self, token_ids: np.ndarray) -> np.ndarray:
        return self.prefill_many([token_ids])[0]

    def prefill_many(self, sequences: list[np.ndarray]) -> list[np.ndarray]:
        with self.shared.lock:
            self.shared.select(self.adapter)
            return self.shared.backbone.prefill_many(sequences)

    def prefill_cached(self, requests: list[PrefillRequest]) -> list[CachedPrefill]:
        requests = [replace(r, partition=self.partition + r.partition) for r in requests]
        with self.shared.lock:
            self.shared.select(self.adapter)
            return self.shared.backbone.prefill_cached(requests)

    def decode_media(self, chunks: list[MediaChunk]) -> np.ndarray:
        with self.shared.lock:
            self.shared.select(self.adapter)
            return self.shared.backbone.decode_media(chunks)

    def close(self) -> None:
        self.shared.release(self)

    def __del__(self) -> None:
        pass  # the shared backbone closes with its last view, never with one view's garbage


def same_hidden_states(a: object, b: object) -> bool:
    """Whether two models' backbones give the same hidden states for any prompt: views of one shared backbone with the
    same adapter file and scale, or none (a model with a backbone of its own shares it with no other)."""
    def adapter(view: BackboneView) -> tuple[Path, float] | None:
        return (view.adapter.path, view.adapter.scale) if view.adapter is not None else None

    return (isinstance(a, BackboneView) and isinstance(b, BackboneView) and a.shared is b.shared
            and adapter(a) == adapter(b))


class BackbonePool:
    """The backbones loaded so far, by file and options: the entries that name the same GGUF with the same backbone
    options share one, each through its own view."""

    def __init__(self):
        self._shared: dict[tuple[Path, object], SharedBackbone] = {}

    def view(self, key: tuple[Path, object], opener: Callable[[], Backbone], name: str,
             adapter_path: Path | None = None, scale: float = 1.0) -> BackboneView:
        """`name`'s view of the backbone under key, opened by opener() if no model holds it yet."""
        shared = self._shared.get(key)
        if shared is None or not shared.views:
            shared = self._shared[key] = SharedBackbone(opener())
        try:
            return shared.view(name, adapter_path, scale)
        except BaseException:
            if not shared.views:
                shared.backbone.close()
                del self._shared[key]
            raise
