"""The GGUF backbone architectures Clef comes as, and what each one can do: the one place a new architecture
is described (its backbone class, memory-plan layout and demo writer aside, see docs/architecture.md)."""

from __future__ import annotations

from dataclasses import dataclass

from .media import AUDIO, IMAGE, VIDEO

# Qwen3.5's preprocessor_config.json: 65,536 to 16,777,216 pixels, one token per 32 x 32
QWEN35_IMAGE_TOKENS = (64, 16384)
# Clef-omni's reference sizes images to 65,536 .. 1,048,576 pixels (its IMAGE_SIZE): 64 to 1,024 tokens of 32x32
OMNI_IMAGE_TOKENS = (64, 1024)


@dataclass(frozen=True)
class Architecture:
    """One value of a GGUF's general.architecture that serves a Clef."""

    name: str
    media: tuple[str, ...]  # the media kinds its projector can feed (a projector is still needed for any)
    image_tokens: tuple[int, int]  # the fewest and most tokens one image makes (its reference's image sizes)
    pre_tokenizer: str  # tokenizer.ggml.pre as llama.cpp's converter writes it
    nfc: bool  # the Hugging Face tokenizer NFC-normalizes text first (the GGUF drops that; the bridge redoes it)
    reference: str = "dense"  # its reference's prompt: head/encoder.py's media layout and default max_length
    experts: bool = False  # mixture-of-experts FFNs (llama.cpp's --n-cpu-moe applies)
    deepstack: bool = False  # its layers take the vision tower's deepstack features
    full_attention: bool = False  # every layer keeps a KV cache (no recurrent layers)
    every_token_output: bool = False  # no hidden-state hook before lm_head: every token is an output (logits)
    kv_cells_only: bool = False  # a sequence's whole state is its KV cells (the prefix cache copies cells)
    head_inside: bool = False  # the joint head is embedded (llama.cpp's clef GGUF)
    loads_as: str = ""  # the architecture llama-cpp-python loads instead ("" : itself)


QWEN35 = Architecture("qwen35", (IMAGE.name,), QWEN35_IMAGE_TOKENS, "qwen35", nfc=True)
QWEN35MOE = Architecture("qwen35moe", (IMAGE.name,), QWEN35_IMAGE_TOKENS, "qwen35", nfc=True,
                         experts=True)
CLEF = Architecture("clef", (IMAGE.name,), QWEN35_IMAGE_TOKENS, "qwen35", nfc=True, head_inside=True,
                    loads_as=QWEN35.name)
QWEN3VLMOE = Architecture("qwen3vlmoe", (IMAGE.name, AUDIO.name, VIDEO.name), OMNI_IMAGE_TOKENS,
                          "qwen2", nfc=True, reference="omni", experts=True, deepstack=True, full_attention=True,
                          every_token_output=True, kv_cells_only=True)
ARCHITECTURES = {a.name: a for a in (QWEN35, QWEN35MOE, QWEN3VLMOE, CLEF)}

CLEF_ARCHITECTURES = tuple(ARCHITECTURES)  # what a Clef backbone may be
NFC_PRE_TOKENIZERS = frozenset(a.pre_tokenizer for a in ARCHITECTURES.values() if a.nfc)
DEEPSTACK_ARCHITECTURES = frozenset(a.name for a in ARCHITECTURES.values() if a.deepstack)
FULL_ATTENTION_ARCHITECTURES = frozenset(a.name for a in ARCHITECTURES.values() if a.full_attention)
EVERY_TOKEN_OUTPUT_ARCHITECTURES = frozenset(a.name for a in ARCHITECTURES.values() if a.every_token_output)
AUDIO_ARCHITECTURES = frozenset(a.name for a in ARCHITECTURES.values() if AUDIO.name in a.media)


def architecture(name: str | None) -> Architecture | None:
    """The catalogue's entry for a GGUF architecture, or None for one Clef does not come as."""
    return ARCHITECTURES.get(name) if name else None


def image_tokens(name: str | None) -> tuple[int, int]:
    """The fewest and most tokens one image makes for a backbone of this architecture (Qwen3.5's when unknown)."""
    arch = architecture(name)
    return arch.image_tokens if arch else QWEN35_IMAGE_TOKENS
