"""bridge/llama/media_batch.py: the llama_batch a chunk of token ids or input embeddings becomes, read back
through its ctypes pointers as llama_decode reads it."""

from __future__ import annotations

import numpy as np
import pytest
from clef_bridge.bridge.llama.media_batch import MediaBatch, MediaChunk

pytestmark = pytest.mark.integration  # fills llama-cpp-python's llama_batch struct: needs its library


def read(pointer, n: int) -> list:
    return [pointer[i] for i in range(n)]


def test_a_token_chunk_is_one_sequence_with_no_output():
    chunk = MediaChunk(pos=np.arange(7, 12, dtype=np.int64), tokens=np.array([5, 6, 7, 8, 9], dtype=np.int64))
    batch = MediaBatch(chunk)
    s = batch.struct
    assert len(chunk) == 5 and s.n_tokens == 5
    assert read(s.token, 5) == [5, 6, 7, 8, 9] and read(s.pos, 5) == [7, 8, 9, 10, 11]
    assert not s.embd  # NULL: llama_decode reads tokens
    assert read(s.n_seq_id, 5) == [1] * 5 and [s.seq_id[i][0] for i in range(5)] == [0] * 5
    assert read(s.logits, 5) == [0] * 5  # the hidden states are the nextn rows: an output would only run lm_head


def test_all_outputs_marks_every_token():
    batch = MediaBatch(MediaChunk(pos=np.arange(3, dtype=np.int32), tokens=np.arange(3, dtype=np.int32)),
                       all_outputs=True)
    assert read(batch.struct.logits, 3) == [1, 1, 1]


def test_an_embedding_chunk_carries_its_rows_and_mrope_positions_section_major():
    rows = np.arange(4 * 3, dtype=np.float64).reshape(4, 3)  # 4 positions of width 3
    pos = np.arange(4 * 4, dtype=np.int32).reshape(4, 4)[:, ::-1]  # [sections, n], not contiguous
    batch = MediaBatch(MediaChunk(pos=pos, embd=rows))
    s = batch.struct
    assert s.n_tokens == 4 and not s.token
    assert read(s.embd, 12) == list(rows.ravel())
    assert read(s.pos, 16) == list(pos.ravel())  # section by section, as llama.cpp reads M-RoPE positions
    assert batch.embd.dtype == np.float32 and batch.pos.flags.c_contiguous
