"""The decision service (bridge/service) with fake models: no socket, no llama.cpp; the real worker and coalescer.

Validation once, media refused before decoding (unsupported kind, full media queue), admission once (a place held
while a request is encoded), coalescing in flight and from the cache (before any medium is decoded),
reject_if_busy, a front door's contract in the same 422, the Decision's fields and timings.
"""

from __future__ import annotations

import asyncio
import base64
import threading
from types import SimpleNamespace

import numpy as np
import pytest
from clef_bridge.bridge.config.registry import ServerSpec, UnknownModel
from clef_bridge.bridge.media.images import ImageGeometry
from clef_bridge.bridge.media.request import AUDIO, IMAGE, VIDEO, Media
from clef_bridge.bridge.model.clef_model import Scored, Timings
from clef_bridge.bridge.model.worker import Busy, InferenceWorker, Overloaded, RequestOptions
from clef_bridge.bridge.server.doors.systemone import no_model_warning
from clef_bridge.bridge.service import decision as service_module
from clef_bridge.bridge.service.coalesce import Coalescer, request_key
from clef_bridge.bridge.server.doors.systemone import systemone_body
from clef_bridge.bridge.service import systemone as systemone_module
from clef_bridge.bridge.service.decision import DecisionInput, DecisionService
from clef_bridge.bridge.service.systemone import Contract, parse_systemone
from clef_bridge.bridge.service.errors import DeadlineExceeded
from clef_bridge.bridge.service.local import LocalService
from clef_bridge.head.answer import NoulAnswer
from clef_bridge.head.errors import Problem, RequestInvalid
from clef_bridge.head.schema import DecisionRequest, Limits
from clef_bridge.tools.drift import drift

from .fixturegen_vision import encoded, picture
from .omni_cases import wav

pytestmark = pytest.mark.unit

PNG = encoded(picture(64, 64, seed=3), "PNG")
WAV = wav(np.zeros(1600, np.float32))
BUSY_REFUSED = RequestOptions(reject_if_busy=True)
BODY = {"model": "fake", "state": "a message", "questions": {"urgent": {"type": "noul", "instructions": "Urgent?"}}}


def with_media(body: dict, **media: bytes) -> dict:
    return {**body, **{field: [base64.b64encode(data).decode()] for field, data in media.items()}}


class FakeModel:
    """What the worker and the service ask of a ClefModel; records what reaches it."""

    def __init__(self, name: str = "fake", media: tuple[str, ...] = (), gate: threading.Event | None = None):
        self.name, self.media, self.gate = name, media, gate
        self.limits = Limits()
        self.backbone = SimpleNamespace(on_gpu=False, decode_budget=4096, batch_budget=4096)
        self.n_seq_max = 4
        # a model that takes images or videos has a projector, whose geometry sizes both
        self.geometry = ImageGeometry(min_pixels=64 * 64, max_pixels=64 * 64) if {IMAGE, VIDEO} & set(media) else None
        self.prepared: list[tuple[object, Media]] = []
        self.prefilled: list[str] = []  # the states of the requests that reached the backbone
        self.started = threading.Event()

    def prepare(self, request, media):
        self.prepared.append((request, media))
        ids = [0] * (3 + len(request.questions))
        return SimpleNamespace(request=request, media=media, has_media=bool(media), encoded=SimpleNamespace(
            input_ids=ids))

    def prefill_batch(self, batch):
        self.prefilled += [p.request.state for p in batch]
        self.started.set()
        if self.gate is not None:
            self.gate.wait(5)
        return [SimpleNamespace(prepared=p, batch_size=len(batch)) for p in batch]

    def head_input(self, item):
        return item

    def score(self, items):
        return [self._score(item) for item in items]

    @staticmethod
    def _score(item):
        request = item.prepared.request
        logits = tuple((q, np.array([0.5, -0.5])) for q in request.questions)
        timings = Timings(0.001, 0.002, 0.003, item.batch_size, 2, vision=0.004 if item.prepared.media.images else 0)
        return Scored(tuple(NoulAnswer(q.id, 0.73) for q in request.questions),
                      len(item.prepared.encoded.input_ids), timings, logits)


class Joins(list):
    """The coalescer's record of shared answers, with an event set at each: a test waits for a join, not a time."""

    def __init__(self):
        super().__init__()
        self.event = asyncio.Event()

    def append(self, source: str) -> None:
        super().append(source)
        self.event.set()


def service_for(*models: FakeModel, cache_size: int = 0, shared: list | None = None, max_media_jobs: int = 8,
                timeout_s: float | None = 5.0) -> tuple[DecisionService, dict[str, InferenceWorker]]:
    workers = {m.name: InferenceWorker(m, 8, overlap=False, max_media_jobs=max_media_jobs) for m in models}
    names = {**{m.name: m.name for m in models}, "alias": models[0].name}
    on_shared = (lambda model, source: shared.append(source)) if shared is not None else (lambda model, source: None)
    return DecisionService(ServerSpec(), Coalescer(cache_size, on_shared), timeout_s, workers, names), workers


async def decide(service: DecisionService, body, model, options: RequestOptions = RequestOptions(),
                 contract: Contract | None = None, resolved=lambda name: None):
    """A System One body's Decision, parsed as its door parses it."""
    parsed = await parse_systemone(body, model, service.server, contract=contract)
    return await service.decide(DecisionInput(parsed.request, model, parsed.media, options), resolved)


def run(workers: dict[str, InferenceWorker], coro_fn):
    """coro_fn() on a fresh event loop with the workers started, stopped afterwards."""
    for worker in workers.values():
        worker.start()
    try:
        return asyncio.run(coro_fn())
    finally:
        for worker in workers.values():
            worker.stop()


def test_a_decision_carries_its_model_answer_tokens_timings_and_logits():
    model = FakeModel()
    service, workers = service_for(model)
    resolved = []
    decision = run(workers, lambda: decide(service, BODY, "alias", resolved=resolved.append))
    assert decision.model == "fake" and resolved == ["fake"]  # an alias resolves to the served name
    assert decision.requested == "fake" and decision.answers == (NoulAnswer("urgent", 0.73),)  # the body's model
    # Jev's and Workers AI's shape of it
    assert systemone_body(decision) == {"model": "fake", "answers": {"urgent": {"type": "noul", "noul": 0.73}},
                                        "usage": {"input_tokens": 4, "output_tokens": 0}}
    assert decision.input_tokens == 4 and decision.reused_tokens == 2 and decision.batch_size == 1
    assert list(decision.timings) == ["queue", "tokenize", "backbone", "head"]  # text: no media stage
    assert [(q.id, z.tolist()) for q, z in decision.logits] == [("urgent", [0.5, -0.5])]


def test_the_body_is_validated_once_and_the_model_gets_the_parsed_request(monkeypatch):
    calls = []
    real = systemone_module.parse_request
    monkeypatch.setattr(systemone_module, "parse_request", lambda *a, **k: calls.append(a) or real(*a, **k))
    model = FakeModel()
    service, workers = service_for(model)
    run(workers, lambda: decide(service, BODY, "fake"))
    assert len(calls) == 1 and isinstance(model.prepared[0][0], DecisionRequest)


def test_an_invalid_body_is_one_422_and_never_reaches_the_model():
    model = FakeModel()
    service, workers = service_for(model)
    bad = {"model": "fake", "state": 3, "questions": {"q": {"type": "maybe"}}}
    with pytest.raises(RequestInvalid) as info:
        run(workers, lambda: decide(service, bad, "fake"))
    assert len(info.value.problems) >= 2 and model.prepared == []


def test_an_unknown_model_is_refused_by_name():
    service, workers = service_for(FakeModel())
    with pytest.raises(UnknownModel):
        run(workers, lambda: decide(service, {**BODY, "model": "nope"}, "nope"))


def test_a_misspelt_name_is_offered_only_a_model_that_takes_the_requests_media():
    """An audio request for clef-omni where only the text model clef is served gets no 'did you mean clef?'."""
    service, workers = service_for(FakeModel("clef"), FakeModel("clef-vision", media=(IMAGE,)))
    bodies = {"text": BODY, "audio": with_media(BODY, audio=WAV), "image": with_media(BODY, images=PNG)}

    async def main():
        messages = {}
        for label, body in bodies.items():
            with pytest.raises(UnknownModel) as info:
                await decide(service, {**body, "model": "clef-omni"}, "clef-omni")
            messages[label] = str(info.value)
        return messages

    messages = run(workers, main)
    assert "did you mean clef?" in messages["text"]
    assert "did you mean" not in messages["audio"] and "served: clef, " in messages["audio"]
    assert "did you mean clef-vision?" in messages["image"]


def media_work(monkeypatch) -> list[str]:
    """What the service does to a request's media, in order: "base64" (decoded, checked from headers), then
    "decode"."""
    done: list[str] = []
    referenced, decode = service_module.referenced, service_module.decode_kind
    monkeypatch.setattr(service_module, "referenced", lambda *a: done.append("base64") or referenced(*a))
    monkeypatch.setattr(service_module, "decode_kind", lambda *a: done.append("decode") or decode(*a))
    return done


@pytest.mark.parametrize("field, data, kind", [("images", PNG, "images_not_supported"),
                                               ("audio", WAV, "audio_not_supported"),
                                               ("images", b"not an image at all", "images_not_supported")])
def test_media_the_model_cannot_take_are_refused_before_their_base64_is_read(monkeypatch, field, data, kind):
    """Admission in cost order (issue 39): the model, then what it takes, from the body's fields alone."""
    done = media_work(monkeypatch)
    model = FakeModel()
    service, workers = service_for(model)
    with pytest.raises(RequestInvalid) as info:
        run(workers, lambda: decide(service, with_media(BODY, **{field: data}), "fake"))
    assert [p.type for p in info.value.problems] == [kind] and done == [] and model.prepared == []


def test_an_unknown_model_is_refused_before_any_media_is_read(monkeypatch):
    done = media_work(monkeypatch)
    service, workers = service_for(FakeModel(media=(IMAGE,)))
    with pytest.raises(UnknownModel):
        run(workers, lambda: decide(service, with_media({**BODY, "model": "nope"}, images=PNG), "nope"))
    assert done == []


def test_a_full_media_queue_refuses_before_any_media_is_decoded(monkeypatch):
    """Admitted once, after the key: the base64 is read (an identical request's answer is joined first, below),
    the media are never decoded for a request refused."""
    done = media_work(monkeypatch)
    model = FakeModel(media=(IMAGE,))
    service, workers = service_for(model, max_media_jobs=0)
    with pytest.raises(Overloaded, match="image or audio requests"):
        run(workers, lambda: decide(service, with_media(BODY, images=PNG), "fake"))
    assert done == ["base64"] and model.prepared == []


def test_a_repeated_media_request_is_answered_without_decoding_its_media_again(monkeypatch):
    """The key is computed from the media's digests before any decoding: a cached answer costs no decode."""
    done = media_work(monkeypatch)
    model = FakeModel(media=(IMAGE,))
    shared: list[str] = []
    service, workers = service_for(model, cache_size=4, shared=shared)

    async def main():
        return [await decide(service, with_media(BODY, images=PNG), "fake") for _ in range(2)]

    first, second = run(workers, main)
    assert done == ["base64", "decode", "base64"] and shared == ["cache"] and len(model.prepared) == 1
    assert "images" in first.timings and "images" not in second.timings and second.answers == first.answers


class Holding(FakeModel):
    """A model whose prepare() waits for a gate: requests stay admitted, held between admission and the queue."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.encoding, self.release = threading.Semaphore(0), threading.Event()

    def prepare(self, request, media):
        self.encoding.release()
        self.release.wait(5)
        if request.state == "refused":
            raise RequestInvalid([Problem(("body", "state"), "refused while encoded", "value_error")])
        return super().prepare(request, media)


def test_requests_being_encoded_hold_their_place_in_the_queue():
    """Admission is checked once: a request admitted holds its place while it is encoded, so the queue cannot admit
    more than max_queue however many are encoded at once; a refusal while encoding gives its place back."""
    model = Holding()
    service, workers = service_for(model)
    workers["fake"].max_queue = 2

    async def main():
        loop = asyncio.get_running_loop()
        held = [asyncio.ensure_future(decide(service, {**BODY, "state": s}, "fake")) for s in ("one", "refused")]
        for _ in held:
            await loop.run_in_executor(None, model.encoding.acquire, True, 5)
        with pytest.raises(Overloaded, match="has 2 requests waiting"):  # refused before it is encoded
            await decide(service, {**BODY, "state": "three"}, "fake")
        model.release.set()
        one, refused = await asyncio.gather(*held, return_exceptions=True)
        assert isinstance(refused, RequestInvalid) and one.answers
        return await decide(service, {**BODY, "state": "four"}, "fake")  # both places given back

    assert run(workers, main).answers and [r.state for r, _ in model.prepared] == ["one", "four"]


def test_an_invalid_text_is_refused_at_the_door_before_any_media_is_decoded(monkeypatch):
    """The door validates the text (microseconds) and only finds the media; nothing of them is decoded for a request
    refused there."""
    done = media_work(monkeypatch)
    model = FakeModel(media=(IMAGE,))
    service, workers = service_for(model)
    with pytest.raises(RequestInvalid):
        run(workers, lambda: decide(service, with_media({**BODY, "state": 3}, images=PNG), "fake"))
    assert done == [] and model.prepared == []


def test_a_refusal_while_encoding_comes_before_the_queue():
    """A clip too short to frame or a prompt over max_length (ClefModel.prepare's refusals) never takes a queue
    slot: the prompt is encoded before the request is queued."""
    class Refusing(FakeModel):
        def prepare(self, request, media):
            raise RequestInvalid([Problem(("body", "audio", 0), "too short", "value_error.audio_too_short")])

    service, workers = service_for(Refusing())
    queued = []
    submit = workers["fake"].submit
    workers["fake"].submit = lambda *a: queued.append(a) or submit(*a)
    with pytest.raises(RequestInvalid):
        run(workers, lambda: decide(service, BODY, "fake"))
    assert queued == []


def test_media_are_decoded_into_one_value_with_their_digests_and_timed():
    model = FakeModel(media=(IMAGE,))
    service, workers = service_for(model)
    decision = run(workers, lambda: decide(service, with_media(BODY, images=PNG), "fake"))
    [(_, media)] = model.prepared
    assert media.kinds == (IMAGE,) and media.images[0].shape == (64, 64, 3) and media.images[0].dtype == np.uint8
    assert len(media.digests) == 1 and media.digests[0] != b""
    assert list(decision.timings) == ["queue", "tokenize", "backbone", "head", "images", "vision"]
    assert decision.timings["vision"] == 0.004


def test_identical_requests_in_flight_share_one_computation():
    gate = threading.Event()
    model = FakeModel(gate=gate)
    shared = Joins()
    service, workers = service_for(model, shared=shared)

    async def main():
        first = asyncio.ensure_future(decide(service, BODY, "fake"))
        await asyncio.get_running_loop().run_in_executor(None, model.started.wait, 5)
        second = asyncio.ensure_future(decide(service, dict(BODY), "fake"))
        await asyncio.wait_for(shared.event.wait(), 5)  # the second has joined the first's computation
        gate.set()
        return await asyncio.gather(first, second)

    a, b = run(workers, main)
    assert a.answers == b.answers and len(model.prepared) == 1 and shared == ["in_flight"]


def test_a_repeat_is_answered_from_the_cache_and_media_key_it():
    model = FakeModel(media=(IMAGE,))
    shared: list[str] = []
    service, workers = service_for(model, cache_size=4, shared=shared)

    async def main():
        for body in (BODY, BODY, with_media(BODY, images=PNG), with_media(BODY, images=PNG)):
            await decide(service, body, "fake")

    run(workers, main)
    assert len(model.prepared) == 2 and shared == ["cache", "cache"]  # the image request is another key


def test_the_key_holds_the_media_digests_in_order():
    one, two = Media({IMAGE: ("i",), AUDIO: ("a",)}, (b"1", b"audio", b"2")), Media({IMAGE: ("i",)}, (b"1",))
    assert request_key("m", BODY, one) != request_key("m", BODY, two) != request_key("m", BODY)
    assert request_key("m", {"x": {1, 2}}) is None  # not JSON: never shared


def test_the_key_holds_the_prefix_caches_partition():
    # identical bodies under different prompt_cache_keys share nothing: the answer's reused tokens would tell
    assert request_key("m", BODY, partition=("alice",)) != request_key("m", BODY, partition=("bob",))
    assert request_key("m", BODY, partition=()) == request_key("m", BODY)


def test_reject_if_busy_refuses_while_the_model_works_but_joins_an_answer_under_way():
    gate = threading.Event()
    model = FakeModel(gate=gate)
    shared = Joins()
    service, workers = service_for(model, shared=shared)

    async def main():
        first = asyncio.ensure_future(decide(service, BODY, "fake"))
        await asyncio.get_running_loop().run_in_executor(None, model.started.wait, 5)
        other = {**BODY, "state": "another message"}
        with pytest.raises(Busy):
            await decide(service, other, "fake", BUSY_REFUSED)
        joined = asyncio.ensure_future(decide(service, BODY, "fake", BUSY_REFUSED))
        await asyncio.wait_for(shared.event.wait(), 5)  # it joined the answer under way rather than being refused
        gate.set()
        return await asyncio.gather(first, joined)

    a, b = run(workers, main)
    assert a.answers == b.answers and len(model.prepared) == 1 and shared == ["in_flight"]


def test_a_front_doors_contract_is_reported_with_the_bodys_other_problems():
    def no_x(body, limits):
        return [Problem(("body", "questions"), "too many for this door", "too_many_questions")] if "x" in body else []

    model = FakeModel()
    service, workers = service_for(model)
    bad = {**BODY, "x": 1, "state": 3}
    with pytest.raises(RequestInvalid) as info:
        run(workers, lambda: decide(service, bad, "fake", contract=Contract(no_x)))
    assert {p.type for p in info.value.problems} >= {"too_many_questions"} and len(info.value.problems) >= 2
    assert model.prepared == []


def test_the_local_service_runs_the_same_path_for_the_tools():
    with LocalService(FakeModel()) as service:
        decision = service.decide({**BODY, "model": "whatever the file says"})
    assert decision.model == "fake" and decision.requested == "whatever the file says"


def test_drift_refuses_audio_for_a_model_without_audio_as_the_server_does():
    """A drift fix: drift used to answer a request with audio as if it were text."""
    body = with_media(BODY, audio=WAV)
    with LocalService(FakeModel("a")) as a, LocalService(FakeModel("b")) as b:
        with pytest.raises(RequestInvalid) as info:
            drift(a.decide, b.decide, [body])
    assert [p.type for p in info.value.problems] == ["audio_not_supported"]


def test_past_the_deadline_the_request_is_refused_and_its_queued_job_dropped():
    gate = threading.Event()
    model = FakeModel(gate=gate)
    service, workers = service_for(model, timeout_s=0.05)

    async def main():
        first = asyncio.ensure_future(decide(service, BODY, "fake"))
        await asyncio.get_running_loop().run_in_executor(None, model.started.wait, 5)
        with pytest.raises(DeadlineExceeded, match="request_timeout_s"):
            await decide(service, {**BODY, "state": "queued behind"}, "fake")
        gate.set()
        with pytest.raises(DeadlineExceeded):
            await first  # its own deadline passed while the gate held it

    run(workers, main)
    assert model.prefilled == ["a message"]  # the queued request, its waiter gone, never reached the backbone


def test_the_door_parses_the_text_and_finds_the_media_located_without_decoding_them():
    body = {**BODY, "images": [base64.b64encode(b"not an image").decode()], "model": "m"}
    parsed = asyncio.run(parse_systemone(body, "m", ServerSpec(), json_bytes=1234))
    assert isinstance(parsed.request, DecisionRequest) and parsed.request.model == "m"
    assert parsed.media.named == (IMAGE,) and [loc for loc, _ in parsed.media.of(IMAGE)] == [("body", "images", 0)]
    assert isinstance(parsed.media.of(IMAGE)[0][1], str)  # its base64 as sent: decoded once the request is admitted
    assert "'jev-latest'" in no_model_warning("jev-latest")