"""The built-in demo takes images: its random vision projector is laid out exactly as llama.cpp's converter writes
Qwen3.5's, lies beside the demo GGUF where the projector is looked for, and image requests to the demo's names
answer on every route a client sends them (Jev `assets`, Workers AI `images`, the official SDK's multipart), with
the image's tokens in `usage`."""

from __future__ import annotations

import base64
import io

import numpy as np
import pytest
from clef_bridge.bridge.config.registry import demo_registry
from clef_bridge.bridge.demo.builtins import DEMO_DIMS, DEMO_VISION, make_demo
from clef_bridge.bridge.demo.mmproj import VisionDims, write_projector
from clef_bridge.bridge.gguf.projector import find_projector
from clef_bridge.bridge.media.images import ImageGeometry
from clef_bridge.bridge.model.loading import load_checked
from gguf import GGUFReader

from . import fixturegen_vision
from .deciding import respond
from .fixturegen_vision import encoded, picture
from .serverkit import RunningServer

pytestmark = pytest.mark.integration

PNG = encoded(picture(320, 256), "PNG")
QUESTIONS = {"legible": {"type": "noul", "instructions": "Is the receipt legible?"},
             "kind": {"type": "choice", "instructions": "What is shown?",
                      "criteria": {"receipt": "a receipt", "screenshot": "a screen", "photo": None}}}
# <|vision_start|>, <|vision_end|> and the "\n" after the images: one token each in the demo's vocabulary
MARKUP_TOKENS = 3


def layout(path) -> tuple[list, list]:
    """A GGUF's keys (name, value types, value) and tensors (name, type, numpy shape), in file order."""
    reader = GGUFReader(path)
    keys = [(k, [t.name for t in f.types], f.contents()) for k, f in reader.fields.items()
            if not k.startswith("GGUF.") and k != "general.name"]
    return keys, [(t.name, t.tensor_type.name, tuple(np.asarray(t.data).shape)) for t in reader.tensors]


def test_the_demo_projector_is_laid_out_as_the_converter_writes_qwen35s(tmp_path):
    """Written at the dimensions of the vision fixture's tower (converted by llama.cpp's own converter), the random
    projector has its keys, key types and values, and its tensors' names, types, shapes and order."""
    converted = fixturegen_vision.build().mmproj_f32
    meta = {k: f.contents() for k, f in GGUFReader(converted).fields.items()}
    dims = VisionDims(width=meta["clip.vision.embedding_length"], ff=meta["clip.vision.feed_forward_length"],
                      blocks=meta["clip.vision.block_count"], heads=meta["clip.vision.attention.head_count"],
                      patch=meta["clip.vision.patch_size"], merge=meta["clip.vision.spatial_merge_size"],
                      image_size=meta["clip.vision.image_size"])
    ours = write_projector(tmp_path / "mmproj.gguf", meta["clip.vision.projection_dim"], 0, dims)
    assert layout(ours) == layout(converted)


def test_the_demo_projector_lies_beside_the_demo_gguf(tmp_path):
    files = make_demo(tmp_path / "demo")
    assert find_projector(files.gguf) == [files.mmproj]
    meta = {k: f.contents() for k, f in GGUFReader(files.mmproj).fields.items()}
    assert meta["clip.projector_type"] == "qwen3vl_merger" and not any(meta["clip.vision.is_deepstack_layers"])
    assert meta["clip.vision.projection_dim"] == DEMO_DIMS.hidden
    assert meta["clip.vision.block_count"] == DEMO_VISION.blocks


@pytest.fixture(scope="module")
def demo(tmp_path_factory):
    """The demo registry `serve` uses without a models.toml, served, and the demo model loaded in this process."""
    folder = tmp_path_factory.mktemp("demo")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("CLEF_BRIDGE_CACHE", str(folder / "cache"))
        registry = demo_registry(folder / "models.toml")
        direct = load_checked(registry.models["demo"]).model
        try:
            with RunningServer(registry) as server:
                yield server, direct
        finally:
            direct.close()


def data_url(data: bytes) -> str:
    return "data:image/png;base64," + base64.b64encode(data).decode()


def image_tokens(data: bytes) -> int:
    from PIL import Image

    return ImageGeometry().tokens(*Image.open(io.BytesIO(data)).size)


def text_only_tokens(direct, state) -> int:
    """The same prompt without its image: the marker text stays, the media block goes."""
    return respond(direct, {"model": "demo", "state": state, "questions": QUESTIONS})["usage"]["input_tokens"]


def test_models_lists_images_for_the_demo(demo):
    server, _ = demo
    [model] = [m for m in server.request("GET", "/v1/models").json()["models"] if m["name"] == "demo"]
    assert model["x_media"][0] == "image" and {"clef-flash", "clef", "jev-latest"} <= set(model["x_aliases"])


@pytest.mark.parametrize("name", ["clef-flash", "clef", "jev-latest"])
def test_jev_assets_reach_the_demo(demo, name):
    server, direct = demo
    body = {"model": name, "state": {"scan": "<receipt>", "note": "from the shop"}, "questions": QUESTIONS,
            "assets": {"<receipt>": {"type": "image", "format": "png", "data_base64": base64.b64encode(PNG).decode()}}}
    reply = server.post(body)
    assert reply.status == 200, reply.body[:400]
    answer = reply.json()
    want = respond(direct, {**body, "model": "demo"})
    assert answer["answers"] == want["answers"] and answer["usage"] == want["usage"]
    assert answer["usage"]["input_tokens"] == text_only_tokens(direct, {"scan": "[image 1]", "note": "from the shop"}) \
        + image_tokens(PNG) + MARKUP_TOKENS
    assert answer["x_timings"]["vision_ms"] > 0


@pytest.mark.parametrize("route", ["/accounts/local/ai/run/@cf/cloudflare/clef-flash",
                                   "/client/v4/accounts/local/ai/run/@cf/cloudflare/clef"])
def test_workers_ai_images_reach_the_demo(demo, route):
    server, direct = demo
    jpeg = encoded(picture(300, 200, "L", seed=1), "JPEG")
    reply = server.request("POST", route, {"state": "A receipt", "questions": QUESTIONS,
                                           "images": [data_url(PNG), "data:image/jpeg;base64," +
                                                      base64.b64encode(jpeg).decode()]})
    assert reply.status == 200, reply.body[:400]
    result = reply.json()["result"]
    assert result["usage"]["input_tokens"] == text_only_tokens(direct, "A receipt") + image_tokens(PNG) + \
        image_tokens(jpeg) + 2 * MARKUP_TOKENS - 1  # two images, one "\n" after both


def test_the_official_sdks_image_reaches_the_demo(demo):
    httpx2 = pytest.importorskip("httpx2")
    from typesafe_sdk import Choice, Image, Noul, TypeSafeClient

    server, direct = demo
    sent: list = []
    http = httpx2.Client(timeout=120, event_hooks={"request": [sent.append]})
    with TypeSafeClient(api_key="k", base_url=server.url, model="clef-flash", http_client=http) as client:
        result = client.system_one(
            state={"scan": Image(PNG)},
            questions={"legible": Noul(instructions="Is the receipt legible?"),
                       "kind": Choice(instructions="What is shown?",
                                      criteria={"receipt": "a receipt", "screenshot": "a screen", "photo": None})})
    [post] = [r for r in sent if r.method == "POST"]
    assert post.headers["content-type"].startswith("multipart/form-data; boundary=")
    want = respond(direct, {"model": "demo", "state": {"scan": "[image 1]"}, "questions": QUESTIONS,
                           "images": [data_url(PNG)]})
    assert {k: a.model_dump(exclude_none=True) for k, a in result.answers.items()} == want["answers"]
    assert result.usage.input_tokens == want["usage"]["input_tokens"] == \
        text_only_tokens(direct, {"scan": "[image 1]"}) + image_tokens(PNG) + MARKUP_TOKENS


def test_the_demo_start_benchmark_answers_every_medium():
    """`python -m benchmarks demo-start`: every answer it times is a 200 (an error would be timed as fast)."""
    from benchmarks.demo_start import run

    result = run(1)
    assert result.write_s > 0 and result.steps["ready"] < result.steps["first text answer"]
    assert set(result.statuses) == {"text", "image", "clef-omni"}
    assert all(s == [200] for s in result.statuses.values()), result.statuses
