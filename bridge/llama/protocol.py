"""What a served model needs of its backbone, as a Protocol: a Backbone (or OmniBackbone) of its own, or a
BackboneView of one shared by several models (adapters.py). ClefModel, the projector and the worker hold this."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    import numpy as np

    from .media_batch import MediaChunk
    from .options import BackboneOptions
    from .prefix_cache import CachedPrefill, PrefillRequest, PrefixCache


class BackboneProtocol(Protocol):
    path: Path
    options: BackboneOptions
    architecture: str  # general.architecture of the GGUF
    n_embd: int  # hidden states' width
    n_embd_inp: int  # input embeddings' width (deepstack: wider)
    decode_budget: int  # tokens one llama_decode takes
    prefix_cache: PrefixCache | None

    @property
    def on_gpu(self) -> bool: ...

    @property
    def batch_budget(self) -> int: ...  # tokens the worker packs into one batch of requests

    @property
    def llama_model(self) -> Any: ...

    def tokenize(self, text: str, parse_special: bool) -> list[int]: ...

    def min_tokens(self, text: str) -> int: ...

    def prefill(self, token_ids: np.ndarray) -> np.ndarray: ...

    def prefill_many(self, sequences: list[np.ndarray]) -> list[np.ndarray]: ...

    def prefill_cached(self, requests: list[PrefillRequest]) -> list[CachedPrefill]: ...

    def decode_media(self, chunks: list[MediaChunk]) -> np.ndarray: ...

    def close(self) -> None: ...
