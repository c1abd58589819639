"""A GGUF's tokenizer without its weights, for the tests and benchmarks that tokenize without a model."""

from __future__ import annotations

from pathlib import Path

import llama_cpp as lc
from clef_bridge.bridge.llama import log as llama_log
from clef_bridge.bridge.llama.backbone import BackboneError, Tokenizer, unicode_normalization


class VocabOnly:
    """A GGUF's tokenizer without its weights (llama.cpp's vocab_only load)."""

    def __init__(self, path: str | Path, verbose: bool = False, normalize: bool = True):
        """normalize=False: llama.cpp's own tokenization, without the original tokenizer's Unicode form."""
        lc.llama_backend_init()
        llama_log.install(verbose)
        mparams = lc.llama_model_default_params()
        mparams.vocab_only = True
        self._model = lc.llama_model_load_from_file(str(path).encode(), mparams)
        if not self._model:
            raise BackboneError(f"{path}: llama.cpp could not load this GGUF's vocabulary")
        form = unicode_normalization(self._model) if normalize else None
        self._tokenizer = Tokenizer(lc.llama_model_get_vocab(self._model), form)
        self.tokenize = self._tokenizer.tokenize

    def close(self) -> None:
        if getattr(self, "_model", None):
            lc.llama_model_free(self._model)
            self._model = None

    def __del__(self) -> None:
        self.close()
