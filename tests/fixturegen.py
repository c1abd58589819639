"""Test fixtures, built deterministically into .fixtures/ and reused when present.

- the llama-cpp-python sdist (its convert_hf_to_gguf.py, gguf-py and the real Qwen3.5 vocab);
- a Qwen3.5 tokenizer.json built with `tokenizers` from that vocab and the qwen35 pre-tokenizer;
- a tiny random Qwen3.5 (transformers, float32) with that tokenizer, converted to F32, F16 and
  Q8_0 GGUFs through llama.cpp's own converter and quantizer;
- a tiny random joint head (bf16 safetensors + joint_head_config.json).

Run `python -m tests.fixturegen` to build them by hand; the tests build them on first use.
"""

from __future__ import annotations

import fcntl
import glob
import json
import os
import subprocess
import sys
import tarfile
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
FIXTURES = Path(os.environ.get("CLEF_BRIDGE_FIXTURES", ROOT / ".fixtures"))
LLAMA_CPP_PYTHON = "llama-cpp-python==0.3.36"
SDIST_NAME = "llama_cpp_python-0.3.36"
VENDOR = f"{SDIST_NAME}/vendor/llama.cpp"
SEED = 1234

# llama.cpp's LLAMA_VOCAB_PRE_TYPE_QWEN35 regex (src/llama-vocab.cpp), the tokenizer.json form
QWEN35_SPLIT = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}| ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*"
                r"|\s*[\r\n]+|\s+(?!\S)|\s+")
# Slots the vocab-only GGUF leaves as [PADn] hold these in Qwen3 and Qwen3.5 releases.
ADDED = {151652: ("<|vision_start|>", True), 151653: ("<|vision_end|>", True), 151654: ("<|vision_pad|>", True),
         151655: ("<|image_pad|>", True), 151656: ("<|video_pad|>", True), 151667: ("<think>", False),
         151668: ("</think>", False)}
TINY_HEAD = {"hidden_size": 64, "width": 32, "routing_layers": 1, "layers": 1, "heads": 2, "feedforward": 64}


@dataclass(frozen=True)
class Fixtures:
    root: Path
    vocab_gguf: Path  # the real Qwen3.5 vocab (vocab only)
    vocab_inp: Path
    vocab_out: Path
    tokenizer_dir: Path  # tokenizer.json built from the vocab
    hf_model: Path  # tiny random Qwen3.5, transformers format
    gguf_f32: Path
    gguf_f16: Path
    gguf_q8_0: Path
    gguf_q4_k_m: Path
    gguf_other: Path  # another random backbone of identical shape (seed + 1)
    gguf_finetune: Path  # a plausible fine-tune of the tiny backbone: same embeddings, lm_head, final norm
    head: Path  # joint_head.safetensors, with joint_head_config.json beside it


@contextmanager
def _lock(root: Path):
    root.mkdir(parents=True, exist_ok=True)
    with open(root / ".lock", "w") as f:
        fcntl.flock(f, fcntl.LOCK_EX)  # pytest-xdist workers or two shells must not build twice
        yield


def _log(msg: str) -> None:
    print(f"[fixtures] {msg}", file=sys.stderr, flush=True)


def sdist(root: Path) -> Path:
    """The extracted parts of the llama-cpp-python sdist that the fixtures need."""
    out = root / "sdist"
    marker = out / VENDOR / "models" / "ggml-vocab-qwen35.gguf"
    if marker.exists():
        return out / VENDOR
    archives = glob.glob(str(out / f"{SDIST_NAME}.tar.gz"))
    if not archives:
        _log(f"downloading the {LLAMA_CPP_PYTHON} sdist (convert_hf_to_gguf.py, the Qwen3.5 vocab)")
        subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary", ":all:",
                        "-d", str(out), LLAMA_CPP_PYTHON], check=True)
        archives = glob.glob(str(out / f"{SDIST_NAME}.tar.gz"))
    wanted = (f"{VENDOR}/convert_hf_to_gguf.py", f"{VENDOR}/conversion/", f"{VENDOR}/gguf-py/",
              f"{VENDOR}/models/ggml-vocab-qwen35.gguf")
    with tarfile.open(archives[0]) as tar:
        members = [m for m in tar.getmembers() if m.name.startswith(wanted)]
        tar.extractall(out, members=members, filter="data")
    return out / VENDOR


def _vocab(vocab_gguf: Path) -> tuple[list[str], list[int], list[str]]:
    from gguf import GGUFReader

    reader = GGUFReader(vocab_gguf)
    field = lambda name: reader.fields[name]  # noqa: E731
    tokens = [bytes(field("tokenizer.ggml.tokens").parts[i]).decode() for i in field("tokenizer.ggml.tokens").data]
    types = [int(field("tokenizer.ggml.token_type").parts[i][0]) for i in field("tokenizer.ggml.token_type").data]
    merges = [bytes(field("tokenizer.ggml.merges").parts[i]).decode() for i in field("tokenizer.ggml.merges").data]
    return tokens, types, merges


def qwen35_tokenizer(vocab_gguf: Path, added: dict[int, tuple[str, bool]], nfc: bool = True,
                     split: str = QWEN35_SPLIT):
    """A `tokenizers` byte-level BPE over the vocab's tokens and merges with the qwen35 pre-tokenizer.

    added: extra added tokens by id (text, special), placed in slots the vocab leaves as [PADn].
    nfc: normalize to NFC first, as transformers' Qwen3_5Tokenizer (the release's tokenizer class) does.
    split: the pre-tokenizer's regex (llama.cpp's qwen35 one; Qwen2/Qwen3 vocabularies use QWEN2's).
    """
    from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers

    tokens, types, merges = _vocab(vocab_gguf)
    for i, (text, _) in added.items():
        tokens[i], types[i] = text, 4
    normal = {t: i for i, (t, ty) in enumerate(zip(tokens, types)) if ty == 1}
    tok = Tokenizer(models.BPE(vocab=normal, merges=[tuple(m.split(" ", 1)) for m in merges],
                               ignore_merges=False, fuse_unk=False, byte_fallback=False))
    if nfc:
        tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(split), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=False, use_regex=False),
    ])
    tok.decoder = decoders.ByteLevel()
    specials = {i: (tokens[i], True) for i, ty in enumerate(types) if ty == 3} | added
    raw = json.loads(tok.to_str())
    raw["added_tokens"] = [  # explicit ids, as in a release's tokenizer.json
        {"id": i, "content": text, "single_word": False, "lstrip": False, "rstrip": False, "normalized": False,
         "special": special} for i, (text, special) in sorted(specials.items())]
    return Tokenizer.from_str(json.dumps(raw))


def _tokenizer_is_current(model_dir: Path) -> bool:
    """False for a tokenizer.json built before the fixtures' tokenizer NFC-normalized (rebuild it)."""
    path = model_dir / "tokenizer.json"
    return path.exists() and json.loads(path.read_text(encoding="utf-8")).get("normalizer") is not None


def build_tokenizer(vocab_gguf: Path, out_dir: Path) -> None:
    """tokenizer.json for the tiny model: the vocab plus the Qwen3.5 vision and thinking tokens."""
    from transformers import PreTrainedTokenizerFast

    tok = qwen35_tokenizer(vocab_gguf, ADDED)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok, eos_token="<|im_end|>", pad_token="<|endoftext|>",
        extra_special_tokens={"image_token": "<|image_pad|>", "video_token": "<|video_pad|>",
                              "vision_bos_token": "<|vision_start|>", "vision_eos_token": "<|vision_end|>"},
    )
    fast.save_pretrained(out_dir)


# A Qwen3.5-shaped backbone of realistic width for benchmarks: hidden 1024, 8 layers, one
# full-attention layer in four, GQA 8/2 heads of 128, Gated DeltaNet 4/8 heads of 128.
BENCH_TEXT = dict(hidden_size=1024, intermediate_size=3072, num_hidden_layers=8,
                  layer_types=["linear_attention"] * 3 + ["full_attention"] + ["linear_attention"] * 3
                  + ["full_attention"], num_attention_heads=8, num_key_value_heads=2, head_dim=128,
                  linear_key_head_dim=128, linear_value_head_dim=128, linear_num_key_heads=4,
                  linear_num_value_heads=8)
BENCH_HEAD = {"hidden_size": 1024, "width": 1024, "routing_layers": 2, "layers": 4, "heads": 16, "feedforward": 4096}


def build_tiny_model(tokenizer_dir: Path, out_dir: Path, vocab_size: int, text: dict | None = None,
                     mrope: list[int] = (1, 1, 0), seed: int = SEED) -> None:
    """A random Qwen3.5 in float32, in the transformers format (tiny: 4 hybrid layers of width 64)."""
    import torch
    from clef_finetune.tiny import tiny_config
    from transformers import AutoTokenizer, Qwen3_5ForConditionalGeneration

    tokenizer = AutoTokenizer.from_pretrained(tokenizer_dir)
    config = tiny_config(tokenizer, vocab_size=vocab_size)
    for key, value in (text or {}).items():
        setattr(config.text_config, key, value)
    # llama.cpp needs the mrope sections to sum to half the rotary width (head_dim x 0.25 / 2)
    config.text_config.rope_parameters = dict(config.text_config.rope_parameters or {}, mrope_section=list(mrope),
                                              mrope_interleaved=True)
    torch.manual_seed(seed)
    model = Qwen3_5ForConditionalGeneration(config).to(torch.float32).eval()
    with torch.no_grad():  # default init leaves norms at one; vary them so the test sees the weights
        for name, p in model.named_parameters():
            if "norm" in name and p.dim() == 1:
                p.add_(0.1 * torch.randn_like(p))
    model.save_pretrained(out_dir)
    tokenizer.save_pretrained(out_dir)


CONVERT = """
import runpy, sys
sys.path[:0] = [{vendor!r}, {gguf_py!r}]
from conversion import base
# The chktxt hash of a home-made tokenizer can match Qwen1.5's first; a Clef GGUF says qwen35.
base.TextModel.get_vocab_base_pre = lambda self, tokenizer: "qwen35"
sys.argv = {argv!r}
runpy.run_path({script!r}, run_name="__main__")
"""


def convert(vendor: Path, hf_dir: Path, out: Path, outtype: str, extra: tuple[str, ...] = ()) -> None:
    """extra: converter flags in place of --no-mtp (["--mmproj"] writes the vision projector instead)."""
    script = vendor / "convert_hf_to_gguf.py"
    argv = [str(script), str(hf_dir), "--outfile", str(out), "--outtype", outtype, *(extra or ["--no-mtp"])]
    code = CONVERT.format(vendor=str(vendor), gguf_py=str(vendor / "gguf-py"), argv=argv, script=str(script))
    subprocess.run([sys.executable, "-c", code], check=True, cwd=vendor, stdout=subprocess.DEVNULL,
                   stderr=subprocess.DEVNULL)


def quantize(src: Path, out: Path, ftype: str) -> None:
    import llama_cpp as lc
    from clef_bridge.bridge.llama import log as llama_log

    llama_log.install(verbose=False)
    params = lc.llama_model_quantize_default_params()
    params.ftype = getattr(lc, f"LLAMA_FTYPE_MOSTLY_{ftype}")
    params.nthread = os.cpu_count() or 1
    status = lc.llama_model_quantize(str(src).encode(), str(out).encode(), params)
    if status != 0:
        raise RuntimeError(f"llama_model_quantize({src} -> {ftype}) failed with {status}")


def build_head(out: Path, config: dict, seed: int) -> None:
    from clef_bridge.head.config import HeadConfig
    from clef_bridge.head.weights import save_state_dict

    from .randomhead import random_state_dict

    out.parent.mkdir(parents=True, exist_ok=True)
    save_state_dict(out, random_state_dict(HeadConfig(**config), seed), "BF16")
    (out.parent / "joint_head_config.json").write_text(json.dumps(config, indent=2))


def build(root: Path = FIXTURES) -> Fixtures:
    with _lock(root):
        vendor = sdist(root)
        vocab = vendor / "models" / "ggml-vocab-qwen35.gguf"
        fx = Fixtures(
            root=root, vocab_gguf=vocab, vocab_inp=vocab.with_suffix(".gguf.inp"),
            vocab_out=vocab.with_suffix(".gguf.out"), tokenizer_dir=root / "tokenizer", hf_model=root / "tiny-hf",
            gguf_f32=root / "tiny-f32.gguf", gguf_f16=root / "tiny-f16.gguf", gguf_q8_0=root / "tiny-q8_0.gguf",
            gguf_q4_k_m=root / "tiny-q4_k_m.gguf", gguf_other=root / "tiny-other-f32.gguf",
            gguf_finetune=root / "tiny-finetune-f32.gguf",
            head=root / "tiny-head" / "joint_head.safetensors",
        )
        if not _tokenizer_is_current(fx.tokenizer_dir):
            _log("building tokenizer.json from the Qwen3.5 vocab")
            build_tokenizer(vocab, fx.tokenizer_dir)
        for model_dir in (fx.hf_model, root / "tiny-other-hf", root / "bench-hf"):
            if (model_dir / "config.json").exists() and not _tokenizer_is_current(model_dir):
                build_tokenizer(vocab, model_dir)  # the weights and GGUFs do not depend on the normalizer
        if not (fx.hf_model / "config.json").exists():
            _log("building the tiny random Qwen3.5")
            build_tiny_model(fx.tokenizer_dir, fx.hf_model, vocab_size=151936)
        for path, outtype in ((fx.gguf_f32, "f32"), (fx.gguf_f16, "f16")):
            if not path.exists():
                _log(f"converting to {path.name}")
                convert(vendor, fx.hf_model, path.with_suffix(".tmp"), outtype)
                path.with_suffix(".tmp").rename(path)
        for path, ftype in ((fx.gguf_q8_0, "Q8_0"), (fx.gguf_q4_k_m, "Q4_K_M")):
            if not path.exists():
                _log(f"quantizing to {path.name}")
                quantize(fx.gguf_f32, path.with_suffix(".tmp"), ftype)
                path.with_suffix(".tmp").rename(path)
        if not fx.gguf_other.exists():
            _log(f"building {fx.gguf_other.name}")
            other = root / "tiny-other-hf"
            build_tiny_model(fx.tokenizer_dir, other, vocab_size=151936, seed=SEED + 1)
            convert(vendor, other, fx.gguf_other.with_suffix(".tmp"), "f32")
            fx.gguf_other.with_suffix(".tmp").rename(fx.gguf_other)
        if not fx.gguf_finetune.exists():
            _log(f"building {fx.gguf_finetune.name}")
            tuned = root / "tiny-finetune-hf"
            fine_tune(fx.hf_model, tuned, FINETUNE_NOISE, seed=SEED + 2)
            convert(vendor, tuned, fx.gguf_finetune.with_suffix(".tmp"), "f32")
            fx.gguf_finetune.with_suffix(".tmp").rename(fx.gguf_finetune)
        if not fx.head.exists():
            build_head(fx.head, TINY_HEAD, SEED)
        return fx


FINETUNE_NOISE = 0.25  # relative change of every inner-layer weight


def fine_tune(src: Path, out: Path, noise: float, seed: int) -> None:
    """A same-family model with changed inner layers: what a fine-tune (full or merged LoRA) looks like to us.

    The token embeddings, lm_head and final norm stay bit-identical, so the fingerprint of output
    rows cannot tell it from its base; only the canaries can.
    """
    import torch
    from transformers import AutoTokenizer, Qwen3_5ForConditionalGeneration

    model = Qwen3_5ForConditionalGeneration.from_pretrained(src, dtype=torch.float32).eval()
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if ".layers." in name and "visual" not in name:
                p.add_(noise * p.abs().mean() * torch.randn(p.shape, generator=generator))
    model.save_pretrained(out)
    AutoTokenizer.from_pretrained(src).save_pretrained(out)


@dataclass(frozen=True)
class BenchFixtures:
    hf_model: Path
    gguf: Path
    head: Path

    def quantized(self, ftype: str) -> Path:
        path = self.gguf.with_name(f"bench-{ftype.lower()}.gguf")
        if not path.exists():
            quantize(self.gguf, path.with_suffix(".tmp"), ftype)
            path.with_suffix(".tmp").rename(path)
        return path


def build_bench(root: Path = FIXTURES) -> BenchFixtures:
    """The benchmark backbone (F32 GGUF, ~1.7 GB) and a Clef-width head; built only when asked for."""
    fx = build(root)
    with _lock(root):
        out = BenchFixtures(root / "bench-hf", root / "bench-f32.gguf", root / "bench-head" / "joint_head.safetensors")
        if not (out.hf_model / "config.json").exists():
            _log("building the benchmark Qwen3.5 (hidden 1024, 8 layers)")
            build_tiny_model(fx.tokenizer_dir, out.hf_model, vocab_size=151936, text=BENCH_TEXT, mrope=(6, 5, 5))
        if not out.gguf.exists():
            _log(f"converting to {out.gguf.name}")
            convert(sdist(root), out.hf_model, out.gguf.with_suffix(".tmp"), "f32")
            out.gguf.with_suffix(".tmp").rename(out.gguf)
        if not out.head.exists():
            build_head(out.head, BENCH_HEAD, SEED)
        return out


if __name__ == "__main__":
    print(build_bench() if "--bench" in sys.argv else build())
