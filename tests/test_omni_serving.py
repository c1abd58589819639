"""Clef-omni through `clef-bridge serve` on a real socket, as a user runs it: a models.toml entry of gguf, head and
mmproj (the converter's combined vision + audio projector), llama.cpp's default F16 KV cache, requests in the Workers
AI shape (`images` / `audio` as data URLs) on Cloudflare's route and on /v1/systemone, answers compared with
Cloudflare's clef-omni reference at the issue's bars (2e-3 text, 5e-3 images, 1e-2 audio; measured here with the
F16 cache: see docs/omni.md).

Audio requests need the request side of audio (bridge/media/audio.py and `audio` in bridge/media/request.py, the
`audio` branch): without it the server does not read `audio`, and that test skips.
"""

from __future__ import annotations

import base64
import importlib.util
import json
import os
import shutil
import subprocess
import sys
import urllib.error
import urllib.request

import numpy as np
import pytest

from . import fixturegen_vision
from .omni_cases import answer_problems, cases, wav
from .test_server_clients import _free_port, _wait_ready

pytestmark = pytest.mark.slow

pytest.importorskip("torch")

TOLERANCE = {"text": 2e-3, "image": 5e-3, "audio": 1e-2}
CASES = cases()
ROUTE = "/accounts/test-account/ai/run/@cf/cloudflare/clef-omni"
HAS_AUDIO_REQUESTS = importlib.util.find_spec("clef_bridge.bridge.media.audio") is not None


@pytest.fixture(scope="module")
def server(ofx, tmp_path_factory):
    """`clef-bridge serve --models models.toml`, the entry naming gguf, head and mmproj only."""
    work = tmp_path_factory.mktemp("serve")
    toml = work / "models.toml"
    toml.write_text(f'[models.omni]\ngguf = "{ofx.gguf_f32}"\nhead = "{ofx.head}"\nmmproj = "{ofx.mmproj_f32}"\n')
    port = _free_port()
    script = shutil.which("clef-bridge", path=os.path.dirname(sys.executable))
    command = [script] if script else [sys.executable, "-m", "clef_bridge.tools.cli"]
    log = (work / "serve.log").open("w")
    proc = subprocess.Popen([*command, "serve", "--models", str(toml), "--port", str(port)], stdout=log,
                            stderr=subprocess.STDOUT, env=dict(os.environ, CLEF_BRIDGE_CACHE=str(work / "cache")))
    try:
        try:
            _wait_ready(port, proc, timeout=180)
        except AssertionError:
            raise AssertionError(f"server not ready:\n{(work / 'serve.log').read_text()}") from None
        yield f"http://127.0.0.1:{port}", work / "serve.log"
    finally:
        proc.terminate()
        proc.wait(60)
        log.close()


def post(url: str, body: dict) -> tuple[int, dict]:
    request = urllib.request.Request(url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=120) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


def data_url(data: bytes, mime: str) -> str:
    return f"data:{mime};base64,{base64.b64encode(data).decode()}"


def check(omni_oracle, case, result: dict) -> float:
    """result (ours over HTTP) against the reference; returns the largest probability difference seen."""
    ref = omni_oracle.run(dict(case.body, images=[fixturegen_vision.data_url(p) for p in case.images],
                          audio=list(case.audio)))
    assert result["usage"] == ref.answer["usage"]
    tol = TOLERANCE[case.medium]
    assert answer_problems(result["answers"], ref.answer["answers"], ref.probabilities, tol) == []
    return max(abs(got - want) for q, answer in ref.answer["answers"].items()
               for got, want in zip(_probs(result["answers"][q]), _probs(answer)))


def _probs(answer: dict) -> list[float]:
    """An answer's rounded probabilities by option (the request's order for choice)."""
    return [answer["noul"]] if answer["type"] == "noul" else list(answer["probabilities"].values())


@pytest.mark.parametrize("name", ["text", "text_long", "image", "image2"])
def test_text_and_images_on_the_workers_ai_route(server, omni_oracle, name):
    url, log = server
    case = CASES[name]
    body = {k: v for k, v in case.body.items() if k != "model"}
    body["images"] = [data_url(p, "image/png") for p in case.images]
    status, reply = post(url + ROUTE, body)
    assert status == 200 and reply["success"] is True, reply
    dp = check(omni_oracle, case, reply["result"])
    print(f"{name} over HTTP (F16 KV): max |dp| of the rounded answers {dp:.1e}")
    assert reply["result"]["model"] == "clef-omni"


def test_the_served_model_and_its_names(server, omni_oracle):
    url, log = server
    status, reply = post(url + "/v1/systemone", dict(CASES["image"].body, model="omni",
                                                     images=[data_url(CASES["image"].images[0], "image/png")]))
    assert status == 200 and reply["model"] == "omni"
    check(omni_oracle, CASES["image"], reply)
    with urllib.request.urlopen(url + "/v1/models", timeout=10) as r:
        models = json.loads(r.read())["models"]
    assert [m["name"] for m in models] == ["omni"] and "clef-omni" in models[0]["x_aliases"]
    text = log.read_text()
    assert "wrote the vision half of tiny-omni-mmproj-f32.gguf" in text
    assert "qwen3vlmoe.n_deepstack_layers = 2" in text


@pytest.mark.skipif(not HAS_AUDIO_REQUESTS, reason="needs the audio branch (bridge/media/audio.py: request audio)")
@pytest.mark.parametrize("name", ["audio_0.5", "audio_1.7", "image_audio"])
def test_audio_on_the_workers_ai_route(server, omni_oracle, name):
    url, _ = server
    case = CASES[name]
    body = {k: v for k, v in case.body.items() if k != "model"}
    body["images"] = [data_url(p, "image/png") for p in case.images]
    body["audio"] = [data_url(wav(clip), "audio/wav") for clip in case.audio]  # 16-bit: decodes to the clip exactly
    status, reply = post(url + ROUTE, body)
    assert status == 200 and reply["success"] is True, reply
    print(f"{name} over HTTP (F16 KV): max |dp| of the rounded answers {check(omni_oracle, case, reply['result']):.1e}")


def test_the_wav_helper_is_exact():
    """The audio test's premise: a 16-bit WAV of tone() decodes back to the very samples the reference gets."""
    import io
    import wave

    from .omni_cases import tone

    clip = tone(0.7, 4)
    with wave.open(io.BytesIO(wav(clip))) as w:
        back = np.frombuffer(w.readframes(w.getnframes()), "<i2").astype(np.float32) / 32768
    assert np.array_equal(back, clip)
