"""llama.cpp's tokenizer on the real Qwen3.5 vocab equals a `tokenizers` BPE built from the same
vocab and merges with the qwen35 pre-tokenizer, and, with our NFC step, transformers' Qwen3_5Tokenizer."""

from __future__ import annotations

import json
import unicodedata

import pytest
from clef_bridge.head.encoder import PREFIX, SCHEMA_HEADER, SUFFIX
from clef_bridge.head.schema import render

from .fixturegen import _vocab, qwen35_tokenizer
from .vocab import VocabOnly

pytestmark = pytest.mark.integration

SEP = "\n__ggml_vocab_test__\n"


@pytest.fixture(scope="module")
def llama_vocab(fx):
    vocab = VocabOnly(fx.vocab_gguf)
    yield vocab
    vocab.close()


@pytest.fixture(scope="module")
def raw_llama_vocab(fx):
    vocab = VocabOnly(fx.vocab_gguf, normalize=False)
    yield vocab
    vocab.close()


@pytest.fixture(scope="module")
def hf_vocab(fx):
    return qwen35_tokenizer(fx.vocab_gguf, added={})


@pytest.fixture(scope="module")
def release_class(fx):
    """transformers' Qwen3_5Tokenizer, the class Qwen3.5's tokenizer_config.json names, over the vocab."""
    from transformers.models.qwen3_5.tokenization_qwen3_5 import Qwen3_5Tokenizer

    tokens, types, merges = _vocab(fx.vocab_gguf)
    normal = {t: i for i, (t, ty) in enumerate(zip(tokens, types)) if ty == 1}
    return Qwen3_5Tokenizer(vocab=normal, merges=[tuple(m.split(" ", 1)) for m in merges])


def vocab_vectors(fx) -> list[tuple[str, list[int]]]:
    texts = fx.vocab_inp.read_text(encoding="utf-8").split(SEP)[:-1]
    expected = fx.vocab_out.read_text(encoding="utf-8").split("\n")[:-1]
    assert len(texts) == len(expected) >= 40
    return [(text, [int(t) for t in ids.split()]) for text, ids in zip(texts, expected)]


def prompt_pieces() -> list[str]:
    pieces = [PREFIX, SUFFIX, SCHEMA_HEADER, "\nALLOWED OPTIONS:\n", "\n", "END FIELD\n"]
    pieces += [f"OPTION {j}: " for j in (1, 9, 10, 99, 255)]
    pieces += [f"\nFIELD {i}\nID: {qid}\nTYPE: {t}\nINSTRUCTION: " for i, qid, t in
               [(1, "is_urgent", "noul"), (12, "größe_問題", "choice"), (3, "id with spaces", "score"),
                (64, "q-64", "choice")]]
    values = [
        {"option_id": "billing", "description": "Billing questions"}, {"option_id": "x"},
        {"option_id": "klein 🐜", "description": "kleines Problem"}, {"option_id": "0", "description": "none"},
        {"option_id": "true", "description": "The proposition is true or the answer is yes."},
        {"user": {"name": "Ada", "tier": "gold"}, "n": 3, "ok": True, "nil": None, "pi": 3.14159},
        [1, 2.5, "three", None, False], {"nested": {"deeper": {"deepest": ["a", {"b": "c"}]}}},
    ]
    pieces += [render(v) for v in values]
    pieces += [
        "Hello world", " Hello world", "hello   world", "tabs\tand\ttabs", "\n\n\n", " \n \n ", "\r\n\r\n",
        "    leading spaces", "trailing spaces    ", "1234567890", "3.14159", "2026-11-30T04:36:00Z",
        "1,000,000.00 EUR", "0x1F600", "Ünïcödé façade naïve", "日本語のテキスト", "한국어 텍스트", "Привет, мир!",
        "مرحبا بالعالم", "क्षत्रिय कान्", "កាន់តែពិសេស", "emoji 🙂🙃🦙 🇩🇪 👩‍💻", "e\u0301 cafe\u0301",
        "I've been told he's there, 'RE you sure? We'Ve a'lL", "--==**__!!??..,,", "<html><body>x</body></html>",
        "a<|im_end|>b", "<|im_start|>assistant\n", "text <|endoftext|> more", "<think>not a token here</think>",
        "ﬁ ligature ½ ²", "\u200b zero width", "\\n literal backslash n", json.dumps({"k": "v\n\"q\""}),
        "CamelCaseIdentifier snake_case_identifier kebab-case-identifier", "    def f(x):\n        return x\n",
    ]
    return pieces


def test_there_are_enough_pieces():
    assert len(prompt_pieces()) >= 50


def test_vocab_vectors(fx, raw_llama_vocab):
    """The vocab's own .inp/.out vectors: llama.cpp's tokenizer, which does not normalize Unicode.

    They were made without the NFC step of transformers' Qwen3_5Tokenizer: their decomposed strings
    ("e\u0301", "re\u0301sume\u0301") keep the combining marks as separate tokens.
    """
    raw_hf = qwen35_tokenizer(fx.vocab_gguf, added={}, nfc=False)
    raw_hf.encode_special_tokens = True  # llama.cpp's test tokenizes these with parse_special=false
    for text, want in vocab_vectors(fx):
        assert raw_llama_vocab.tokenize(text, False) == want, repr(text)
        assert raw_hf.encode(text, add_special_tokens=False).ids == want, repr(text)


def test_release_tokenizer_class_normalizes_and_so_do_we(fx, llama_vocab, raw_llama_vocab, release_class):
    """Cloudflare's reference tokenizes with the release's class, which NFC-normalizes; our tokenizer does too."""
    decomposed = 0
    for text, want in vocab_vectors(fx):
        expected = release_class.encode(text, add_special_tokens=False)
        assert llama_vocab.tokenize(text, False) == expected, repr(text)
        if unicodedata.normalize("NFC", text) != text:
            decomposed += 1
            assert expected != want  # here llama.cpp alone would differ from the reference
            assert expected == raw_llama_vocab.tokenize(unicodedata.normalize("NFC", text), False)
    assert decomposed >= 2
    for piece in ["Cafe\u0301 Ko\u0308ln \u212b", "n\u0303 a\u0300 \u1100\u1161", "e\u0301" * 40]:
        assert llama_vocab.tokenize(piece, False) == release_class.encode(piece, add_special_tokens=False)


@pytest.mark.parametrize("parse_special", [True, False])
def test_prompt_pieces(llama_vocab, hf_vocab, parse_special):
    hf_vocab.encode_special_tokens = not parse_special
    try:
        for piece in prompt_pieces():
            assert llama_vocab.tokenize(piece, parse_special) == \
                hf_vocab.encode(piece, add_special_tokens=False).ids, repr(piece)
    finally:
        hf_vocab.encode_special_tokens = False


def test_control_strings_in_text(llama_vocab):
    im_end = llama_vocab.tokenize("<|im_end|>", True)
    assert len(im_end) == 1
    assert im_end[0] in llama_vocab.tokenize("a<|im_end|>b", True)
    assert im_end[0] not in llama_vocab.tokenize("a<|im_end|>b", False)
