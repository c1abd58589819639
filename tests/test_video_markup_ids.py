"""Video positions on a model whose media markup is not at Qwen3-Omni's stock ids: the built-in Clef-omni demo (its
small vocabulary puts <|vision_start|>, <|video_pad|> and the audio marks near 270, not at 151,652 and after). The
positions llama.cpp receives are compared with transformers' own get_rope_index for Qwen3-Omni's thinker, given
the demo's ids as its config would hold them (read here from the GGUF's token list, not through the bridge):
issue 48 found every video token of such a model at a text position (the positions fell back to the stock ids and
found no media)."""

from __future__ import annotations

import types

import numpy as np
import pytest
from clef_bridge.bridge.config.registry import model_spec
from clef_bridge.bridge.demo.builtins import make_demo
from clef_bridge.bridge.media.audio_tower import request_frames
from clef_bridge.bridge.media.images import decode as decode_image
from clef_bridge.bridge.media.images import sniff as sniff_image
from clef_bridge.bridge.media.request import AUDIO, IMAGE, VIDEO, Media
from clef_bridge.bridge.media.video import DecodedVideo
from clef_bridge.bridge.model.loading import load_checked
from gguf import GGUFReader

from .deciding import prepare
from .fixturegen_vision import encoded, picture
from .omni_cases import SCHEMA, STATE, tone

pytestmark = pytest.mark.integration
torch = pytest.importorskip("torch")

STOCK = {151652, 151655, 151656, 151669, 151675}  # Qwen3-Omni's tokenizer: vision start, image, video, audio
MARKS = {"vision_start_token_id": "<|vision_start|>", "image_token_id": "<|image_pad|>",
         "video_token_id": "<|video_pad|>", "audio_start_token_id": "<|audio_start|>",
         "audio_token_id": "<|audio_pad|>"}
LOC = ("body", "images", 0)


@pytest.fixture(scope="module")
def demo(tmp_path_factory):
    files = make_demo(tmp_path_factory.mktemp("demo"), omni=True).omni
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("CLEF_BRIDGE_CACHE", str(tmp_path_factory.mktemp("cache")))
        model = load_checked(model_spec("omni", files.gguf, files.head, mmproj=files.mmproj)).model
    yield files, model
    model.close()


def demo_ids(gguf) -> dict[str, int]:
    """The markup's ids in the GGUF's own token list (tokenizer.ggml.tokens, read with gguf-py)."""
    tokens = GGUFReader(gguf).fields["tokenizer.ggml.tokens"].contents()
    return {key: tokens.index(text) for key, text in MARKS.items()}


def reference_positions(ids: dict[str, int], input_ids, image_grids, video_grids, audio_frames, seconds_per_grid,
                        in_video: bool) -> np.ndarray:
    """transformers' Qwen3-Omni get_rope_index (the reference's thinker), on a config with these ids."""
    from transformers.models.qwen3_omni_moe.modeling_qwen3_omni_moe import (
        Qwen3OmniMoeThinkerForConditionalGeneration as Thinker,
    )

    config = types.SimpleNamespace(**ids, position_id_per_seconds=13, audio_config=types.SimpleNamespace(n_window=50))

    class Rope:  # the two methods get_rope_index calls, on a config alone (no weights)
        get_rope_index = Thinker.get_rope_index
        get_llm_pos_ids_for_vision = Thinker.get_llm_pos_ids_for_vision

    rope = Rope()
    rope.config, rope.spatial_merge_size = config, 2
    long = lambda x: torch.tensor(x, dtype=torch.long) if len(x) else None  # noqa: E731
    positions, _ = rope.get_rope_index(
        torch.tensor([list(input_ids)]), long(image_grids), long(video_grids), torch.ones(1, len(input_ids)),
        in_video, long(audio_frames), torch.tensor(seconds_per_grid, dtype=torch.float))
    return positions[:, 0].numpy().astype(np.int64)


def sent_positions(model, prepared) -> np.ndarray:
    """[3, T] the positions of every token as the backbone's decodes received them."""
    sent = []
    real = model.backbone.decode_media
    model.backbone.decode_media = lambda chunks: sent.extend(chunks) or real(chunks)
    try:
        model.prefill_batch([prepared])
    finally:
        model.backbone.decode_media = real
    return np.concatenate([c.pos[:3] if c.pos.ndim == 2 else np.broadcast_to(c.pos, (3, len(c))) for c in sent],
                          axis=1).astype(np.int64)


def clip(frames: int, height: int, width: int, seconds: float | None) -> DecodedVideo:
    rng = np.random.default_rng(frames)
    pixels = rng.integers(0, 256, (frames, height, width, 3), dtype=np.uint8)
    return DecodedVideo(pixels, None if seconds is None else tone(seconds, 2))


def test_the_demos_markup_is_not_at_the_stock_ids(demo):
    files, model = demo
    ids = demo_ids(files.gguf)
    assert not set(ids.values()) & STOCK
    assert model.projector.omni_tokens.video == ids["video_token_id"]


@pytest.mark.parametrize("case", ["silent", "sounded", "image_clip_sounded", "two_sounded"])
def test_video_positions_on_the_demo_are_the_references(demo, case):
    files, model = demo
    videos = {"silent": [clip(4, 64, 96, None)], "sounded": [clip(4, 64, 96, 2.0)],
              "image_clip_sounded": [clip(6, 96, 64, 3.0)], "two_sounded": [clip(4, 64, 96, 2.0), clip(2, 64, 64, 1.2)]
              }[case]
    images = [decode_image(png, sniff_image(png, LOC), LOC, model.geometry)
              for png in ([encoded(picture(96, 64, seed=3), "PNG")] if case == "image_clip_sounded" else [])]
    clips = [tone(1.3, 5)] if case == "image_clip_sounded" else []
    media = Media({k: v for k, v in {IMAGE: tuple(images), AUDIO: tuple(clips), VIDEO: tuple(videos)}.items() if v})
    prepared = prepare(model, {"model": "omni", "state": STATE, "questions": SCHEMA}, media)
    [plan] = prepared.media.of(VIDEO)
    ids = prepared.encoded.input_ids.tolist()
    got = sent_positions(model, prepared)
    patch = model.projector.geometry.factor // model.projector.merge
    grids = [(1, img.shape[0] // patch, img.shape[1] // patch) for img in images]
    want = reference_positions(demo_ids(files.gguf), ids, grids, plan.grids, request_frames([len(a) for a in plan.audio]),
                               plan.seconds_per_grid, plan.audio_in_video)
    assert got.shape == want.shape == (3, len(ids))
    video = np.isin(ids, [demo_ids(files.gguf)["video_token_id"]])
    assert len(set(want[0, video].tolist())) == plan.grids[0][0] or len(videos) > 1  # a temporal step per pair
    assert np.array_equal(got, want)
