"""Videos through `clef-bridge serve` on a real socket (the tiny Clef-omni of tests/test_omni_serving.py, llama.cpp's
default F16 KV cache): Workers AI's `videos` (data URLs and {content_type, base64}), the Jev API's `assets` of type
video and multipart video parts, answered as the reference answers (tests/fixturegen_video.py); the limits refused
with their status and key before any worker is held."""

from __future__ import annotations

import base64
import json
import urllib.request

import numpy as np
import pytest

from . import fixturegen_video
from .omni_cases import SCHEMA, STATE, answer_problems
from .test_omni_serving import ROUTE, data_url, post, server  # noqa: F401 (server: the fixture)
from .test_video_headers import mp4

pytestmark = pytest.mark.slow

TOLERANCE = 1e-2


@pytest.fixture(scope="module")
def vfx():
    return fixturegen_video.build()


def same_as_reference(vfx, case: str, result: dict) -> None:
    want = vfx.load()[case]
    probs = {q: np.array(p) for q, p in want["probabilities"].items()}
    assert result["usage"] == want["answer"]["usage"]
    assert answer_problems(result["answers"], want["answer"]["answers"], probs, TOLERANCE) == []


def test_videos_on_the_workers_ai_route(server, vfx):  # noqa: F811
    url, _ = server
    clip = vfx.clips["mkv_sounded"].read_bytes()
    status, reply = post(url + ROUTE, {"state": STATE, "questions": SCHEMA,
                                       "videos": [data_url(clip, "video/x-matroska")]})
    assert status == 200 and reply["success"] is True, reply
    same_as_reference(vfx, "video_mkv", reply["result"])
    both = [{"content_type": "video/mp4", "base64": base64.b64encode(vfx.clips["mp4_sounded_big"].read_bytes())
             .decode()}, data_url(vfx.clips["webm_sounded"].read_bytes(), "video/webm")]
    status, reply = post(url + ROUTE, {"state": STATE, "questions": SCHEMA, "videos": both})
    assert status == 200, reply
    same_as_reference(vfx, "video2", reply["result"])


def test_a_video_asset_and_a_multipart_part(server, vfx):  # noqa: F811
    url, _ = server
    clip = vfx.clips["mp4_silent_small"].read_bytes()
    status, reply = post(url + "/v1/systemone", {
        "model": "omni", "state": STATE, "questions": SCHEMA,
        "assets": {"<clip>": {"type": "video", "format": "mp4", "data_base64": base64.b64encode(clip).decode()}}})
    assert status == 200, reply
    same_as_reference(vfx, "video_silent", reply)
    assert reply["x_timings"]["videos_ms"] > 0 and reply["x_timings"]["vision_ms"] > 0
    boundary = "clefvideo"
    request = json.dumps({"model": "omni", "state": STATE, "questions": SCHEMA,
                          "assets": {"<clip>": {"type": "video", "part": "asset-0"}}}).encode()
    body = b"".join([f"--{boundary}\r\nContent-Disposition: form-data; name=\"request\"\r\nContent-Type: "
                     f"application/json\r\n\r\n".encode(), request, b"\r\n",
                     f"--{boundary}\r\nContent-Disposition: form-data; name=\"asset-0\"; filename=\"c.mp4\"\r\n"
                     f"Content-Type: video/mp4\r\n\r\n".encode(), clip, b"\r\n", f"--{boundary}--\r\n".encode()])
    sent = urllib.request.Request(url + "/v1/systemone", data=body,
                                  headers={"Content-Type": f"multipart/form-data; boundary={boundary}"})
    with urllib.request.urlopen(sent, timeout=120) as r:
        same_as_reference(vfx, "video_silent", json.loads(r.read()))


MIME = {".mp4": "video/mp4", ".webm": "video/webm", ".mkv": "video/x-matroska", ".png": "image/png",
        ".wav": "audio/wav"}


def _urls(vfx, names) -> list[str]:
    return [data_url(vfx.clips[n].read_bytes(), MIME[vfx.clips[n].suffix]) for n in names]


@pytest.mark.parametrize("case", fixturegen_video.ISSUE38)
def test_issue38_clips_answer_as_the_reference(server, vfx, case):  # noqa: F811
    """Clips as users send them (MPEG-4 at 30 fps, 3 and 5 kept frames, FFV1 + PCM, VP9 + Opus at 48 kHz, one frame
    and 8 kHz, two frames of odd size with 5.1 sound, a variable frame rate, a phone's clip rotated 90 degrees;
    several videos, videos beside an image and a clip): the prompt's token count the reference's, every answer
    within 1e-2; no answer departs from the reference knowingly, so none says anything in x_warnings (an answer
    with a soundtrack once warned of llama.cpp's mask, decoded around since)."""
    url, _ = server
    spec = fixturegen_video.CASES[case]
    body = {"state": STATE, "questions": SCHEMA, "videos": _urls(vfx, spec.videos)}
    body |= {"images": _urls(vfx, spec.images)} if spec.images else {}
    body |= {"audio": _urls(vfx, spec.audio)} if spec.audio else {}
    status, reply = post(url + ROUTE, body)
    assert status == 200 and reply["success"] is True, reply
    want = vfx.load()[case]
    assert reply["result"]["usage"]["input_tokens"] == len(want["input_ids"])
    same_as_reference(vfx, case, reply["result"])
    assert "x_warnings" not in reply["result"]


@pytest.mark.parametrize("videos, status, key", [
    ([mp4(3600.0, 64, 64, 10, 10)], 413, "max_video_seconds"),  # an hour claimed in a few hundred bytes
    ([mp4(1.0, 64, 64, 2, 10)] * 3, 422, "max_videos"),
])
def test_limits_are_refused_naming_their_key(server, videos, status, key):  # noqa: F811
    url, _ = server
    code, reply = post(url + "/v1/systemone", {"model": "omni", "state": STATE, "questions": SCHEMA,
                                               "videos": [data_url(v, "video/mp4") for v in videos]})
    assert code == status and key in json.dumps(reply), reply
