"""The random models gpu-check measures, written before it runs (gpu_check.sh writes them while
llama.cpp's CUDA kernels compile: nothing here imports llama.cpp).

- a backbone of Clef-flash's shape (hidden 4096, 32 layers, full attention in one layer of four,
  its 248,320-token vocabulary) in Q8_0 and in llama.cpp's Q4_K_M mix, with a head of the
  published shape, for latency, throughput and VRAM;
- a smaller backbone with F32 matrices, for the GPU-against-CPU comparison at a tight tolerance.

The tokenizer is Qwen's (llama.cpp's models/ggml-vocab-qwen35.gguf, in its source tree), so the
router request has the length it has with a real model; --smoke keeps its first 4,096 tokens.
--smoke writes the same set at small shapes, for the tests on the CPU.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from clef_bridge.bridge.demo.builtins import Qwen35Dims, Vocab, random_head, write_qwen35_gguf
from clef_bridge.bridge.demo.weights import SPECIALS
from clef_bridge.head.config import CONFIG_NAME, HeadConfig
from clef_bridge.head.errors import Category, ClefError
from clef_bridge.head.weights import save_state_dict

from tests.randomhead import CLEF_FLASH_HEAD, SCALARS

VERSION = 1  # bump when what is written changes


@dataclass(frozen=True)
class Shape:
    name: str
    dims: Qwen35Dims  # the served backbones (Q8_0, Q4_K_M)
    n_vocab: int
    head: HeadConfig
    compare: Qwen35Dims  # the F32 backbone compared GPU against CPU
    vocab_keep: int  # tokens of Qwen's vocabulary kept (0: all)
    router_tokens: int  # length of the timed router request (4 questions, 19 options)
    compare_tokens: int
    requests: tuple[int, ...]  # requests per concurrency level 1, 4, 16
    workload_levels: tuple[int, ...]  # the workloads step's concurrency levels
    workload_requests: int  # its distinct requests per workload and level (3 levels of 48 fit the router's 150)


FULL = Shape("clef-flash", Qwen35Dims(hidden=4096, layers=32, ff=12288, heads=16, kv_heads=4, head_dim=256,
                                      linear_k_heads=16, linear_v_heads=32, linear_k_dim=128, linear_v_dim=128,
                                      context=262144),
             248320, CLEF_FLASH_HEAD,
             Qwen35Dims(hidden=1024, layers=8, ff=3072, heads=8, kv_heads=2, head_dim=128, linear_k_heads=4,
                        linear_v_heads=8, linear_k_dim=128, linear_v_dim=128),
             0, 750, 256, (20, 40, 80), (1, 8, 32), 48)
# every matrix's row a multiple of 256, as Q4_K's blocks need
SMALL = Qwen35Dims(hidden=256, layers=4, ff=512, heads=4, kv_heads=2, head_dim=64, linear_k_heads=2, linear_v_heads=4,
                   linear_k_dim=64, linear_v_dim=64)
SMOKE = Shape("smoke", SMALL, 1024, HeadConfig(hidden_size=256, width=64, routing_layers=1, layers=1, heads=4,
                                                feedforward=128),
              SMALL, 4096, 0, 160, (2, 4, 16), (1, 2), 2)
SERVED = ("Q8_0", "Q4_K_M")


class VocabMissing(ClefError):
    category = Category.USAGE
    error_type = "vocab_missing"


def qwen_vocab(path: Path, keep: int = 0) -> Vocab:
    """Tokens, types and merges of a llama.cpp vocab GGUF, with the prompt's special tokens added where
    missing; keep > 0: the first `keep` tokens and the merges that make them."""
    from gguf import GGUFReader

    if not Path(path).is_file():
        raise VocabMissing(f"{path}: no such vocab GGUF", fix="pass --vocab with llama.cpp's "
                           "models/ggml-vocab-qwen35.gguf (in the llama-cpp-python source, vendor/llama.cpp)")
    fields = GGUFReader(path).fields
    strings = lambda key: [bytes(fields[key].parts[i]).decode() for i in fields[key].data]  # noqa: E731
    tokens, merges = strings("tokenizer.ggml.tokens"), strings("tokenizer.ggml.merges")
    types = [int(fields["tokenizer.ggml.token_type"].parts[i][0]) for i in fields["tokenizer.ggml.token_type"].data]
    if keep:
        tokens, types = tokens[:keep], types[:keep]
        kept = set(tokens)
        merges = [m for m in merges if m.replace(" ", "", 1) in kept]
    present = set(tokens)
    for text, kind in SPECIALS:
        if text not in present:
            tokens.append(text)
            types.append(kind)
    return tokens, types, merges


@dataclass(frozen=True)
class GpuModels:
    """The files gpu-check runs on."""

    folder: Path
    shape: Shape
    ggufs: dict[str, Path]  # "compare-F32", "Q8_0", "Q4_K_M"
    head: Path  # joint_head.safetensors of the served models, its config beside it
    bytes: int
    seconds: float  # 0 when they were there already

    ok = True

    def to_dict(self) -> dict[str, Any]:
        return {"folder": str(self.folder), "shape": self.shape.name, "head": str(self.head), "bytes": self.bytes,
                "ggufs": {k: str(v) for k, v in self.ggufs.items()}, "seconds": round(self.seconds, 1)}


def prepare(folder: Path, smoke: bool, vocab: Path) -> GpuModels:
    """Write the models once (a stamp records what was written); later calls only name them."""
    shape = SMOKE if smoke else FULL
    folder = Path(folder).resolve() / shape.name
    folder.mkdir(parents=True, exist_ok=True)
    ggufs = {"compare-F32": folder / "compare-f32.gguf", **{q: folder / f"backbone-{q.lower()}.gguf" for q in SERVED}}
    head = folder / "joint_head.safetensors"
    stamp = folder / "models.json"
    size = Path(vocab).stat().st_size if Path(vocab).is_file() else 0
    wanted = {"version": VERSION, "shape": shape.name, "vocab": Path(vocab).name, "vocab_bytes": size}
    t0 = time.perf_counter()
    written = not (stamp.is_file() and json.loads(stamp.read_text()) == wanted)
    if written:
        stamp.unlink(missing_ok=True)
        tokens = qwen_vocab(vocab, shape.vocab_keep)
        write_qwen35_gguf(ggufs["compare-F32"], shape.compare, seed=1, name="gpu-check compare", matrices="F32",
                          vocab=tokens)
        for quant in SERVED:
            write_qwen35_gguf(ggufs[quant], shape.dims, seed=2, name=f"gpu-check {quant}", matrices=quant,
                              n_vocab=shape.n_vocab, vocab=tokens)
        save_state_dict(head, random_head(shape.head, seed=3, scalars=SCALARS), "BF16")  # as Cloudflare ships it
        (folder / CONFIG_NAME).write_text(json.dumps(vars(shape.head)))
        stamp.write_text(json.dumps(wanted))
    seconds = time.perf_counter() - t0 if written else 0.0
    return GpuModels(folder, shape, ggufs, head, sum(p.stat().st_size for p in ggufs.values()), seconds)
