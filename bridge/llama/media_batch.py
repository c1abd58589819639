"""llama_batch for one sequence's chunks of token ids or input embeddings (an image's), at explicit positions."""

from __future__ import annotations

import ctypes
from dataclasses import dataclass

import numpy as np

from .native import lc


@dataclass(frozen=True)
class MediaChunk:
    """Part of one sequence for Backbone.decode_media: token ids, or input embeddings (an image's)."""

    pos: np.ndarray  # int32: [n] for tokens; [n_pos_per_embd, n] (M-RoPE sections, section-major) for embd
    tokens: np.ndarray | None = None  # int32 [n]
    embd: np.ndarray | None = None  # float32 [n, n_embd_inp] (the backbone's input width: deepstack makes it wider)
    # False: ONE token that sees every cell of its sequence (llama_set_causal_attn off for its decode): the cells
    # hold exactly the tokens before it, which is the reference's token-order mask where llama.cpp's M-RoPE rule,
    # comparing positions, would hide some of them (bridge/llama/omni_positions.py rope_chunks)
    causal: bool = True

    def __post_init__(self):
        if not self.causal and self.pos.shape[-1] != 1:
            raise ValueError(f"a chunk decoded without the causal mask holds one token, not {self.pos.shape[-1]}: its "
                             "tokens would see each other's later cells")

    def __len__(self) -> int:
        return self.pos.shape[-1]


class MediaBatch:
    """A llama_batch over one chunk's numpy buffers (kept alive here while llama_decode reads them)."""

    def __init__(self, chunk: MediaChunk, all_outputs: bool = False):
        n = len(chunk)
        self.pos = np.ascontiguousarray(chunk.pos, dtype=np.int32)
        self.n_seq_id = np.ones(n, dtype=np.int32)
        self.seq = np.zeros(n, dtype=np.int32)
        self.seq_ptr = (self.seq.ctypes.data + 4 * np.arange(n, dtype=np.uint64)).astype(np.uint64)
        # no output: Qwen3.5's hidden states come from the unmasked nextn rows (an output would only run lm_head,
        # see backbone._Batch.fill_chunks); Qwen3-Omni's from the final norm of every token, each an output
        # (bridge/llama/omni.py)
        self.logits = np.full(n, int(all_outputs), dtype=np.int8)
        self.struct = lc.llama_batch()
        self.struct.n_tokens = n
        if chunk.embd is not None:
            self.embd = np.ascontiguousarray(chunk.embd, dtype=np.float32)
            self.struct.embd = self.embd.ctypes.data_as(ctypes.POINTER(ctypes.c_float))
        else:
            self.token = np.ascontiguousarray(chunk.tokens, dtype=np.int32)
            self.struct.token = self.token.ctypes.data_as(ctypes.POINTER(lc.llama_token))
        self.struct.pos = self.pos.ctypes.data_as(ctypes.POINTER(lc.llama_pos))
        self.struct.n_seq_id = self.n_seq_id.ctypes.data_as(ctypes.POINTER(ctypes.c_int32))
        self.struct.seq_id = self.seq_ptr.ctypes.data_as(ctypes.POINTER(ctypes.POINTER(lc.llama_seq_id)))
        self.struct.logits = self.logits.ctypes.data_as(ctypes.POINTER(ctypes.c_int8))
