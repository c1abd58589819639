"""The Clef-omni demo's files (bridge/demo/builtins.py, demo_moe.py, demo_media.py): deterministic, in the layout
llama.cpp's converter writes for Qwen3-Omni, and loaded by llama.cpp itself: the qwen3vlmoe GGUF with the
projector's deepstack count, the projector's vision half through mtmd with its rows decoded by that backbone,
its audio half through mtmd, the audio tensors in the shapes the numpy audio tower reads and the tower encoding
clips from them; and `clef-bridge serve` without a models.toml answering `clef-omni` with images and audio."""

from __future__ import annotations

import ctypes
import hashlib
import math

import llama_cpp as lc
import numpy as np
import pytest
from clef_bridge.bridge.config.registry import demo_registry, parse_registry
from clef_bridge.bridge.demo.builtins import OMNI_AUDIO, OMNI_DEMO, OMNI_DIMS, make_demo
from clef_bridge.bridge.demo.mmproj import AudioDims, VisionDims, write_projector
from clef_bridge.bridge.gguf.reader import read_gguf
from clef_bridge.bridge.llama import log as llama_log
from clef_bridge.bridge.llama.media_batch import MediaBatch, MediaChunk
from clef_bridge.bridge.llama.vision import image_positions
from clef_bridge.bridge.media.audio_tower import AudioTower, audio_tokens
from gguf import GGUFReader, GGUFValueType, GGUFWriter
from llama_cpp import mtmd_cpp as mt

from . import fixturegen_video
from .fixturegen import FIXTURES

pytestmark = pytest.mark.integration

AUDIO_PREFIXES = ("a.", "mm.a.")


@pytest.fixture(scope="module")
def omni(tmp_path_factory):
    return make_demo(tmp_path_factory.mktemp("demo"), omni=True).omni


def _digest(path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def projector_half(src, out, kind: str):
    """One encoder of a combined projector as a projector of its own (mtmd refuses the combined file), as the
    lab's split_projector writes it: that encoder's keys and tensors (copied as stored), its projector type as
    clip.projector_type, the other encoder marked absent."""
    reader = GGUFReader(src)
    other = "audio" if kind == "vision" else "vision"
    writer = GGUFWriter(str(out), "clip")
    skip = ("general.architecture", "clip.vision.projector_type", "clip.audio.projector_type",
            f"clip.has_{other}_encoder")
    for key, field in reader.fields.items():
        if key.startswith(("GGUF.", f"clip.{other}.")) or key in skip:
            continue
        sub = field.types[-1] if field.types[0] == GGUFValueType.ARRAY else None
        writer.add_key_value(key, field.contents(), field.types[0], sub_type=sub)
    writer.add_string("clip.projector_type", reader.fields[f"clip.{kind}.projector_type"].contents())
    writer.add_bool(f"clip.has_{other}_encoder", False)
    for t in reader.tensors:
        if t.name.startswith(AUDIO_PREFIXES) == (kind == "audio"):
            writer.add_tensor(t.name, np.asarray(t.data))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return out


class Loaded:
    """A llama.cpp model (optionally with qwen3vlmoe.n_deepstack_layers overridden, as the bridge loads Clef-omni)
    and one context on it."""

    def __init__(self, path, deepstack: int | None = None):
        lc.llama_backend_init()
        llama_log.install(False)
        params = lc.llama_model_default_params()
        overrides = (lc.llama_model_kv_override * 2)()  # the last one, all zeros, ends the list
        if deepstack is not None:
            overrides[0].key = b"qwen3vlmoe.n_deepstack_layers"
            overrides[0].tag = lc.LLAMA_KV_OVERRIDE_TYPE_INT
            overrides[0].value.val_i64 = deepstack
            params.kv_overrides = ctypes.cast(overrides, ctypes.POINTER(lc.llama_model_kv_override))
        self.model = lc.llama_model_load_from_file(str(path).encode(), params)
        assert self.model, f"llama.cpp could not load {path}"
        cparams = lc.llama_context_default_params()
        cparams.n_ctx, cparams.n_batch, cparams.n_ubatch, cparams.n_seq_max = 2048, 512, 512, 1
        self.ctx = lc.llama_init_from_model(self.model, cparams)
        assert self.ctx

    def close(self) -> None:
        lc.llama_free(self.ctx)
        lc.llama_model_free(self.model)

    def tokens(self, text: str) -> np.ndarray:
        vocab = lc.llama_model_get_vocab(self.model)
        raw = text.encode()
        out = (lc.llama_token * (len(raw) + 8))()
        n = lc.llama_tokenize(vocab, raw, len(raw), out, len(out), False, True)
        return np.array(out[:n], dtype=np.int32)

    def last_logits(self) -> np.ndarray:
        n_vocab = lc.llama_vocab_n_tokens(lc.llama_model_get_vocab(self.model))
        return np.ctypeslib.as_array(lc.llama_get_logits_ith(self.ctx, -1), shape=(n_vocab,)).copy()


def mtmd_encode(path, model, bitmap) -> np.ndarray:
    """The rows mtmd's encoder makes of one bitmap (an image's or a clip's) with the projector at path."""
    params = mt.mtmd_context_params_default()
    params.use_gpu, params.n_threads, params.print_timings, params.warmup = False, 2, False, False
    llama_log.install_mtmd(False)
    ctx = mt.mtmd_init_from_file(str(path).encode(), model, params)
    assert ctx, f"mtmd refused {path}"
    chunks = mt.mtmd_input_chunks_init()
    try:
        part = mt.mtmd_input_part(None, bitmap)
        parts = (ctypes.POINTER(mt.mtmd_input_part) * 1)(ctypes.pointer(part))
        assert mt.mtmd_tokenize_from_parts(ctx, chunks, parts, 1, False) == 0
        media = [c for c in (mt.mtmd_input_chunks_get(chunks, i) for i in range(mt.mtmd_input_chunks_size(chunks)))
                 if mt.mtmd_input_chunk_get_type(c) != mt.MTMD_INPUT_CHUNK_TYPE_TEXT]
        assert len(media) == 1
        n = mt.mtmd_input_chunk_get_n_tokens(media[0])
        assert mt.mtmd_encode_chunk(ctx, media[0]) == 0
        width = lc.llama_model_n_embd_inp(model)
        rows = np.empty((n, width), dtype=np.float32)
        ctypes.memmove(rows.ctypes.data, mt.mtmd_get_output_embd(ctx), rows.nbytes)
        return rows
    finally:
        mt.mtmd_input_chunks_free(chunks)
        mt.mtmd_free(ctx)


def test_the_omni_demo_is_deterministic(omni, tmp_path):
    again = make_demo(tmp_path / "again", omni=True).omni
    other = make_demo(tmp_path / "other", seed=1, omni=True).omni
    for name in ("gguf", "mmproj", "head"):
        assert _digest(getattr(omni, name)) == _digest(getattr(again, name))
        assert _digest(getattr(omni, name)) != _digest(getattr(other, name))
    assert make_demo(tmp_path / "plain", omni=False).omni is None and not (tmp_path / "plain" / "omni").exists()


def test_the_text_gguf_and_the_vision_half_run_in_llama_cpp(omni, tmp_path):
    """The backbone loads with the projector's deepstack count (its input rows widen to n_embd x (1 + k)); mtmd
    loads the vision half against it and its rows decode at Qwen3-Omni's image positions between text tokens."""
    meta = read_gguf(omni.mmproj).metadata
    assert read_gguf(omni.gguf).metadata["qwen3vlmoe.n_deepstack_layers"] == 0  # as the converter writes it
    levels = int(np.sum(meta["clip.vision.is_deepstack_layers"]))
    assert levels >= 1
    vision = projector_half(omni.mmproj, tmp_path / "omni.vision.gguf", "vision")
    backbone = Loaded(omni.gguf, deepstack=levels)
    try:
        n_embd = lc.llama_model_n_embd(backbone.model)
        assert lc.llama_model_n_embd_inp(backbone.model) == n_embd * (1 + levels) == OMNI_DIMS.hidden * (1 + levels)
        side = 32 * 3  # 3 x 3 tokens of 32 x 32 pixels
        pixels = np.random.default_rng(0).integers(0, 256, (side, side + 32, 3), dtype=np.uint8)
        bitmap = mt.mtmd_bitmap_init(side + 32, side, pixels.ctypes.data_as(ctypes.POINTER(ctypes.c_uint8)))
        try:
            rows = mtmd_encode(vision, backbone.model, bitmap)
        finally:
            mt.mtmd_bitmap_free(bitmap)
        assert rows.shape == (3 * 4, n_embd * (1 + levels)) and np.isfinite(rows).all()
        before = backbone.tokens("<|im_start|>user\nSTATE:\n<|vision_start|>")
        after = backbone.tokens("<|vision_end|>\nIs it urgent?")
        at = len(before)
        chunks = [MediaChunk(pos=np.arange(at, dtype=np.int32), tokens=before),
                  MediaChunk(pos=image_positions(3, 4, at), embd=rows),
                  MediaChunk(pos=np.arange(at + 4, at + 4 + len(after), dtype=np.int32), tokens=after)]
        for chunk in chunks:
            batch = MediaBatch(chunk)
            batch.logits[-1] = chunk is chunks[-1]  # the bridge reads no logits; this test reads the last token's
            assert lc.llama_decode(backbone.ctx, batch.struct) == 0
        logits = backbone.last_logits()
        assert np.isfinite(logits).all() and logits.std() > 0
    finally:
        backbone.close()


def test_the_audio_half_runs_in_mtmd(omni, tmp_path):
    """mtmd's qwen3a loads the audio half against the backbone as its GGUF says (no deepstack widening: audio rows
    are n_embd wide) and encodes a clip: 13 rows per started second plus one frame, as the lab measured."""
    audio = projector_half(omni.mmproj, tmp_path / "omni.audio.gguf", "audio")
    backbone = Loaded(omni.gguf)
    try:
        for seconds in (0.5, 1.0, 1.7):
            n = int(seconds * 16000)
            samples = (0.3 * np.sin(2 * np.pi * 440 * np.arange(n) / 16000)).astype(np.float32)
            bitmap = mt.mtmd_bitmap_init_from_audio(n, samples.ctypes.data_as(ctypes.POINTER(ctypes.c_float)))
            try:
                rows = mtmd_encode(audio, backbone.model, bitmap)
            finally:
                mt.mtmd_bitmap_free(bitmap)
            frames = n // 160
            assert rows.shape == (13 * math.ceil((frames + 1) / 100), OMNI_DIMS.hidden) and np.isfinite(rows).all()
    finally:
        backbone.close()


def test_the_audio_tensors_have_the_shapes_the_audio_tower_reads(omni):
    """What the numpy audio tower (the lab's audio_tower.py, bridge/media/audio_tower.py on the omni branch) reads:
    three 3x3 convolutions from 1 channel, conv_out over channels x mel bins / 8, sinusoid positions, pre-LN layers
    of d with biases, the two-layer projection to the backbone's width; conv weights in F16, as the converter
    stores them."""
    reader = GGUFReader(omni.mmproj)
    shapes = {t.name: tuple(np.asarray(t.data).shape) for t in reader.tensors if t.name.startswith(AUDIO_PREFIXES)}
    types = {t.name: t.tensor_type.name for t in reader.tensors}
    meta = read_gguf(omni.mmproj).metadata
    d, ff, c = meta["clip.audio.embedding_length"], meta["clip.audio.feed_forward_length"], OMNI_AUDIO.conv
    mel, heads, out = meta["clip.audio.num_mel_bins"], meta["clip.audio.attention.head_count"], OMNI_DIMS.hidden
    assert mel == 128 and d % heads == 0 and meta["clip.audio.projection_dim"] == out
    want = {"a.conv2d.1.weight": (c, 1, 3, 3), "a.conv2d.2.weight": (c, c, 3, 3), "a.conv2d.3.weight": (c, c, 3, 3),
            "a.conv2d.1.bias": (c, 1, 1), "a.conv2d.2.bias": (c, 1, 1), "a.conv2d.3.bias": (c, 1, 1),
            "a.conv_out.weight": (d, c * mel // 8), "a.position_embd.weight": (1500, d),
            "a.post_ln.weight": (d,), "a.post_ln.bias": (d,), "mm.a.mlp.1.weight": (d, d), "mm.a.mlp.1.bias": (d,),
            "mm.a.mlp.2.weight": (out, d), "mm.a.mlp.2.bias": (out,)}
    for i in range(meta["clip.audio.block_count"]):
        p = f"a.blk.{i}."
        want |= {p + n + ".weight": (d, d) for n in ("attn_q", "attn_k", "attn_v", "attn_out")}
        want |= {p + n + ".bias": (d,) for n in ("attn_q", "attn_k", "attn_v", "attn_out", "ln1", "ln2")}
        want |= {p + "ln1.weight": (d,), p + "ln2.weight": (d,), p + "ffn_up.weight": (ff, d), p + "ffn_up.bias": (ff,),
                 p + "ffn_down.weight": (d, ff), p + "ffn_down.bias": (d,)}
    assert shapes == want
    assert {n for n, t in types.items() if t == "F16"} == {"a.conv2d.1.weight", "a.conv2d.2.weight",
                                                          "a.conv2d.3.weight", "a.conv_out.weight"}


def test_the_audio_tower_encodes_a_clip_from_the_demo_projector(omni):
    tower = AudioTower.from_gguf(omni.mmproj)
    clips = [np.sin(np.arange(n, dtype=np.float32) / 7).astype(np.float32) for n in (8000, 16000, 27200)]
    for clip, rows, tokens in zip(clips, tower.encode(clips), audio_tokens([len(c) for c in clips])):
        assert rows.shape == (tokens, OMNI_DIMS.hidden) and np.isfinite(rows).all()


def test_the_omni_projector_is_laid_out_as_the_converter_writes_qwen3_omnis(tmp_path):
    """Written at the dimensions of the tiny Qwen3-Omni that llama.cpp's own converter turned into a projector, the
    random one has its keys, key types and values, and its tensors' names, types (F16 convolutions), shapes and
    order; the audio positions are the same sinusoids (to float32 sin/cos rounding at positions up to 1,500)."""
    from . import fixturegen_omni
    from .test_demo_media import layout

    converted = fixturegen_omni.build().mmproj_f32
    meta = {k: f.contents() for k, f in GGUFReader(converted).fields.items()}
    tensors = {t.name: np.asarray(t.data) for t in GGUFReader(converted).tensors}
    v, a = "clip.vision.", "clip.audio."
    vision = VisionDims(width=meta[v + "embedding_length"], ff=meta[v + "feed_forward_length"],
                        blocks=meta[v + "block_count"], heads=meta[v + "attention.head_count"],
                        patch=meta[v + "patch_size"], merge=meta[v + "spatial_merge_size"],
                        image_size=meta[v + "image_size"], deepstack=tuple(meta[v + "is_deepstack_layers"]))
    audio = AudioDims(width=meta[a + "embedding_length"], ff=meta[a + "feed_forward_length"],
                      blocks=meta[a + "block_count"], heads=meta[a + "attention.head_count"],
                      mel_bins=meta[a + "num_mel_bins"], conv=tensors["a.conv2d.1.weight"].shape[0],
                      positions=tensors["a.position_embd.weight"].shape[0])
    ours = write_projector(tmp_path / "mmproj.gguf", meta[v + "projection_dim"], 0, vision, audio)
    assert layout(ours) == layout(converted)
    positions = {t.name: np.asarray(t.data) for t in GGUFReader(ours).tensors}["a.position_embd.weight"]
    np.testing.assert_allclose(positions, tensors["a.position_embd.weight"], rtol=0, atol=1e-4)


def test_the_converters_layout_at_other_widths(tmp_path):
    """Every tensor of the combined projector follows the dimensions it is written with (no size is fixed)."""
    path = write_projector(tmp_path / "p.gguf", 96, 0, VisionDims(width=48, ff=80, blocks=2, heads=3,
                                                                  deepstack=(False, True)),
                           AudioDims(width=24, ff=40, blocks=1, heads=2, conv=8))
    shapes = {t.name: tuple(np.asarray(t.data).shape) for t in GGUFReader(path).tensors}
    assert shapes["mm.a.mlp.2.weight"] == (96, 24) and shapes["a.conv_out.weight"] == (24, 8 * 16)
    assert shapes["mm.0.weight"] == (4 * 48, 4 * 48) and shapes["v.deepstack.0.fc2.weight"] == (96, 4 * 48)
    assert "v.deepstack.1.fc1.weight" not in shapes and shapes["v.blk.1.attn_qkv.weight"] == (3 * 48, 48)


def test_the_demo_registry_holds_both_demos(tmp_path, monkeypatch):
    monkeypatch.setenv("CLEF_BRIDGE_CACHE", str(tmp_path / "cache"))
    registry = demo_registry(tmp_path / "models.toml")
    assert registry.default == "demo" and list(registry.models) == ["demo", OMNI_DEMO]
    spec = parse_registry({"models": {"o": {"builtin": OMNI_DEMO}}}, tmp_path / "models.toml").models["o"]
    assert spec.builtin == OMNI_DEMO and spec.gguf.name == "omni.gguf" and spec.gguf.parent.name == "omni"
    assert spec.gguf.parent.parent == registry.models["demo"].gguf.parent  # one folder, one make_demo


def _wav(seconds: float) -> bytes:
    import io
    import wave

    out = io.BytesIO()
    with wave.open(out, "wb") as w:
        w.setnchannels(1), w.setsampwidth(2), w.setframerate(16000)
        n = int(seconds * 16000)
        w.writeframes((8000 * np.sin(2 * np.pi * 440 * np.arange(n) / 16000)).astype("<i2").tobytes())
    return out.getvalue()


def test_serve_without_models_toml_answers_clef_omni_with_images_and_audio(tmp_path, monkeypatch):
    """The demo registry's Clef-omni demo answers to `clef-omni` on the Workers AI route, its usage counting each
    image's and each clip's tokens (with Qwen3-Omni's markup: start, end and a "\\n" each); a video moves it."""
    import base64

    from clef_bridge.bridge.media.images import ImageGeometry

    from .fixturegen_vision import encoded, picture
    from .serverkit import RunningServer

    monkeypatch.setenv("CLEF_BRIDGE_CACHE", str(tmp_path / "cache"))
    seconds = 1.7
    png, wav = encoded(picture(320, 256), "PNG"), _wav(seconds)
    body = {"state": "A voicemail and a photo", "questions": {"urgent": {"type": "noul", "instructions": "Urgent?"}}}
    with RunningServer(demo_registry(tmp_path / "models.toml")) as server:
        [model] = [m for m in server.request("GET", "/v1/models").json()["models"] if m["name"] == OMNI_DEMO]
        assert model["x_media"] == ["image", "audio", "video"] and "clef-omni" in model["x_aliases"]
        route = "/accounts/local/ai/run/@cf/cloudflare/clef-omni"
        text = server.request("POST", route, body)
        media = {"images": ["data:image/png;base64," + base64.b64encode(png).decode()],
                 "audio": ["data:audio/wav;base64," + base64.b64encode(wav).decode()]}
        both = server.request("POST", route, {**body, **media})
        clip = fixturegen_video.build_clips(FIXTURES / "video")["webm_sounded"].read_bytes()  # 1 s, 256 x 192
        video = server.request("POST", route, {**body, "videos": ["data:video/webm;base64," +
                                                                  base64.b64encode(clip).decode()]})
    assert text.status == 200 and both.status == 200, both.body[:400]
    assert video.status == 200, video.body[:400]  # frames and soundtrack, through the demo's random towers
    text_tokens = text.json()["result"]["usage"]["input_tokens"]
    assert video.json()["result"]["usage"]["input_tokens"] > text_tokens + 2 * 4  # two frames' tokens at least
    assert video.json()["result"]["answers"] != text.json()["result"]["answers"]
    timed = both.json()["result"]["x_timings"], video.json()["result"]["x_timings"]
    assert all(t["vision_ms"] > 0 and t["audio_tower_ms"] > 0 for t in timed)  # the towers' own times, a soundtrack's
    assert "audio_tower_ms" not in text.json()["result"]["x_timings"]
    assert both.json()["result"]["model"] == "clef-omni" and both.headers["x-clef-demo"] == "random-weights"
    assert [w for w in both.json()["result"]["x_warnings"] if "RANDOM weights" in w and "pull clef-omni" in w]
    image = ImageGeometry(32, 64 * 32 * 32, 1024 * 32 * 32).tokens(320, 256)  # Qwen3-Omni's image sizes
    [clip] = audio_tokens([int(seconds * 16000)])
    assert both.json()["result"]["usage"]["input_tokens"] == \
        text.json()["result"]["usage"]["input_tokens"] + image + 3 + clip + 3
