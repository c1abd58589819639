"""Audio over a real socket: the Jev API's JSON `assets`, the Workers AI route's `audio` data URLs and multipart
parts reach the model as the reference's samples; every limit, garbage clip, video and audio sent to a model
without audio refused with its status and body shape before any worker sees it; /v1/models and the OpenAPI
description say who takes audio.

No served model hears audio on this branch: the tiny text model stands in for one, told it takes audio; it
records the samples that reach prepare() and answers for the text (markers included) alone.
"""

from __future__ import annotations

import json
from dataclasses import replace

import numpy as np
import pytest
from clef_bridge.bridge.config.registry import Registry, ServerSpec
from clef_bridge.bridge.media.audio import AudioLimits, decode, sniff
from clef_bridge.bridge.media.request import IMAGE, NO_MEDIA, Media
from clef_bridge.bridge.service.models import load_models

from .conftest import tiny_spec
from .deciding import respond
from .serverkit import RunningServer, WrappedModel, refusal, strip_extensions
from .test_audio import b64, clip, data_url
from .test_server_images import bad_json, multipart

pytestmark = pytest.mark.integration

QUESTIONS = {"calm": {"type": "noul", "instructions": "Is the caller calm?"},
             "topic": {"type": "choice", "instructions": "What is the call about?",
                       "criteria": {"billing": "an invoice", "outage": "a service is down", "other": None}}}
LIMITS = AudioLimits(max_clips=2, max_bytes=120_000, max_seconds=2.0)  # small, to reach each with small clips
MAX_TEXT_BYTES = 50_000  # max_body_bytes: the JSON text; audio comes on top where a model takes it
WAV = clip(1.5, 16000, 1, "wav")  # 48 KB, 64 KB in base64: over MAX_TEXT_BYTES alone
MP3 = clip(1.2, 44100, 2, "mp3")


class Recording(WrappedModel):
    """The real model, recording what reaches its worker; `hears` makes it claim audio."""

    def __init__(self, model, hears: bool):
        super().__init__(model)
        self.hears, self.prepared, self.heard = hears, 0, []

    @property
    def takes_audio(self) -> bool:
        return self.hears

    @property
    def media(self) -> tuple[str, ...]:
        return ("audio",) if self.hears else ()

    def prepare(self, request, media=NO_MEDIA):
        self.prepared += 1
        if self.hears:
            self.heard.append(media.audio)
            # the text alone (the omni branch's model hears the rest); the digests still key the answer
            return self._model.prepare(request, Media({IMAGE: media.images}, media.digests))
        return self._model.prepare(request, media)


@pytest.fixture(scope="module")
def served(fx, tmp_path_factory):
    recorded = {}

    def loader(registry):
        loaded = load_models(registry)
        recorded.update({n: Recording(item.model, hears=n == "tiny") for n, item in loaded.items()})
        return {n: replace(item, model=recorded[n]) for n, item in loaded.items()}

    spec = tiny_spec(fx)
    registry = Registry(path=tmp_path_factory.mktemp("audio") / "models.toml", default="tiny",
                        models={"tiny": spec, "deaf": replace(spec, name="deaf")},
                        server=ServerSpec(audio=LIMITS, max_body_bytes=MAX_TEXT_BYTES))
    with RunningServer(registry, loader) as srv:
        yield srv, recorded


@pytest.fixture(scope="module")
def server(served):
    return served[0]


def samples(data: bytes) -> np.ndarray:
    return decode(data, sniff(data, ()), ())


def expected(tiny_model, state, questions=QUESTIONS) -> dict:
    return respond(tiny_model, {"model": "tiny", "state": state, "questions": questions})


def test_models_say_who_takes_audio(server):
    models = {m["name"]: m for m in server.request("GET", "/v1/models").json()["models"]}
    assert models["tiny"]["x_media"] == ["audio"] and models["deaf"]["x_media"] == []


def test_jev_assets_reach_the_model_as_the_references_samples(served, tiny_model):
    server, models = served
    body = {"model": "tiny", "state": {"call": "<rec-2>", "note": "then <rec-1>"}, "questions": QUESTIONS,
            "assets": {"<rec-1>": {"type": "audio", "format": "mp3", "data_base64": b64(MP3)},
                       "<rec-2>": {"type": "audio", "format": "wav", "data_base64": b64(WAV)}}}
    assert len(json.dumps(body)) > MAX_TEXT_BYTES  # the audio allowance comes on top of the text's
    reply = server.post(body)
    assert reply.status == 200, reply.body
    heard = models["tiny"].heard[-1]
    assert len(heard) == 2 and np.array_equal(heard[0], samples(WAV)) and np.array_equal(heard[1], samples(MP3))
    want = expected(tiny_model, {"call": "[audio 1]", "note": "then [audio 2]"})
    assert strip_extensions(reply.json()) == want
    assert {"audio_ms", "audio_tower_ms"} <= set(reply.json()["x_timings"])  # decoding, then the tower


def test_workers_ai_audio_data_urls_in_order(served, tiny_model):
    server, models = served
    body = {"state": "A support call", "questions": QUESTIONS,
            "audio": [data_url(MP3, "audio/mpeg"), data_url(WAV)]}
    reply = server.request("POST", "/accounts/acct/ai/run/@cf/cloudflare/tiny", body)
    assert reply.status == 200, reply.body
    assert reply.json()["success"] is True
    assert strip_extensions(reply.json()["result"]) == expected(tiny_model, "A support call")
    heard = models["tiny"].heard[-1]
    assert [h.size for h in heard] == [samples(MP3).size, samples(WAV).size]
    assert np.array_equal(heard[0], samples(MP3)) and np.array_equal(heard[1], samples(WAV))


def test_multipart_audio_parts(served):
    server, models = served
    request = json.dumps({"model": "tiny", "state": "listen to <v>", "questions": QUESTIONS,
                          "assets": {"<v>": {"type": "audio", "part": "asset-0"}}}).encode()
    raw, headers = multipart([("request", "application/json", request), ("asset-0", "audio/wav", WAV)])
    reply = server.post(None, raw=raw, headers=headers)
    assert reply.status == 200, reply.body
    assert np.array_equal(models["tiny"].heard[-1][0], samples(WAV))


def audio_json(model: str = "tiny", **fields) -> tuple[bytes, dict[str, str]]:
    return json.dumps({"model": model, "state": "s", "questions": QUESTIONS, **fields}).encode(), {}


LONG = clip(2.5, 8000, 1, "wav")  # 40 KB: within max_audio_bytes, over max_audio_seconds
BIG = clip(4.0, 16000, 1, "wav")  # 128 KB: over max_audio_bytes
BAD = [  # (name, (body, headers), status, loc of the first problem for a 422, what the message must name)
    ("three clips", audio_json(audio=[b64(MP3)] * 3), 422, ["body", "audio"], "max_audio_clips"),
    ("three clip assets", audio_json(assets={f"<{i}>": {"type": "audio", "format": "mp3", "data_base64": b64(MP3)}
                                             for i in range(3)}), 422, ["body", "assets"], "max_audio_clips"),
    ("over max_audio_bytes", audio_json(audio=[b64(BIG)]), 413, None, "max_audio_bytes"),
    ("over max_audio_seconds", audio_json(audio=[data_url(LONG)]), 413, None, "max_audio_seconds"),
    ("not audio", audio_json(audio=[b64(b"%PDF-1.7" + bytes(64))]), 422, ["body", "audio", 0], "WAV"),
    ("corrupt WAV", audio_json(audio=[b64(WAV[:30])]), 422, ["body", "audio", 0], "corrupt"),
    ("garbage after an ID3 tag", audio_json(audio=[b64(b"ID3\x04\x00\x00\x00\x00\x00\x10" + bytes(range(256)) * 4)]),
     422, ["body", "audio", 0], "ID3"),
    ("bad base64", audio_json(audio=["data:audio/wav;base64,@@@@"]), 422, ["body", "audio", 0], "base64"),
    ("a URL", audio_json(audio=["https://example.com/call.mp3"]), 422, ["body", "audio", 0], "fetches nothing"),
    ("asset without format", audio_json(assets={"a": {"type": "audio", "data_base64": b64(WAV)}}), 422,
     ["body", "assets", "a", "format"], "wav, mp3"),
    ("a model without audio", audio_json("deaf", audio=[b64(WAV)]), 422, ["body", "audio"], "takes no audio"),
    # a model without video refuses them before reading them (admission in cost order): not the bytes' "not an MP4"
    ("videos", audio_json(videos=["data:video/mp4;base64,AAAA"]), 422, ["body", "videos"], "takes no videos"),
    ("a video asset", audio_json(assets={"m": {"type": "video", "format": "mp4", "data_base64": "AAAA"}}), 422,
     ["body", "assets", "m"], "takes no videos"),
    ("multipart unclaimed audio part", multipart([("request", "application/json", bad_json()[0]),
                                                  ("asset-0", "audio/wav", WAV)]), 422, ["body", "asset-0"], "claimed"),
]


@pytest.mark.parametrize("name, content, status, loc, names", BAD, ids=[b[0] for b in BAD])
def test_bad_audio_is_refused_before_any_worker(served, name, content, status, loc, names):
    server, models = served
    before = {n: m.prepared for n, m in models.items()}
    body, headers = content
    problem = refusal(server.post(None, raw=body, headers=headers), status, loc)
    assert names in problem["msg" if status == 422 else "message"]
    assert status == 422 or problem["error_type"] == "audio_too_large"
    assert {n: m.prepared for n, m in models.items()} == before  # no worker was involved
    assert not server.tracebacks()


def test_no_audio_and_video_reasons_in_full(server):
    deaf = server.post(json.loads(audio_json("deaf", audio=[b64(WAV)])[0]))
    [problem] = deaf.json()["detail"]
    assert problem["type"] == "audio_not_supported" and "'deaf' takes no audio" in problem["msg"]
    video = server.request("POST", "/accounts/acct/ai/run/@cf/cloudflare/tiny",
                           {"state": "s", "questions": QUESTIONS, "videos": ["data:video/webm;base64,AAAA"]})
    [error] = video.json()["errors"]
    assert video.status == 422 and error["code"] == 422 and "'tiny' takes no videos: Clef-omni reads them" in \
        error["message"]


def test_workers_ai_envelope_for_audio_over_a_limit(server):
    reply = server.request("POST", "/accounts/acct/ai/run/@cf/cloudflare/tiny",
                           {"state": "s", "questions": QUESTIONS, "audio": [data_url(LONG)]})
    assert reply.status == 413 and reply.json()["success"] is False
    [error] = reply.json()["errors"]
    assert error["code"] == 3006 and "max_audio_seconds" in error["message"] and "body.audio.0" in error["message"]


def test_openapi_documents_audio(server):
    spec = server.request("GET", "/openapi.json").json()["components"]["schemas"]
    request = spec["SystemOneRequest"]["properties"]
    # null is no audio, as the validation always took it (the published schema says so since it is declared once)
    assert request["audio"]["type"] == ["array", "null"] and "WAV or MP3" in request["audio"]["description"]
    assert "MP4, WebM or Matroska" in request["videos"]["description"]
    assert spec["Asset"]["properties"]["type"]["enum"] == ["image", "audio", "video", None]
    assert {"wav", "mp3"} <= set(spec["Asset"]["properties"]["format"]["enum"])
    assert "x_media" in spec["ModelList"]["properties"]["models"]["items"]["properties"]
