"""Qwen3-Omni's thinker through llama.cpp (architecture qwen3vlmoe): Clef-omni's backbone.

Two things differ from Qwen3.5's path (bridge/llama/backbone.py):

- Hidden states. qwen3vlmoe has no "nextn" hook (llama.cpp sets t_h_nextn only for qwen35), so the final-norm
  rows of every token come from marking every token an output. llama.cpp would then run lm_head on every token
  (0.62 GFLOP per token at Clef-omni's width and vocabulary) and copy n_vocab logits per token out. A graph
  callback (llama_context_params.cb_eval) copies the node named `result_norm` and returns false: ggml's scheduler
  then leaves the graph split right there, so lm_head never runs; llama_decode still succeeds and the KV cache
  is intact. The logits buffers stay, bounded by decoding in chunks of n_batch = n_ubatch = n_outputs_max
  tokens (BackboneOptions.n_ubatch, 512 by default: 297 MiB of host logits buffer and as much compute buffer).
  The callback only skips the rest of the split holding result_norm: with the output layer on another device
  than the final norm (a partial GPU offload), lm_head still runs there, wasted but harmless.
- Deepstack. The converter writes qwen3vlmoe.n_deepstack_layers = 0 for Qwen3-Omni although its vision tower
  feeds the first k layers; the projector knows k (clip.vision.is_deepstack_layers), and a kv override loads
  the text GGUF with it, so image rows are n_embd x (1 + k) wide (n_embd_inp). Text tokens' embeddings are
  zero-padded by llama.cpp, so text-only results do not depend on k.

The prefix cache works as for Qwen3.5 (bridge/llama/prefix_cache.py): qwen3vlmoe keeps only KV cells, which
copy_cells shares with a request, so a checkpoint's "recurrent state" is empty (save_state returns 0 bytes).
"""

from __future__ import annotations

import ctypes
from pathlib import Path
from typing import Iterator

import numpy as np

from ..catalogue.architectures import QWEN3VLMOE
from ..host.gpu import HostRows, host_rows_for
from .backbone import Backbone, BackboneError, BackboneOptions, DecodeFailed
from .media_batch import MediaBatch, MediaChunk
from .native import ctypes_ext, lc

OMNI_ARCH = QWEN3VLMOE.name
FINAL_NORM = b"result_norm"  # llama.cpp's name for the final norm's output (llm_graph_context::build_*)


def _ggml_base():
    """The three ggml functions the callback needs, from llama-cpp-python's own libggml-base."""
    lib = ctypes_ext.load_shared_library("ggml-base", Path(lc.load().__file__).parent / "lib")
    lib.ggml_get_name.restype = ctypes.c_char_p
    lib.ggml_get_name.argtypes = [ctypes.c_void_p]
    lib.ggml_nbytes.restype = ctypes.c_size_t
    lib.ggml_nbytes.argtypes = [ctypes.c_void_p]
    lib.ggml_backend_tensor_get.restype = None
    lib.ggml_backend_tensor_get.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_size_t]
    return lib


class OmniBackbone(Backbone):
    """A qwen3vlmoe GGUF and one llama.cpp context whose decodes give the final-norm state of every token,
    with lm_head skipped; not thread-safe (one worker owns it)."""

    def __init__(self, path: str | Path, options: BackboneOptions = BackboneOptions(), host_rows: HostRows =
                 host_rows_for(np), deepstack: int = 0, skip_lm_head: bool = True):
        """deepstack: the projector's deepstack levels (0 without a vision projector); skip_lm_head False lets
        lm_head run (what it costs is measured by `python -m benchmarks omni`)."""
        if deepstack < 0:
            raise ValueError(f"deepstack {deepstack}: a count of layers, at least 0")
        self.deepstack = deepstack
        self.skip_lm_head = skip_lm_head
        self.chunk = min(options.n_ubatch, options.n_ctx)  # tokens per llama_decode: bounds the logits buffers
        self.lm_head_skips = 0  # graph splits stopped after result_norm, for the tests and benchmarks
        self._rows: np.ndarray | None = None  # where the callback copies the rows of the decodes in progress
        self._at = self._expect = 0  # rows copied so far; tokens of the decode running
        self._fault = ""
        self._ggml = _ggml_base()
        self._eval = lc.ggml_backend_sched_eval_callback(self._on_eval)  # kept alive as long as the context
        super().__init__(path, options, host_rows)
        if self.architecture != OMNI_ARCH:
            self.close()
            raise BackboneError(f"{self.path}: architecture {self.architecture!r}, not Qwen3-Omni's {OMNI_ARCH}")

    def _configure_model(self, mparams) -> None:
        key = f"{OMNI_ARCH}.n_deepstack_layers".encode()
        overrides = (lc.llama_model_kv_override * 2)()
        overrides[0].key = key
        overrides[0].tag = lc.LLAMA_KV_OVERRIDE_TYPE_INT
        overrides[0].value.val_i64 = self.deepstack
        overrides[1].key = b""  # the list ends at an empty key
        self._overrides = overrides  # llama.cpp reads them while loading
        mparams.kv_overrides = ctypes.cast(overrides, ctypes.POINTER(lc.llama_model_kv_override))

    def _configure_context(self, cparams) -> None:
        cparams.n_batch = cparams.n_ubatch = self.chunk
        cparams.n_outputs_max = self.chunk  # every token is an output: result_norm then holds every row
        cparams.cb_eval = self._eval
        cparams.cb_eval_user_data = None

    def _start_context(self) -> None:
        """No nextn rows: the callback reads result_norm."""

    def _max_decode(self) -> int:
        return self.options.n_ctx  # decoded in chunks of n_batch, so only the context bounds a prefill

    def _on_eval(self, tensor, ask: bool, _user) -> bool:
        """ggml's scheduler asks first whether we want a node, then hands it over once computed; returning false
        then stops the graph split (lm_head follows result_norm in it)."""
        if ask:
            return self._ggml.ggml_get_name(tensor) == FINAL_NORM
        if self._rows is None or self._ggml.ggml_get_name(tensor) != FINAL_NORM:
            return True
        n = self._ggml.ggml_nbytes(tensor) // (4 * self.n_embd)  # float32 [n, n_embd]: every token is an output
        if self._fault or n != self._expect:  # not one row per token of this decode: copy nothing more
            self._fault = self._fault or f"{FINAL_NORM.decode()} held {n} rows for a decode of {self._expect} tokens"
            return True
        dst = self._rows[self._at:self._at + n]
        self._ggml.ggml_backend_tensor_get(tensor, dst.ctypes.data, 0, dst.nbytes)
        self._at += n
        self._expect = 0  # a second result_norm in one decode is a fault too
        if self.skip_lm_head:
            self.lm_head_skips += 1
            return False
        return True

    def _collect(self, batches: Iterator[tuple[object, int, str]], total: int) -> np.ndarray:
        """Decode batches (llama_batch holders, their token counts, what they hold) and return the final-norm rows
        of their total tokens, float32 [total, n_embd]."""
        self._rows, self._at, self._fault = self._host_rows(total, self.n_embd), 0, ""
        try:
            for holder, n, what in batches:
                self._expect = n
                status = lc.llama_decode(self._ctx, holder.struct)
                if status != 0:
                    raise DecodeFailed(f"llama_decode failed with status {status} on {n} {what}")
            lc.llama_synchronize(self._ctx)
            rows, got, fault = self._rows, self._at, self._fault
        finally:
            self._rows = None
        if fault or got != total:
            why = fault or f"is {FINAL_NORM.decode()!r} still the final norm's name in this llama.cpp?"
            raise DecodeFailed(f"llama.cpp handed over {got} final-norm rows for {total} tokens ({why})")
        return rows

    def decode_chunks(self, chunks: list[tuple[int, int, np.ndarray]]) -> np.ndarray:
        """(sequence id, first position, token ids) chunks, in llama_decode calls of at most `chunk` tokens with
        every token an output: float32 [n, n_embd] rows in chunk order."""
        total = sum(len(ids) for _, _, ids in chunks)

        def batches():
            part, used = [], 0
            for seq, start, ids in chunks:
                at = 0
                while at < len(ids):
                    take = min(len(ids) - at, self.chunk - used)
                    part.append((seq, start + at, ids[at:at + take]))
                    at, used = at + take, used + take
                    if used == self.chunk:
                        yield self._filled(part), used, "tokens"
                        part, used = [], 0
            if part:
                yield self._filled(part), used, "tokens"

        return self._collect(batches(), total)

    def _filled(self, part: list[tuple[int, int, np.ndarray]]):
        self._batch.fill_chunks(part, all_outputs=True)
        return self._batch

    def decode_media(self, chunks: list[MediaChunk]) -> np.ndarray:
        """ONE sequence (id 0) decoded chunk after chunk, each cut into pieces of at most `chunk` tokens; token ids
        or input embeddings (n_embd_inp wide) at the chunks' own positions: float32 [t, n_embd], every token's."""
        if not chunks or sum(len(c) for c in chunks) > self.decode_budget:
            raise ValueError(f"chunks of {[len(c) for c in chunks]} tokens do not fit a decode of {self.decode_budget}")
        for c in chunks:
            if c.embd is not None and c.embd.shape[1] != self.n_embd_inp:
                raise ValueError(f"embeddings of width {c.embd.shape[1]}; this backbone takes {self.n_embd_inp}")

        def batches():
            for c in chunks:
                # read when llama_decode sets the mask's input, so the flag holds for this chunk's pieces alone
                lc.llama_set_causal_attn(self._ctx, c.causal)
                for s in range(0, len(c), self.chunk):
                    part = MediaChunk(c.pos[..., s:s + self.chunk],
                                      None if c.tokens is None else c.tokens[s:s + self.chunk],
                                      None if c.embd is None else c.embd[s:s + self.chunk], c.causal)
                    what = "embeddings" if c.embd is not None else "tokens"
                    yield MediaBatch(part, all_outputs=True), len(part), what

        self.drop_sequence(0)
        try:
            return self._collect(batches(), sum(len(c) for c in chunks))
        finally:
            lc.llama_set_causal_attn(self._ctx, True)
            self.drop_sequence(0)

    # qwen3vlmoe keeps KV cells only: the prefix cache shares them (copy_cells); there is no other state to keep.

    def save_state(self, seq: int) -> np.ndarray:
        """Nothing: a KV-only model's sequence is its KV cells, which the prefix cache keeps in its branches."""
        return np.empty(0, dtype=np.uint8)

    def restore_state(self, seq: int, state: np.ndarray) -> None:
        if state.size:
            raise ValueError(f"a {OMNI_ARCH} sequence has no state beyond its KV cells; got {state.size} bytes")
