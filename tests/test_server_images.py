"""Images over a real socket: the official SDK's multipart bodies, the Workers AI route's `images`, the
Jev API's JSON `assets`; every bad image refused with its status and body shape before any worker sees
it; text requests still batched while image requests decode alone; memory flat over 200 image requests.

The tiny Qwen3.5 with its vision tower (tests/fixturegen_vision.py) serves them; answers are compared
with the same model's in-process decide() (its equality with Cloudflare's reference is test_vision's).
"""

from __future__ import annotations

import base64
import json
import os
import threading
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace

import pytest
from backports import zstd
from clef_bridge.bridge.config.registry import ServerSpec
from clef_bridge.bridge.media.images import ImageLimits
from clef_bridge.bridge.media.request import NO_MEDIA
from clef_bridge.bridge.model.worker import MAX_MEDIA_JOBS
from clef_bridge.bridge.server.appstate import SERVED
from clef_bridge.bridge.service import decision
from clef_bridge.bridge.service.models import load_models

from . import fixturegen_vision
from .conftest import open_spec, tiny_spec
from .deciding import respond
from .fixturegen_vision import data_url, encoded, picture
from .serverkit import RunningServer, WrappedModel, refusal, registry_for, strip_extensions, wait_until
from .test_images import png_bomb

pytestmark = pytest.mark.slow

PNG = encoded(picture(320, 256), "PNG")
JPEG = encoded(picture(300, 200, "L", seed=1), "JPEG")
WEBP = encoded(picture(256, 288, seed=2), "WEBP", quality=85)
QUESTIONS = {"legible": {"type": "noul", "instructions": "Is the receipt legible?"},
             "kind": {"type": "choice", "instructions": "What is shown?",
                      "criteria": {"receipt": "a receipt", "screenshot": "a screen", "photo": None}}}
# Small enough to test every limit with small pictures; the defaults are Cloudflare's (4 MiB, 16 MP, 8 MiB)
LIMITS = ImageLimits(max_images=4, max_bytes=200_000, max_total_bytes=300_000, max_pixels=4_000_000)
MAX_TEXT_BYTES = 100_000  # max_body_bytes: the JSON text; images come on top


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


class RecordingModel(WrappedModel):
    """The real model, recording what reaches the worker: prepared requests and each batch's make-up."""

    def __init__(self, model):
        super().__init__(model)
        self.prepared, self.batches = 0, []
        self.started = threading.Event()  # a batch reached the backbone
        self.gate: threading.Event | None = None  # when given, batches wait for it

    def prepare(self, request, media=NO_MEDIA):
        self.prepared += 1
        return self._model.prepare(request, media)

    def prefill_batch(self, batch):
        self.started.set()
        if self.gate is not None:
            self.gate.wait(60)
        self.batches.append([bool(p.media.images) for p in batch])
        return self._model.prefill_batch(batch)


@pytest.fixture(scope="module")
def vfx():
    return fixturegen_vision.build()


@pytest.fixture(scope="module")
def spec(vfx):
    # n_ubatch: on the CPU a batch of requests holds one ubatch of tokens (Backbone.batch_budget); the text
    # requests of the batching test together
    return tiny_spec(vfx.base, gguf=vfx.gguf_f32, head=vfx.head, mmproj=vfx.mmproj_f32, n_ubatch=4096)


@pytest.fixture(scope="module")
def direct(spec):
    model = open_spec(spec)
    yield model
    model.close()


@pytest.fixture(scope="module")
def served(spec, tmp_path_factory):
    recorded = {}

    def loader(registry):
        loaded = load_models(registry)
        recorded.update({n: RecordingModel(item.model) for n, item in loaded.items()})
        return {n: replace(item, model=recorded[n]) for n, item in loaded.items()}

    registry = registry_for(spec, tmp_path_factory.mktemp("img") / "models.toml", images=LIMITS,
                            max_body_bytes=MAX_TEXT_BYTES)
    with RunningServer(registry, loader) as srv:
        yield srv, recorded["tiny"]


@pytest.fixture(scope="module")
def server(served):
    return served[0]


def expected(direct, state, images, questions=QUESTIONS):
    return respond(direct, {"model": "tiny", "state": state, "questions": questions,
                          "images": [data_url(d) for d in images]}, ServerSpec(images=LIMITS))


def test_official_sdk_sends_images_as_multipart(server, direct):
    httpx2 = pytest.importorskip("httpx2")
    from typesafe_sdk import Choice, Image, Noul, TypeSafeClient

    sent: list = []
    http = httpx2.Client(timeout=60, event_hooks={"request": [sent.append]})
    receipt, photo = Image(PNG), Image(JPEG)
    with TypeSafeClient(api_key="k", base_url=server.url, model="tiny", http_client=http) as client:
        with client.attach_assets(photo):  # referenced inside text: the SDK sends attached assets it finds
            result = client.system_one(
                state={"scan": receipt, "note": "from the shop"},
                questions={"legible": Noul(instructions=f"Is the receipt legible, unlike {photo}?"),
                           "kind": Choice(instructions="What is shown?",
                                          criteria={"receipt": "a receipt", "screenshot": "a screen", "photo": None})})
    [post] = [r for r in sent if r.method == "POST"]
    assert post.headers["content-type"].startswith("multipart/form-data; boundary=")
    assert post.headers["content-encoding"] == "zstd"  # the whole multipart body, as the SDK sends it
    # the state is rendered first (the receipt), then the instructions (the photo)
    want = expected(direct, {"scan": "[image 1]", "note": "from the shop"}, [PNG, JPEG],
                    {**QUESTIONS, "legible": {"type": "noul",
                                              "instructions": "Is the receipt legible, unlike [image 2]?"}})
    assert {k: a.model_dump(exclude_none=True) for k, a in result.answers.items()} == want["answers"]
    assert result.usage.input_tokens == want["usage"]["input_tokens"]


def test_official_sdk_gets_a_422_for_a_corrupt_image(server):
    pytest.importorskip("httpx2")
    from typesafe_sdk import Image, Noul, TypeSafeClient, TypeSafeUnprocessableEntityError

    with TypeSafeClient(api_key="k", base_url=server.url, model="tiny", compression=False) as client:
        with pytest.raises(TypeSafeUnprocessableEntityError, match="cannot be decoded"):
            client.system_one(state=Image(PNG[:len(PNG) // 2]), questions={"q": Noul(instructions="ok?")})


def test_workers_ai_route_takes_images(server, direct):
    body = {"state": "Receipt scan", "questions": QUESTIONS, "images": [data_url(WEBP, "image/webp"), b64(JPEG)]}
    reply = server.request("POST", "/accounts/acct/ai/run/@cf/cloudflare/tiny", body)
    assert reply.status == 200, reply.body
    payload = reply.json()
    assert payload["success"] is True
    assert strip_extensions(payload["result"]) == expected(direct, "Receipt scan", [WEBP, JPEG])
    assert {"images_ms", "vision_ms"} <= set(payload["result"]["x_timings"])


def test_workers_ai_image_objects_as_well_as_data_urls(server, direct):
    """Workers AI's {content_type, base64} objects, on Cloudflare's REST path too, answer as data URLs do."""
    objects = {"state": "Receipt scan", "questions": QUESTIONS,
               "images": [{"content_type": "image/webp", "base64": b64(WEBP)}, data_url(JPEG, "image/jpeg")]}
    for route in ("/accounts/acct/ai/run/@cf/cloudflare/tiny", "/client/v4/accounts/acct/ai/run/@cf/cloudflare/tiny"):
        reply = server.request("POST", route, objects)
        assert reply.status == 200, reply.body
        assert strip_extensions(reply.json()["result"]) == expected(direct, "Receipt scan", [WEBP, JPEG])
    for entry, reason in (({"content_type": "image/png"}, "body.images.0.base64: an image object needs base64"),
                          ({"content_type": "text/plain", "base64": b64(PNG)}, "body.images.0.content_type"),
                          ({"content_type": "image/png", "base64": b64(PNG[:300])}, "body.images.0")):
        bad = server.request("POST", "/client/v4/accounts/acct/ai/run/@cf/cloudflare/tiny",
                             {**objects, "images": [entry]})
        assert bad.status == 422 and bad.json()["success"] is False, bad.body
        [error] = bad.json()["errors"]
        assert error["code"] == 422 and reason in error["message"], error


def test_models_announce_images(server):
    [model] = server.request("GET", "/v1/models").json()["models"]
    assert model["x_media"] == ["image"]  # a vision projector: the playground offers an image input


def test_jev_assets_in_json(server, direct):
    body = {"model": "tiny", "state": "first <b>, then <a>", "questions": QUESTIONS,
            "assets": {"<a>": {"type": "image", "format": "png", "data_base64": b64(PNG)},
                       "<b>": {"type": "image", "format": "jpg", "data_base64": b64(JPEG)}}}
    assert len(json.dumps(body)) > MAX_TEXT_BYTES
    reply = server.post(body)
    assert reply.status == 200, reply.body
    assert strip_extensions(reply.json()) == expected(direct, "first [image 1], then [image 2]", [JPEG, PNG])
    too_long = server.post({**body, "state": "first <b>, then <a> " + "x" * MAX_TEXT_BYTES})
    assert too_long.status == 413 and "without its images" in too_long.json()["detail"]["message"]
    renamed = json.loads(json.dumps(body).replace("<a>", "uuid-7f3a").replace("<b>", "uuid-09c1"))
    assert strip_extensions(server.post(renamed).json()) == strip_extensions(reply.json())  # markers are stable


def multipart(parts: list[tuple[str, str, bytes]], boundary: str = "b0undary") -> tuple[bytes, dict[str, str]]:
    body = b"".join(f"--{boundary}\r\nContent-Disposition: form-data; name=\"{name}\"; filename=\"{name}\"\r\n"
                    f"Content-Type: {ctype}\r\n\r\n".encode() + data + b"\r\n" for name, ctype, data in parts)
    return body + f"--{boundary}--\r\n".encode(), {"Content-Type": f"multipart/form-data; boundary={boundary}"}


def with_assets(**named: str) -> bytes:
    return json.dumps({"model": "tiny", "state": " ".join(named), "questions": QUESTIONS,
                       "assets": {n: {"type": "image", "part": p} for n, p in named.items()}}).encode()


def bad_json(**fields) -> tuple[bytes, dict[str, str]]:
    return json.dumps({"model": "tiny", "state": "s", "questions": QUESTIONS, **fields}).encode(), {}


def image_asset(data: bytes) -> dict:
    return {"assets": {"img": {"type": "image", "format": "png", "data_base64": b64(data)}}}


TALL = encoded(picture(1, 300), "PNG")
SMALL = encoded(picture(64, 64), "PNG")
BAD = [  # (name, (body, headers), status, loc of the first problem for a 422)
    ("corrupt PNG", bad_json(**image_asset(PNG[:len(PNG) // 2])), 422, ["body", "assets", "img"]),
    ("not an image", bad_json(images=[b64(b"%PDF-1.7" + bytes(64))]), 422, ["body", "images", 0]),
    ("bad base64", bad_json(images=["data:image/png;base64,@@@@"]), 422, ["body", "images", 0]),
    ("a URL", bad_json(images=["https://example.com/receipt.png"]), 422, ["body", "images", 0]),
    ("aspect 300:1", bad_json(images=[b64(TALL)]), 422, ["body", "images", 0]),
    ("five images", bad_json(images=[b64(SMALL)] * 5), 422, ["body", "images"]),
    ("a video", bad_json(videos=["data:video/mp4;base64,AAAA"]), 422, ["body", "videos"]),
    ("asset without format", bad_json(assets={"i": {"data_base64": b64(PNG)}}), 422, ["body", "assets", "i", "format"]),
    ("pixel bomb 20000x20000", bad_json(images=[b64(png_bomb(20000))]), 413, None),
    ("over max_image_bytes", bad_json(images=[b64(encoded(picture(600, 600, seed=3), "PNG"))]), 413, None),
    ("over max_image_total_bytes", bad_json(images=[b64(encoded(picture(240, 240, seed=s), "PNG")) for s in range(3)]),
     413, None),
    ("multipart without request part", multipart([("asset-0", "image/png", PNG)]), 422, ["body", "request"]),
    ("multipart unclaimed part", multipart([("request", "application/json", with_assets(x="asset-0")),
                                            ("asset-0", "image/png", PNG), ("asset-1", "image/png", JPEG)]),
     422, ["body", "asset-1"]),
    ("multipart missing part", multipart([("request", "application/json", with_assets(x="asset-7")),
                                          ("asset-0", "image/png", PNG)]), 422, ["body", "assets", "x", "part"]),
    ("multipart truncated", (multipart([("request", "application/json", with_assets(x="asset-0")),
                                        ("asset-0", "image/png", PNG)])[0][:-40],
                             multipart([])[1]), 422, ["body"]),
    ("multipart corrupt part", multipart([("request", "application/json", with_assets(x="asset-0")),
                                          ("asset-0", "image/png", PNG[:200])]), 422, ["body", "assets", "x"]),
    ("multipart without images", multipart([("request", "application/json", bad_json()[0])]), 415, None),
    ("multipart/mixed", (multipart([])[0], {"Content-Type": "multipart/mixed; boundary=b0undary"}), 415, None),
]


@pytest.mark.parametrize("name, content, status, loc", BAD, ids=[b[0] for b in BAD])
def test_bad_images_get_their_status_and_body_shape(served, name, content, status, loc):
    server, model = served
    before = model.prepared
    body, headers = content
    refusal(server.post(None, raw=body, headers=headers), status, loc)
    assert model.prepared == before  # refused before any worker was involved


def test_workers_ai_envelope_for_a_bad_image(server):
    reply = server.request("POST", "/accounts/acct/ai/run/@cf/cloudflare/tiny",
                           {"state": "s", "questions": QUESTIONS, "images": [b64(PNG[:300])]})
    assert reply.status == 422
    [error] = reply.json()["errors"]
    assert error["code"] == 422 and "body.images.0" in error["message"] and reply.json()["success"] is False


def test_healthy_after_bad_images(server, direct):
    assert server.request("GET", "/health").status == 200
    reply = server.post({"model": "tiny", "state": "s", "questions": QUESTIONS, "images": [b64(PNG)]})
    assert reply.status == 200 and strip_extensions(reply.json()) == expected(direct, "s", [PNG])
    statuses = server.request("GET", "/metrics").body.decode()
    assert 'status="5' not in statuses


def test_decoding_runs_off_the_event_loop(served, monkeypatch):
    server, _ = served
    threads = []

    def spy(kind, inputs, settings):
        threads.append(threading.current_thread())
        return real(kind, inputs, settings)

    real = decision.decode_kind
    monkeypatch.setattr(decision, "decode_kind", spy)
    assert server.post({"model": "tiny", "state": "spy", "questions": QUESTIONS, "images": [b64(PNG)]}).status == 200
    assert threads and threads[0] is not server._thread  # the server's event loop runs in server._thread


def test_zstd_multipart_from_any_client(server, direct):
    body, headers = multipart([("request", "application/json", with_assets(scan="asset-0")),
                               ("asset-0", "application/octet-stream", WEBP)])
    reply = server.post(None, raw=zstd.compress(body), headers={**headers, "Content-Encoding": "zstd"})
    assert reply.status == 200, reply.body
    assert strip_extensions(reply.json()) == expected(direct, "[image 1]", [WEBP])


def test_text_requests_batch_while_image_requests_decode_alone(served):
    server, model = served
    worker = server.app[SERVED]["tiny"].worker
    model.batches[:], model.gate = [], threading.Event()
    model.started.clear()
    text = [{"model": "tiny", "state": f"text {i}", "questions": QUESTIONS} for i in range(4)]
    images = [{"model": "tiny", "state": f"image {i}", "questions": QUESTIONS, "images": [b64(PNG)]} for i in range(2)]
    try:
        with ThreadPoolExecutor(8) as pool:
            first = pool.submit(server.post, text[0])  # holds the worker (at the gate) while the rest queue
            wait_until(model.started.is_set, "the first text request in the worker")
            replies = [first] + [pool.submit(server.post, b) for b in text[1:] + images]
            wait_until(lambda: worker.depth == 5, "the other 5 requests in the queue")
            model.gate.set()
            assert [r.result().status for r in replies] == [200] * 6
    finally:
        model.gate.set()
        model.gate = None
    image_batches = [b for b in model.batches if any(b)]
    assert len(image_batches) == 2 and all(b == [True] for b in image_batches)
    assert max(len(b) for b in model.batches if not any(b)) == 3, model.batches  # the 3 queued text requests


def test_no_projector_is_a_422_that_says_how_to_add_one(vfx, tmp_path):
    registry = registry_for(tiny_spec(vfx.base, gguf=vfx.gguf_f32, head=vfx.head), tmp_path / "models.toml",
                            max_body_bytes=MAX_TEXT_BYTES)
    with RunningServer(registry) as srv:
        reply = srv.post({"model": "tiny", "state": "s", "questions": QUESTIONS, "images": [b64(SMALL)]})
        assert reply.status == 422
        [problem] = reply.json()["detail"]
        assert problem["type"] == "images_not_supported" and "mmproj" in problem["msg"]
        assert srv.post({"model": "tiny", "state": "s", "questions": QUESTIONS}).status == 200
        # a server whose models take no images caps bodies at max_body_bytes alone
        big = srv.post({"model": "tiny", "state": "s", "questions": QUESTIONS, "images": [b64(PNG)]})
        assert big.status == 413 and big.json()["detail"]["error_type"] == "request_too_large"


def rss_mib() -> float:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


@pytest.mark.skipif(not os.path.exists("/proc/self/statm"), reason="reads RSS from /proc")
def test_memory_is_flat_over_200_image_requests(server):
    """The whole path (base64, multipart, Pillow, the vision tower, the chunked prefill, the head) 200 times,
    over four formats of one size, 256x256 once resized (llama.cpp plans a new graph for each new image
    shape: seconds on a busy machine; test_vision's decodes cover four shapes)."""
    pictures = [encoded(picture(200, 200, mode, seed=i), fmt) for i, (mode, fmt) in enumerate(
        [("RGB", "PNG"), ("RGBA", "PNG"), ("L", "JPEG"), ("RGB", "WEBP")])]
    samples = []
    for i in range(200):
        data = pictures[i % len(pictures)]
        if i % 2:
            reply = server.post({"model": "tiny", "state": f"n{i}", "questions": QUESTIONS, "images": [b64(data)]})
        else:
            body, headers = multipart([("request", "application/json", with_assets(**{f"n{i}": "asset-0"})),
                                       ("asset-0", "image/png", data)])
            reply = server.post(None, raw=body, headers=headers)
        assert reply.status == 200, reply.body
        if i in (39, 199):
            samples.append(rss_mib())
    print(f"RSS after 40 image requests {samples[0]:.1f} MiB, after 200 {samples[1]:.1f} MiB")
    assert samples[1] - samples[0] < 8  # one leaked image (pixels, embeddings or hidden states) per request: > 20


def test_waiting_image_requests_are_bounded(served):
    """Queued image requests hold their pixels: beyond max_media_jobs per model they get 429, text does not."""
    server, _ = served
    worker = server.app[SERVED]["tiny"].worker
    worker.max_media_jobs = 0
    try:
        reply = server.post({"model": "tiny", "state": "full", "questions": QUESTIONS, "images": [b64(PNG)]})
        assert reply.status == 429 and "retry-after" in reply.headers
        assert "image or audio requests waiting" in reply.json()["detail"]["message"]
        assert server.post({"model": "tiny", "state": "text", "questions": QUESTIONS}).status == 200
    finally:
        worker.max_media_jobs = MAX_MEDIA_JOBS


def test_a_failing_vision_tower_is_a_503_for_that_request_only(served, monkeypatch):
    from clef_bridge.bridge.gguf.projector import ProjectorError

    server, model = served

    def fail(pixels):
        raise ProjectorError("the vision tower failed on a 256x256 image (out of memory?)")

    monkeypatch.setattr(model._model.projector, "encode", fail)
    reply = server.post({"model": "tiny", "state": "oom", "questions": QUESTIONS, "images": [b64(PNG)]})
    assert reply.status == 503 and "retry-after" in reply.headers
    assert reply.json()["detail"]["error_type"] == "projector_error"
    monkeypatch.undo()
    assert server.post({"model": "tiny", "state": "after", "questions": QUESTIONS, "images": [b64(PNG)]}).status == 200
