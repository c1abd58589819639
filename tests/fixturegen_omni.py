"""The Clef-omni fixtures, built deterministically into .fixtures/ beside fixturegen's and reused when present.

- a tokenizer.json from the real Qwen2 vocab in the llama-cpp-python sdist (models/ggml-vocab-qwen2.gguf: the
  Qwen2/Qwen3 BPE that Qwen3-Omni uses, 151,936 slots) plus Qwen3-Omni's added tokens (vision, audio, think);
- a tiny random Qwen3-Omni (transformers' Qwen3OmniMoeForConditionalGeneration, enable_audio_output False: the
  thinker only): 3 MoE layers of width 64 (8 experts, 2 per token), head_dim 32 with interleaved M-RoPE sections
  [6, 5, 5], a 3-block vision tower with 2 deepstack levels, a 2-layer audio tower;
- llama.cpp's own converter: the `qwen3vlmoe` text GGUF (F32) exactly as a user gets it (n_deepstack_layers 0:
  the converter's Omni text class writes 0) and, with --mmproj, ONE projector with vision (qwen3vl_merger,
  deepstack) and audio (qwen3a). The converter's Omni mmproj class cannot map `thinker.visual.*` (it renames
  them to `model.visual.*` after its prefix filter ran): the fixture patches that in-process, nothing else;
- a tiny random joint head of the thinker's width (fixturegen.build_head).

The bridge, not the fixture, copes with the stock converter's output: a wrong deepstack count and a combined
vision + audio projector that mtmd refuses. Run `python -m tests.fixturegen_omni` by hand; the Omni tests build
it on first use (about 25 s of CPU after fixturegen's own build).
"""

from __future__ import annotations

import subprocess
import sys
import tarfile
from dataclasses import dataclass
from pathlib import Path

from . import fixturegen
from .fixturegen import FIXTURES, SEED, _lock, _log, build_head, sdist

# llama.cpp's LLAMA_VOCAB_PRE_TYPE_QWEN2 regex (Qwen2/Qwen3 tokenizer.json's Split pattern)
QWEN2_SPLIT = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
               r"|\s*[\r\n]+|\s+(?!\S)|\s+")
# Qwen3-Omni's added tokens in the slots the vocab-only GGUF leaves as [PADn] (Qwen/Qwen3-Omni-30B-A3B-*).
# Every slot up to the last added id is filled: with a gap, transformers renumbers the added tokens past it
# when it saves the tokenizer, and the reference then runs audio requests WITHOUT their audio (no error).
OMNI_ADDED = {151646: ("<|object_ref_start|>", True), 151647: ("<|object_ref_end|>", True),
              151648: ("<|box_start|>", True), 151649: ("<|box_end|>", True), 151650: ("<|quad_start|>", True),
              151651: ("<|quad_end|>", True), 151652: ("<|vision_start|>", True), 151653: ("<|vision_end|>", True),
              151654: ("<|vision_pad|>", True), 151655: ("<|image_pad|>", True), 151656: ("<|video_pad|>", True),
              151657: ("<tool_call>", False), 151658: ("</tool_call>", False), 151659: ("<|fim_prefix|>", False),
              151660: ("<|fim_middle|>", False), 151661: ("<|fim_suffix|>", False), 151662: ("<|fim_pad|>", False),
              151663: ("<|repo_name|>", False), 151664: ("<|file_sep|>", False), 151665: ("<tool_response>", False),
              151666: ("</tool_response>", False), 151667: ("<think>", False), 151668: ("</think>", False),
              151669: ("<|audio_start|>", True), 151670: ("<|audio_end|>", True), 151671: ("<tts_pad>", True),
              151672: ("<tts_text_bos>", True), 151673: ("<tts_text_eod>", True),
              151674: ("<tts_text_bos_single>", True), 151675: ("<|audio_pad|>", True)}
IDS = dict(image_token_id=151655, video_token_id=151656, audio_token_id=151675, audio_start_token_id=151669,
           vision_start_token_id=151652)

TEXT = dict(vocab_size=151936, hidden_size=64, intermediate_size=128, moe_intermediate_size=32, num_hidden_layers=3,
            num_attention_heads=4, num_key_value_heads=2, head_dim=32, num_experts=8, num_experts_per_tok=2,
            norm_topk_prob=True, rms_norm_eps=1e-6, max_position_embeddings=65536, tie_word_embeddings=False,
            rope_parameters={"rope_type": "default", "rope_theta": 1000000.0, "mrope_section": [6, 5, 5],
                             "interleaved": True, "mrope_interleaved": True})
VISION = dict(depth=3, hidden_size=32, intermediate_size=64, num_heads=2, patch_size=16, spatial_merge_size=2,
              temporal_patch_size=2, out_hidden_size=64, num_position_embeddings=2304,
              deepstack_visual_indexes=[0, 1], hidden_act="gelu_pytorch_tanh")
# n_window 50 / n_window_infer 800: Qwen3-Omni's published audio config (the GGUF does not record them)
AUDIO = dict(num_mel_bins=128, encoder_layers=2, encoder_attention_heads=2, encoder_ffn_dim=64, d_model=32,
             output_dim=64, n_window=50, n_window_infer=800, conv_chunksize=500, downsample_hidden_size=16,
             max_source_positions=1500)
# Qwen3-Omni's preprocessor_config.json (image part) and the reference's IMAGE_SIZE: 16-pixel patches merged
# 2x2, mean/std 0.5, 65,536 to 1,048,576 pixels
IMAGE_PROCESSOR = {"size": {"shortest_edge": 65536, "longest_edge": 1048576}, "patch_size": 16,
                   "temporal_patch_size": 2, "merge_size": 2, "image_mean": [0.5, 0.5, 0.5],
                   "image_std": [0.5, 0.5, 0.5]}
HEAD = {"hidden_size": 64, "width": 32, "routing_layers": 1, "layers": 1, "heads": 2, "feedforward": 64}


@dataclass(frozen=True)
class OmniFixtures:
    root: Path
    tokenizer_dir: Path
    hf_model: Path  # tiny random Qwen3-Omni, transformers format, with its tokenizer and preprocessor config
    gguf_f32: Path  # the converter's qwen3vlmoe text GGUF, as is (n_deepstack_layers 0)
    mmproj_f32: Path  # the converter's combined vision + audio projector (rename bug patched)
    head: Path  # joint_head.safetensors with joint_head_config.json beside it


class TokenizerPitfall(RuntimeError):
    """The saved tokenizer gives an added token another id than its slot (see OMNI_ADDED)."""


def check_added_ids(tokenizer) -> None:
    """Every Omni added token keeps its id after a save and load (the reference silently drops audio otherwise)."""
    wrong = {text: (i, tokenizer.convert_tokens_to_ids(text)) for i, (text, _) in OMNI_ADDED.items()
             if tokenizer.convert_tokens_to_ids(text) != i}
    if wrong:
        raise TokenizerPitfall(f"added tokens renumbered on save (token: (slot, id)): {wrong}")


def build_tokenizer(vocab_gguf: Path, out_dir: Path) -> None:
    from transformers import AutoTokenizer, PreTrainedTokenizerFast

    fast = PreTrainedTokenizerFast(
        tokenizer_object=fixturegen.qwen35_tokenizer(vocab_gguf, OMNI_ADDED, split=QWEN2_SPLIT),
        eos_token="<|im_end|>", pad_token="<|endoftext|>",
        extra_special_tokens={"image_token": "<|image_pad|>", "video_token": "<|video_pad|>",
                              "audio_token": "<|audio_pad|>", "vision_bos_token": "<|vision_start|>",
                              "vision_eos_token": "<|vision_end|>", "audio_bos_token": "<|audio_start|>",
                              "audio_eos_token": "<|audio_end|>"},
    )
    fast.save_pretrained(out_dir)
    check_added_ids(AutoTokenizer.from_pretrained(out_dir))


def image_processor(**overrides):
    from transformers import Qwen2VLImageProcessorPil

    return Qwen2VLImageProcessorPil(**(IMAGE_PROCESSOR | overrides))


def feature_extractor():
    """Qwen3-Omni's WhisperFeatureExtractor (128 mel bins, 16 kHz, hop 160, n_fft 400)."""
    from transformers import WhisperFeatureExtractor

    return WhisperFeatureExtractor(feature_size=128, sampling_rate=16000, hop_length=160, chunk_length=300,
                                   n_fft=400, padding_value=0.0, return_attention_mask=True)


def reference_processor(tokenizer):
    """Qwen3-Omni's processor for images and audio without torchvision: its video processor needs torchvision,
    which transformers' class check of the (absent) video processor imports; images and audio are untouched."""
    from transformers import Qwen3OmniMoeProcessor

    class NoVideoProcessor(Qwen3OmniMoeProcessor):
        def check_argument_for_proper_class(self, argument_name, argument):
            return None if argument is None else super().check_argument_for_proper_class(argument_name, argument)

    return NoVideoProcessor(image_processor=image_processor(), video_processor=None,
                            feature_extractor=feature_extractor(), tokenizer=tokenizer)


def omni_config():
    from transformers import Qwen3OmniMoeConfig

    thinker = dict(text_config=TEXT, vision_config=VISION, audio_config=AUDIO, position_id_per_seconds=13, **IDS)
    return Qwen3OmniMoeConfig(thinker_config=thinker, enable_audio_output=False)


def build_tiny_omni(tokenizer_dir: Path, out_dir: Path, seed: int = SEED + 10) -> None:
    import torch
    from transformers import AutoTokenizer, Qwen3OmniMoeForConditionalGeneration

    torch.manual_seed(seed)
    model = Qwen3OmniMoeForConditionalGeneration(omni_config()).to(torch.float32).eval()
    with torch.no_grad():  # default init leaves norms at one; vary them so the tests see the weights
        for name, p in model.named_parameters():
            if ("norm" in name and p.dim() == 1) or name.endswith("merger.ln_q.bias"):
                p.add_(0.1 * torch.randn_like(p))
    model.save_pretrained(out_dir)
    # the converter's Omni text class reads <|im_end|> from tokenizer_config.json's added_tokens_decoder
    AutoTokenizer.from_pretrained(tokenizer_dir).save_pretrained(out_dir)


CONVERT = """
import runpy, sys
sys.path[:0] = [{vendor!r}, {gguf_py!r}]
from conversion import base, qwen3vl
# a home-made tokenizer's chktxt hash is unknown to the converter; Qwen3-Omni's tokenizer is qwen2's
base.TextModel.get_vocab_base_pre = lambda self, tokenizer: "qwen2"
# The converter's Omni mmproj class keeps `thinker.visual.*` through its prefix filter, then renames it to
# `model.visual.*`, which nothing maps ("Can not map tensor 'model.visual.blocks.0.attn.proj.bias'"):
# strip the prefix to `visual.` first, as its Qwen3-VL parent expects.
_filter = qwen3vl.Qwen3OmniMmprojModel.filter_tensors.__func__
def _omni_filter(cls, item):
    name, gen = item
    if name.startswith("thinker.visual."):
        name = "visual." + name[len("thinker.visual."):]
    return _filter(cls, (name, gen))
qwen3vl.Qwen3OmniMmprojModel.filter_tensors = classmethod(_omni_filter)
sys.argv = {argv!r}
runpy.run_path({script!r}, run_name="__main__")
"""


def convert(vendor: Path, hf_dir: Path, out: Path, outtype: str, extra: tuple[str, ...] = ()) -> None:
    script = vendor / "convert_hf_to_gguf.py"
    argv = [str(script), str(hf_dir), "--outfile", str(out), "--outtype", outtype, *extra]
    code = CONVERT.format(vendor=str(vendor), gguf_py=str(vendor / "gguf-py"), argv=argv, script=str(script))
    done = subprocess.run([sys.executable, "-c", code], cwd=vendor, capture_output=True, text=True)
    if done.returncode:
        raise RuntimeError(f"convert {hf_dir} -> {out} failed:\n{done.stderr[-3000:]}")


def sdist_vendor(root: Path) -> Path:
    """fixturegen's sdist extraction plus the Qwen2 vocab (fixturegen extracts only Qwen3.5's)."""
    vendor = sdist(root)
    qwen2 = vendor / "models" / "ggml-vocab-qwen2.gguf"
    if not qwen2.exists():
        with tarfile.open(root / "sdist" / f"{fixturegen.SDIST_NAME}.tar.gz") as tar:
            member = tar.getmember(f"{fixturegen.VENDOR}/models/ggml-vocab-qwen2.gguf")
            tar.extractall(root / "sdist", members=[member], filter="data")
    return vendor


def build(root: Path = FIXTURES) -> OmniFixtures:
    fixturegen.build(root)  # the sdist, and the session's other fixtures
    with _lock(root):
        vendor = sdist_vendor(root)
        fx = OmniFixtures(root=root, tokenizer_dir=root / "omni-tokenizer", hf_model=root / "tiny-omni-hf",
                          gguf_f32=root / "tiny-omni-f32.gguf", mmproj_f32=root / "tiny-omni-mmproj-f32.gguf",
                          head=root / "tiny-omni-head" / "joint_head.safetensors")
        if not (fx.tokenizer_dir / "tokenizer.json").exists():
            _log("building tokenizer.json from the Qwen2 vocab with Qwen3-Omni's added tokens")
            build_tokenizer(vendor / "models" / "ggml-vocab-qwen2.gguf", fx.tokenizer_dir)
        if not (fx.hf_model / "preprocessor_config.json").exists():
            _log("building the tiny random Qwen3-Omni")
            build_tiny_omni(fx.tokenizer_dir, fx.hf_model)
            image_processor().save_pretrained(fx.hf_model)  # last: its file marks a finished build
        for path, extra in ((fx.gguf_f32, ()), (fx.mmproj_f32, ("--mmproj",))):
            if not path.exists():
                _log(f"converting to {path.name}")
                convert(vendor, fx.hf_model, path.with_suffix(".tmp"), "f32", extra)
                path.with_suffix(".tmp").rename(path)
        if not fx.head.exists():
            build_head(fx.head, HEAD, SEED + 10)
        return fx


if __name__ == "__main__":
    print(build())
