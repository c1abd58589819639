"""The Qwen3.5 backbone through llama.cpp: tokenize, and prefill into last-layer hidden states.

Qwen3-Omni's thinker (qwen3vlmoe) reads its hidden states another way: bridge/llama/omni.py subclasses Backbone.
"""

from __future__ import annotations

import ctypes
import os
import threading
import unicodedata
from pathlib import Path

import numpy as np

from ...head.errors import Category, ClefError
from ..catalogue.architectures import NFC_PRE_TOKENIZERS
from ..catalogue.dtypes import KV_CACHE_DTYPES
from ..host.gpu import HostRows, host_rows_for
from . import log as llama_log
from .buffers import cpu_experts
from .media_batch import MediaBatch, MediaChunk
from .native import lc, lc_ext
from .options import BackboneOptions
from .prefix_cache import CachedPrefill, PrefillRequest, PrefixCache


class BackboneError(ClefError):
    """llama.cpp could not load the GGUF or could not run a batch."""

    category = Category.UNAVAILABLE
    error_type = "backbone_error"


class DecodeFailed(BackboneError):
    """llama_decode returned an error for a batch (out of memory, aborted, ...)."""

    error_type = "decode_failed"


GGML_KV_TYPES = {name: f"GGML_TYPE_{name.upper()}" for name in KV_CACHE_DTYPES}  # llama_cpp's names


# NFC_PRE_TOKENIZERS (the catalogue's): pre-tokenizers whose Hugging Face tokenizer NFC-normalizes text first
# (transformers' Qwen2Tokenizer and Qwen3_5Tokenizer set normalizers.NFC()). GGUF conversion drops the normalizer
# and llama.cpp does not apply it, so without this a decomposed "é" would tokenize differently from the reference.


def _meta_str(model, key: str) -> str | None:
    buf = ctypes.create_string_buffer(256)
    n = lc.llama_model_meta_val_str(model, key.encode(), buf, len(buf))
    return buf.value.decode("utf-8", "replace") if n >= 0 else None


def unicode_normalization(model) -> str | None:
    """The Unicode form the model's original tokenizer normalizes text to, if any."""
    return "NFC" if _meta_str(model, "tokenizer.ggml.pre") in NFC_PRE_TOKENIZERS else None


class _Batch:
    """A llama_batch whose buffers numpy owns, so filling it needs no per-token Python loop."""

    def __init__(self, capacity: int):
        self.token = np.zeros(capacity, dtype=np.int32)
        self.pos = np.zeros(capacity, dtype=np.int32)
        self.n_seq_id = np.ones(capacity, dtype=np.int32)
        self.seq = np.zeros(capacity, dtype=np.int32)  # one sequence id per token, pointed to by seq_ptr
        self.seq_ptr = (self.seq.ctypes.data + 4 * np.arange(capacity, dtype=np.uint64)).astype(np.uint64)
        self.logits = np.zeros(capacity, dtype=np.int8)  # outputs: none (see fill_chunks)
        self.struct = lc.llama_batch()
        self.struct.token = self.token.ctypes.data_as(ctypes.POINTER(lc.llama_token))
        self.struct.embd = None
        self.struct.pos = self.pos.ctypes.data_as(ctypes.POINTER(lc.llama_pos))
        self.struct.n_seq_id = self.n_seq_id.ctypes.data_as(ctypes.POINTER(ctypes.c_int32))
        self.struct.seq_id = self.seq_ptr.ctypes.data_as(ctypes.POINTER(ctypes.POINTER(lc.llama_seq_id)))
        self.struct.logits = self.logits.ctypes.data_as(ctypes.POINTER(ctypes.c_int8))

    def fill_chunks(self, chunks: list[tuple[int, int, np.ndarray]], all_outputs: bool = False) -> int:
        """Chunks of (sequence id, position of the first token, token ids); no token is an output (every token with
        all_outputs).

        The hidden states come from the unmasked nextn rows, which llama.cpp copies whatever the outputs are;
        an output token would only make it run lm_head on that row: n_vocab x n_embd weights read per ubatch
        holding one (622 MB at F32 for a 151,936-token vocabulary of width 1024), logits nobody reads.
        """
        n = 0
        for seq_id, start, ids in chunks:
            k = len(ids)
            self.token[n:n + k] = ids
            self.pos[n:n + k] = np.arange(start, start + k, dtype=np.int32)
            self.seq[n:n + k] = seq_id
            self.logits[n:n + k] = int(all_outputs)
            n += k
        self.struct.n_tokens = n
        return n


class Tokenizer:
    """llama.cpp's tokenizer over a loaded vocabulary.

    With parse_special False llama.cpp still matches user-defined tokens such as <think> inside the
    text; plain-text tokenization cuts each occurrence after its first character so that user text
    can never produce a token of the prompt's own markup.
    """

    def __init__(self, vocab, normalization: str | None = None):
        self._vocab = vocab
        self.normalization = normalization
        self._local = threading.local()  # a buffer per thread: requests are encoded on several threads at once
        self.user_defined, self.max_token_bytes = self._scan_vocab()

    def _scan_vocab(self) -> tuple[tuple[str, ...], int]:
        """The user-defined tokens' texts (longest first) and the most bytes any token's piece spans."""
        texts, longest = [], 1
        buf = ctypes.create_string_buffer(256)
        for token in range(lc.llama_vocab_n_tokens(self._vocab)):
            n = lc.llama_token_to_piece(self._vocab, token, buf, len(buf), 0, True)
            longest = max(longest, abs(n))  # a negative n is the size a longer piece needs
            if n > 1 and lc.llama_vocab_get_attr(self._vocab, token) & lc.LLAMA_TOKEN_ATTR_USER_DEFINED:
                texts.append(buf.raw[:n].decode("utf-8", "replace"))
        return tuple(sorted(set(texts), key=len, reverse=True)), longest

    def min_tokens(self, text: str) -> int:
        """A lower bound on len(tokenize(text)) from the text's size alone: no token spans more than
        max_token_bytes, and NFC shrinks text to a third at most (three jamo into one syllable)."""
        size = len(text) if text.isascii() else len(text.encode("utf-8", "surrogatepass"))
        if self.normalization and not text.isascii() and not unicodedata.is_normalized(self.normalization, text):
            size //= 3
        return -(-size // self.max_token_bytes)

    def _raw(self, text: str, parse_special: bool) -> list[int]:
        raw = text.encode("utf-8")
        buf = getattr(self._local, "buf", None)
        if buf is None:
            buf = self._local.buf = (lc.llama_token * 4096)()
        n = lc.llama_tokenize(self._vocab, raw, len(raw), buf, len(buf), False, parse_special)
        if n < 0:  # a one-off buffer: a long text must not pin its size in memory for the model's life
            buf = (lc.llama_token * (-n))()
            n = lc.llama_tokenize(self._vocab, raw, len(raw), buf, len(buf), False, parse_special)
        return np.ctypeslib.as_array(buf)[:n].tolist()

    def tokenize(self, text: str, parse_special: bool) -> list[int]:
        if self.normalization:
            text = unicodedata.normalize(self.normalization, text)
        if parse_special or not any(t in text for t in self.user_defined):
            return self._raw(text, parse_special)
        cuts = sorted({i + 1 for t in self.user_defined for i in _occurrences(text, t)})
        pieces = [text[a:b] for a, b in zip([0] + cuts, cuts + [len(text)]) if a < b]
        return [token for piece in pieces for token in self._raw(piece, False)]


def _occurrences(text: str, needle: str) -> list[int]:
    out, at = [], text.find(needle)
    while at >= 0:
        out.append(at)
        at = text.find(needle, at + 1)
    return out


class Backbone:
    """One GGUF backbone and one llama.cpp context; not thread-safe (one worker owns it).

    The hidden states come from llama.cpp's unmasked "nextn" embeddings: the final-norm output
    of every token, while no token is an output. Marking every token as an output (plain
    embeddings=True) would also run the LM head on every token and reserve n_vocab floats per
    token on the host: 10 GB for a 16k-token batch of a 152k vocabulary.
    """

    def __init__(self, path: str | Path, options: BackboneOptions = BackboneOptions(),
                 host_rows: HostRows = host_rows_for(np)):
        """host_rows: where hidden states are copied out of llama.cpp (pinned memory for a CuPy head)."""
        self.path = Path(path)
        self.options = options
        self._host_rows = host_rows
        if not self.path.is_file():
            raise BackboneError(f"{self.path}: no such GGUF file; fix the gguf path in models.toml "
                                "(relative paths start at the models.toml folder)")
        lc.llama_backend_init()
        llama_log.install(options.verbose)
        mparams = lc.llama_model_default_params()
        if not isinstance(options.n_gpu_layers, int):
            raise ValueError(f"n_gpu_layers must be resolved to a number before loading, got {options.n_gpu_layers!r}")
        mparams.n_gpu_layers = options.n_gpu_layers
        # llama.cpp's extra CPU buffer types (AMX tiles, repacked Q4/Q8 weights) crash llama_decode with a
        # segmentation fault on AMX Xeons for the quantized test backbones; plain CPU buffers are safe.
        mparams.use_extra_bufts = options.cpu_repack
        self._overrides = cpu_experts(options.n_cpu_moe)  # its arrays must outlive the load
        if self._overrides is not None:
            self._overrides.apply(mparams)
        self._configure_model(mparams)
        self._model = lc.llama_model_load_from_file(str(self.path).encode(), mparams)
        if not self._model:
            raise BackboneError(f"{self.path}: llama.cpp could not load this GGUF (run `clef-bridge check "
                                f"{self.path}` to see why)")
        cache = options.prefix_cache if options.prefix_cache and options.prefix_cache.max_mb > 0 else None
        cparams = lc.llama_context_default_params()
        # With the prefix cache the context holds more KV cells (and sequences) than one decode uses.
        cparams.n_ctx = options.n_ctx + (cache.extra_cells if cache else 0)
        cparams.n_batch = options.n_ctx
        cparams.n_ubatch = min(options.n_ubatch, options.n_ctx)
        cparams.n_seq_max = options.n_seq_max + (cache.sequences if cache else 0)
        # No token is an output (see _Batch.fill_chunks): without this, llama.cpp reserves logits for
        # n_ubatch outputs (n_ubatch x n_vocab floats: 500 MB of compute buffer for Clef-flash).
        cparams.n_outputs_max = cparams.n_seq_max  # llama.cpp reserves at least one output per sequence id
        cparams.embeddings = False  # True would force every token to be an output (see the class docstring)
        cparams.pooling_type = lc.LLAMA_POOLING_TYPE_NONE
        flash = options.flash_attn
        if flash is None:
            flash = bool(lc.llama_supports_gpu_offload()) and options.n_gpu_layers != 0
        cparams.flash_attn_type = lc.LLAMA_FLASH_ATTN_TYPE_AUTO if flash else lc.LLAMA_FLASH_ATTN_TYPE_DISABLED
        cparams.kv_unified = True  # sequences share the n_ctx budget instead of n_ctx / n_seq_max each
        cparams.op_offload = options.op_offload
        threads = options.n_threads or os.cpu_count() or 1
        cparams.n_threads = cparams.n_threads_batch = threads
        if options.kv_type not in GGML_KV_TYPES:
            raise ValueError(f"kv_type {options.kv_type!r}: use one of {', '.join(GGML_KV_TYPES)}")
        cparams.type_k = cparams.type_v = getattr(lc, GGML_KV_TYPES[options.kv_type])
        self._configure_context(cparams)
        self._ctx = lc.llama_init_from_model(self._model, cparams)
        if not self._ctx:
            lc.llama_model_free(self._model)
            self._model = None
            raise BackboneError(f"{self.path}: llama.cpp could not create a context with n_ctx={options.n_ctx} "
                                "(out of memory? lower n_ctx or n_gpu_layers in models.toml)")
        self._start_context()
        self._vocab = lc.llama_model_get_vocab(self._model)
        self._memory = lc.llama_get_memory(self._ctx)
        self.n_embd = lc.llama_model_n_embd(self._model)
        self.n_embd_inp = lc.llama_model_n_embd_inp(self._model)  # input embeddings' width (deepstack: wider)
        self.n_vocab = lc.llama_vocab_n_tokens(self._vocab)
        self.architecture = _meta_str(self._model, "general.architecture") or ""
        # the decode budget: the tokens one prefill takes, all sequences together (within n_ctx)
        self.decode_budget = min(options.n_ctx, self._max_decode())
        self._batch = _Batch(lc.llama_n_batch(self._ctx))
        self._tokenizer = Tokenizer(self._vocab, unicode_normalization(self._model))
        self.prefix_cache = PrefixCache(self, cache, options.n_seq_max, lc.llama_n_ctx(self._ctx)) if cache else None

    # Hooks for a backbone that reads its hidden states another way (bridge/llama/omni.py).

    def _configure_model(self, mparams) -> None:
        """Change the model's load parameters (kv overrides) before it loads."""

    def _configure_context(self, cparams) -> None:
        """Change the context's parameters before it is made: here the defaults suit Qwen3.5."""

    def _start_context(self) -> None:
        # the final-norm rows of every token, while only each sequence's last token is an output
        lc_ext.llama_set_embeddings_nextn(self._ctx, True, False)

    def _max_decode(self) -> int:
        """The most tokens one prefill may hold: the nextn buffer's n_batch rows."""
        return lc.llama_n_batch(self._ctx)

    def close(self) -> None:
        self.prefix_cache = None
        if getattr(self, "_ctx", None):
            lc.llama_free(self._ctx)
            self._ctx = None
        if getattr(self, "_model", None):
            lc.llama_model_free(self._model)
            self._model = None

    def __enter__(self) -> "Backbone":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __del__(self) -> None:
        self.close()

    @property
    def on_gpu(self) -> bool:
        """True when llama.cpp offloads layers to a GPU (the head then overlaps prefills; the projector runs there)."""
        return self.options.n_gpu_layers != 0 and bool(lc.llama_supports_gpu_offload())

    @property
    def batch_budget(self) -> int:
        """The most tokens the worker packs into one batch of requests (a longer request still decodes alone).

        On a GPU the whole decode budget. On the CPU one ubatch (n_ubatch): past it llama.cpp's matmuls are
        compute-bound, so batching saves no weight reads, while the unified KV cache makes every ubatch attend
        over every sequence's cells. Measured on the benchmark model (1 thread, CPU time per request, batches
        of 1 / 2 / 4 / 8): 32 tokens 102 / 85 / 80 / 78 ms; 256 tokens 612 / 589 / 610 / 646 ms; 751 tokens
        1808 / 1749 / 1849 / 2018 ms (docs/llama-cpp.md).
        """
        return self.decode_budget if self.on_gpu else min(self.decode_budget, lc.llama_n_ubatch(self._ctx))

    @property
    def llama_model(self):
        """The llama_model pointer, for llama.cpp's multimodal projector (mtmd_init_from_file)."""
        return self._model

    @property
    def llama_context(self):
        """The llama_context pointer, for its LoRA adapter set (bridge/llama/adapters.py)."""
        return self._ctx

    @property
    def vocab(self):
        return self._vocab

    @property
    def tokenizer(self) -> Tokenizer:
        return self._tokenizer

    def tokenize(self, text: str, parse_special: bool) -> list[int]:
        """llama.cpp's tokenization of one piece, with no BOS/EOS added."""
        return self._tokenizer.tokenize(text, parse_special)

    def min_tokens(self, text: str) -> int:
        """A lower bound on the tokens of text, from its size (see Tokenizer.min_tokens)."""
        return self._tokenizer.min_tokens(text)

    def prefill(self, token_ids: np.ndarray) -> np.ndarray:
        """float32 [n_tokens, n_embd] last-layer hidden states (after the final norm)."""
        return self.prefill_many([token_ids])[0]

    def prefill_many(self, sequences: list[np.ndarray]) -> list[np.ndarray]:
        """Several sequences in ONE llama_decode, each in its own sequence id; one array per sequence."""
        self._check_batch(sequences)
        if self.prefix_cache is not None:  # decode everything, leaving the cached prefixes in memory
            return [r.hidden for r in self.prefix_cache.prefill([PrefillRequest(s) for s in sequences], reuse=False)]
        # Each decode starts from empty memory: KV cells and the recurrent state slots alike.
        lc.llama_memory_clear(self._memory, True)
        try:
            hidden = self.decode_chunks([(i, 0, np.asarray(s, dtype=np.int32)) for i, s in enumerate(sequences)])
        finally:
            lc.llama_memory_clear(self._memory, True)
        return np.split(hidden, np.cumsum([len(s) for s in sequences])[:-1])

    def prefill_cached(self, requests: list[PrefillRequest]) -> list[CachedPrefill]:
        """Like prefill_many, from each request's longest cached prefix on (see bridge/llama/prefix_cache.py).

        Without a prefix cache every request is a miss: the hidden states of all its tokens.
        """
        self._check_batch([r.tokens for r in requests])
        if self.prefix_cache is None:
            hidden = self.prefill_many([r.tokens for r in requests])
            return [CachedPrefill(h, 0, (), (), 0) for h in hidden]
        return self.prefix_cache.prefill(requests)

    def _check_batch(self, sequences: list[np.ndarray]) -> None:
        if not sequences or len(sequences) > self.options.n_seq_max:
            raise ValueError(f"prefill takes 1 to {self.options.n_seq_max} sequences, got {len(sequences)}")
        lengths = [len(s) for s in sequences]
        if min(lengths) == 0 or sum(lengths) > self.decode_budget:
            raise ValueError(f"sequences of {lengths} tokens do not fit a batch of {self.decode_budget}")

    # Sequence-level memory operations (the prefix cache's SequenceMemory). Sequence ids below
    # options.n_seq_max are the decode's own; the prefix cache keeps its cells in the ids above.

    def decode_chunks(self, chunks: list[tuple[int, int, np.ndarray]]) -> np.ndarray:
        """One llama_decode of (sequence id, first position, token ids) chunks: float32 [n, n_embd] rows."""
        n = self._batch.fill_chunks(chunks)
        status = lc.llama_decode(self._ctx, self._batch.struct)
        if status != 0:
            raise DecodeFailed(f"llama_decode failed with status {status} on {len(chunks)} sequence(s), {n} tokens")
        return self._read_rows(n)

    def _read_rows(self, n: int) -> np.ndarray:
        """The decode's n hidden-state rows, copied once out of llama.cpp's buffer: float32 [n, n_embd].

        llama.cpp copies them from the GPU asynchronously; waiting for that copy is explicit here
        (llama_get_embeddings_nextn waits too, which this does not rely on).
        """
        lc.llama_synchronize(self._ctx)
        rows = self._host_rows(n, self.n_embd)
        ctypes.memmove(rows.ctypes.data, lc_ext.llama_get_embeddings_nextn(self._ctx), rows.nbytes)
        return rows

    def save_state(self, seq: int) -> np.ndarray:
        """A host copy of the sequence's recurrent + convolution state (not its KV cells)."""
        size = lc.llama_state_seq_get_size_ext(self._ctx, seq, lc.LLAMA_STATE_SEQ_FLAGS_PARTIAL_ONLY)
        state = np.empty(size, dtype=np.uint8)
        n = lc.llama_state_seq_get_data_ext(self._ctx, state.ctypes.data_as(ctypes.POINTER(ctypes.c_uint8)), size,
                                            seq, lc.LLAMA_STATE_SEQ_FLAGS_PARTIAL_ONLY)
        if n != size:
            raise DecodeFailed(f"llama.cpp saved {n} of the {size} bytes of sequence {seq}'s recurrent state")
        return state

    def restore_state(self, seq: int, state: np.ndarray) -> None:
        """Load a save_state() copy into the sequence (whose KV cells the caller has put in place)."""
        n = lc.llama_state_seq_set_data_ext(self._ctx, state.ctypes.data_as(ctypes.POINTER(ctypes.c_uint8)),
                                            state.nbytes, seq, lc.LLAMA_STATE_SEQ_FLAGS_PARTIAL_ONLY)
        if n != state.nbytes:
            raise DecodeFailed(f"llama.cpp could not restore a recurrent state of {state.nbytes} bytes into "
                               f"sequence {seq}")

    def copy_cells(self, src: int, dst: int, p0: int, p1: int) -> None:
        """Share src's KV cells at positions [p0, p1) with dst (metadata only: the KV cache is unified)."""
        lc.llama_memory_seq_cp(self._memory, src, dst, p0, p1)

    def drop_sequence(self, seq: int) -> None:
        lc.llama_memory_seq_rm(self._memory, seq, -1, -1)  # removing a whole sequence never fails

    def drop_all(self) -> None:
        lc.llama_memory_clear(self._memory, True)

    def decode_media(self, chunks: list[MediaChunk]) -> np.ndarray:
        """ONE sequence decoded chunk after chunk (token ids or input embeddings, at the chunks' own
        positions): float32 [sum of chunk lengths, n_embd] last-layer hidden states, every token's.

        It runs in sequence 0 alone, so a prefix cache's sequences stay as they are.
        """
        if not chunks or sum(len(c) for c in chunks) > self.decode_budget:
            raise ValueError(f"chunks of {[len(c) for c in chunks]} tokens do not fit a decode of {self.decode_budget}")
        self.drop_sequence(0)
        try:
            out = []
            for chunk in chunks:
                batch = MediaBatch(chunk)
                lc.llama_set_causal_attn(self._ctx, chunk.causal)
                status = lc.llama_decode(self._ctx, batch.struct)
                if status != 0:
                    raise DecodeFailed(f"llama_decode failed with status {status} on a chunk of {len(chunk)} "
                                       f"{'embeddings' if chunk.embd is not None else 'tokens'}")
                out.append(self._read_rows(len(chunk)))
            return np.concatenate(out)
        finally:
            lc.llama_set_causal_attn(self._ctx, True)
            self.drop_sequence(0)
