"""llama.cpp's tokenizer on the real Qwen3.5 vocab equals a `tokenizers` BPE built from the same
vocab and merges with the qwen35 pre-tokenizer."""

from __future__ import annotations

import json

import pytest
from clef_bridge.bridge.backbone import VocabOnly
from clef_bridge.head.encoder import PREFIX, SCHEMA_HEADER, SUFFIX, render

from .fixturegen import qwen35_tokenizer

SEP = "\n__ggml_vocab_test__\n"


@pytest.fixture(scope="module")
def llama_vocab(fx):
    vocab = VocabOnly(fx.vocab_gguf)
    yield vocab
    vocab.close()


@pytest.fixture(scope="module")
def hf_vocab(fx):
    return qwen35_tokenizer(fx.vocab_gguf, added={})


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


def test_vocab_vectors(fx, llama_vocab, hf_vocab):
    """The vocab's own .inp/.out vectors (made with the release's HF tokenizer)."""
    texts = fx.vocab_inp.read_text(encoding="utf-8").split(SEP)[:-1]
    expected = fx.vocab_out.read_text(encoding="utf-8").split("\n")[:-1]
    assert len(texts) == len(expected) >= 40
    hf_vocab.encode_special_tokens = True  # llama.cpp's test tokenizes these with parse_special=false
    for text, ids in zip(texts, expected):
        want = [int(t) for t in ids.split()]
        assert llama_vocab.tokenize(text, False) == want, repr(text)
        assert hf_vocab.encode(text, add_special_tokens=False).ids == want, repr(text)
    hf_vocab.encode_special_tokens = False


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
