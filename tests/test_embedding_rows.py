"""Output-embedding rows read from the GGUF equal llama.cpp's own dequantization of those rows."""

from __future__ import annotations

import numpy as np
import pytest
from clef_bridge.bridge.llama.embedding import OutputEmbedding
from gguf import GGMLQuantizationType as Q
from gguf import GGUFWriter

from . import ggml_oracle

pytestmark = pytest.mark.integration  # its oracle, llama.cpp's own quantizer (tests/ggml_oracle.py), needs the library

N_VOCAB, N_EMBD = 300, 512  # K-quants need rows that are a multiple of 256 wide


def _write(path, name, qtype, weights):
    writer = GGUFWriter(str(path), "qwen35")
    if qtype in (Q.F32, Q.F16):
        data = weights.astype(np.float32 if qtype == Q.F32 else np.float16)
        writer.add_tensor(name, data)
    else:
        writer.add_tensor(name, ggml_oracle.quantize(qtype, weights), raw_dtype=qtype)  # byte shape
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


@pytest.mark.parametrize("qtype", [Q.F32, Q.F16, Q.BF16, Q.Q8_0, Q.Q6_K, Q.Q5_K, Q.Q4_K], ids=lambda q: q.name)
def test_rows_equal_ggml_dequantization(tmp_path, qtype):
    rng = np.random.default_rng(int(qtype))
    weights = rng.standard_normal((N_VOCAB, N_EMBD), dtype=np.float32)
    path = tmp_path / "m.gguf"
    _write(path, "output.weight", qtype, weights)
    emb = OutputEmbedding(path)
    assert (emb.n_vocab, emb.n_embd, emb.tensor_name) == (N_VOCAB, N_EMBD, "output.weight")

    ids = np.array([5, 299, 0, 5, 17, 123, 17])
    got = emb.rows(ids)
    if qtype in (Q.F32, Q.F16):
        want = weights[ids].astype(np.float16 if qtype == Q.F16 else np.float32).astype(np.float32)
    else:
        want = ggml_oracle.dequantize(qtype, ggml_oracle.quantize(qtype, weights)[ids], N_EMBD)
    assert got.shape == (len(ids), N_EMBD) and got.dtype == np.float32
    np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6)
    # quantization really happened and really is close to the source
    assert np.abs(got - weights[ids]).max() < 0.5
    # cached rows come back identical, and only the new ids are dequantized
    assert np.array_equal(emb.rows(ids[::-1]), got[::-1])
    assert emb._used == len(set(ids.tolist()))


def test_tied_embedding_and_full_cache(tmp_path):
    rng = np.random.default_rng(1)
    weights = rng.standard_normal((N_VOCAB, N_EMBD), dtype=np.float32)
    path = tmp_path / "tied.gguf"
    _write(path, "token_embd.weight", Q.Q8_0, weights)
    emb = OutputEmbedding(path, max_rows=4)
    assert emb.tensor_name == "token_embd.weight"
    ids = np.arange(10)
    want = ggml_oracle.dequantize(Q.Q8_0, ggml_oracle.quantize(Q.Q8_0, weights)[ids], N_EMBD)
    np.testing.assert_allclose(emb.rows(ids), want, rtol=1e-6, atol=1e-6)  # more than the cache holds
    np.testing.assert_allclose(emb.rows(ids[:3]), want[:3], rtol=1e-6, atol=1e-6)
    assert emb._used <= 4
    with pytest.raises(ValueError, match="token ids"):
        emb.rows(np.array([N_VOCAB]))
