"""Retries over a real socket (issue 37): a request whose client hung up while it was queued, or whose deadline
passed, never poisons the next copy of its body. Each retry answers on an idle server within seconds, as the
body alone answers; two clients on one body keep each other's answer; likewise with the answer cache on, and for
requests with images and audio and for OpenAI's door with a prompt_cache_key."""

from __future__ import annotations

import base64
import json
import socket
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import replace

import numpy as np
import pytest
from clef_bridge.bridge.server.appstate import SERVED
from clef_bridge.bridge.service.models import load_models

from . import fixturegen_vision
from .conftest import tiny_spec
from .deciding import respond
from .omni_cases import wav
from .serverkit import RunningServer, WrappedModel, registry_for, strip_extensions, wait_until

pytestmark = pytest.mark.integration

DEADLINE_S = 3.0  # the deadline server's request_timeout_s: what a poisoned retry waited before answering 503
PATIENT_S = 30.0  # the other servers': a poisoned retry there waits this long, so any answer within 5 s is a fresh one
NOUL = {"model": "tiny", "state": "s", "questions": {"q": {"type": "noul", "instructions": "ok?"}}}


class GatedModel(WrappedModel):
    """A real, checked model whose batches wait at `gate` while a test holds the worker."""

    def __init__(self, model):
        super().__init__(model)
        self.gate = threading.Event()
        self.gate.set()
        self.started = threading.Event()

    def prefill_batch(self, batch):
        self.started.set()
        self.gate.wait(60)
        return self._model.prefill_batch(batch)


def gated_server(spec, path, **server):
    def load(registry):
        return {n: replace(item, model=GatedModel(item.model)) for n, item in load_models(registry).items()}

    return RunningServer(registry_for(spec, path, **server), load)


def parts(srv):
    worker = srv.app[SERVED]["tiny"].worker
    return worker, worker.model


@contextmanager
def held(srv, body=None):
    """The worker busy with a blocker request (at the gate) while the block runs; released after it."""
    worker, model = parts(srv)
    model.started.clear()
    model.gate.clear()
    pool = ThreadPoolExecutor(1)
    blocker = pool.submit(srv.post, body or {**NOUL, "state": f"blocker {time.monotonic()}"})
    try:
        wait_until(model.started.is_set, "the blocker to reach the backbone")
        yield worker
    finally:
        model.gate.set()
        blocker.result(60)
        pool.shutdown()


def send(srv, path: str, body: dict) -> socket.socket:
    """A request on a raw socket, left waiting for its answer: closing the socket is the client hanging up."""
    sock = socket.create_connection(("127.0.0.1", srv.port))
    payload = json.dumps(body).encode()
    sock.sendall(f"POST {path} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n".encode()
                 + f"Content-Length: {len(payload)}\r\n\r\n".encode() + payload)
    return sock


def hang_up_while_queued(srv, path: str, body: dict) -> None:
    """body sent while the worker is held, its client gone while it waits in the queue."""
    before = srv.metric("clef_requests_total", status="499")
    with held(srv) as worker:
        sock = send(srv, path, body)
        wait_until(lambda: worker.depth == 1, "the request in the queue")
        sock.close()
        wait_until(lambda: srv.metric("clef_requests_total", status="499") == before + 1, "the hang-up's 499")
        assert worker.depth == 0  # its queue slot is free at once, before the worker reaches it


def timed(call):
    t0 = time.perf_counter()
    reply = call()
    return reply, time.perf_counter() - t0


@pytest.fixture(scope="module")
def server(fx, tmp_path_factory):
    with gated_server(tiny_spec(fx), tmp_path_factory.mktemp("retry") / "m.toml",
                      request_timeout_s=PATIENT_S) as srv:
        yield srv


@pytest.fixture(scope="module")
def cached_server(fx, tmp_path_factory):
    with gated_server(tiny_spec(fx), tmp_path_factory.mktemp("cached") / "m.toml", request_timeout_s=PATIENT_S,
                      cache_size=16) as srv:
        yield srv


def test_a_retry_after_a_hang_up_while_queued_answers_as_the_body_alone(server, tiny_model):
    body = {**NOUL, "state": "hung up while queued"}
    hang_up_while_queued(server, "/v1/systemone", body)
    reply, seconds = timed(lambda: server.post(body))
    assert reply.status == 200, reply.body
    assert seconds < 5, f"the retry took {seconds:.1f} s: it waited on the abandoned copy"
    assert strip_extensions(reply.json()) == respond(tiny_model, body)


def test_a_retry_after_a_missed_deadline_answers(fx, tmp_path, tiny_model):
    body = {**NOUL, "state": "missed its deadline"}
    with gated_server(tiny_spec(fx), tmp_path / "m.toml", request_timeout_s=DEADLINE_S) as srv:
        worker, model = parts(srv)
        model.started.clear()
        model.gate.clear()
        pool = ThreadPoolExecutor(2)
        try:
            blocker = pool.submit(srv.post, {**NOUL, "state": "blocker"})
            wait_until(model.started.is_set, "the blocker to reach the backbone")
            late = pool.submit(srv.post, body)
            wait_until(lambda: worker.depth == 1, "the request in the queue")
            assert late.result(30).status == 503  # its deadline passed while it waited in the queue
            assert blocker.result(30).status == 503
            assert worker.depth == 0
        finally:
            model.gate.set()
            pool.shutdown()
        for attempt in range(2):  # every retry, not just the first
            reply, seconds = timed(lambda: srv.post(body))
            assert reply.status == 200, (attempt, reply.body)
            assert seconds < DEADLINE_S, f"retry {attempt} took {seconds:.1f} s"
            assert strip_extensions(reply.json()) == respond(tiny_model, body)


def test_one_of_two_clients_hanging_up_never_costs_the_other_its_answer(server, tiny_model):
    body = {**NOUL, "state": "two clients"}
    pool = ThreadPoolExecutor(1)  # outside held(): its exit opens the gate the second client waits at
    with held(server) as worker:
        sock = send(server, "/v1/systemone", body)
        wait_until(lambda: worker.depth == 1, "the first copy in the queue")
        coalesced = server.metric("clef_coalesced_total", source="in_flight")
        second = pool.submit(server.post, body)
        wait_until(lambda: server.metric("clef_coalesced_total", source="in_flight") == coalesced + 1,
                   "the second client to join the first copy")
        sock.close()
        wait_until(lambda: server.access_lines() and any(line["status"] == 499 for line in server.access_lines()),
                   "the first client's 499")
        assert worker.depth == 1  # still queued: the second client waits for it
    reply = second.result(30)
    pool.shutdown()
    assert reply.status == 200 and strip_extensions(reply.json()) == respond(tiny_model, body)


def test_with_the_answer_cache_a_retry_answers_and_then_comes_from_the_cache(cached_server, tiny_model):
    body = {**NOUL, "state": "cached retry"}
    hang_up_while_queued(cached_server, "/v1/systemone", body)
    reply, seconds = timed(lambda: cached_server.post(body))
    assert reply.status == 200 and seconds < 5, (reply.status, seconds)
    assert strip_extensions(reply.json()) == respond(tiny_model, body)
    hits = cached_server.metric("clef_coalesced_total", source="cache")
    again = cached_server.post(body)
    assert strip_extensions(again.json()) == strip_extensions(reply.json())
    assert cached_server.metric("clef_coalesced_total", source="cache") == hits + 1


# --- media ------------------------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def media_server(ofx, tmp_path_factory):
    """The tiny Clef-omni (images and audio), gated."""
    spec = tiny_spec(None, gguf=ofx.gguf_f32, head=ofx.head, mmproj=ofx.mmproj_f32)
    with gated_server(spec, tmp_path_factory.mktemp("media") / "m.toml", request_timeout_s=PATIENT_S) as srv:
        yield srv


def media_body(state: str) -> dict:
    picture = fixturegen_vision.encoded(fixturegen_vision.picture(64, 48, seed=11), "PNG")
    clip = wav(np.sin(np.arange(16000, dtype=np.float32) / 9.0) * 0.3)
    return {**NOUL, "state": f"{state}: [image 1] and [audio 1]",
            "images": [base64.b64encode(picture).decode()], "audio": [base64.b64encode(clip).decode()]}


def test_a_retry_with_images_and_audio_after_a_hang_up_answers(media_server):
    body = media_body("a photo and a clip")
    alone = media_server.post({**body, "state": body["state"] + " (alone)"})
    assert alone.status == 200, alone.body
    hang_up_while_queued(media_server, "/v1/systemone", body)
    reply, seconds = timed(lambda: media_server.post(body))
    assert reply.status == 200 and seconds < 5, (reply.status, seconds, reply.body[:300])
    assert reply.json()["answers"] == media_server.post(body).json()["answers"]


def test_openai_door_with_a_prompt_cache_key_and_an_image_retries_after_a_hang_up(media_server):
    picture = fixturegen_vision.encoded(fixturegen_vision.picture(48, 64, seed=5), "PNG")
    url = "data:image/png;base64," + base64.b64encode(picture).decode()
    body = {"model": "tiny", "prompt_cache_key": "alice",
            "input": [{"role": "user", "content": [{"type": "input_text", "text": "What is this?"},
                                                   {"type": "input_image", "image_url": url}]}],
            "questions": [{"type": "predicate", "name": "cat", "instructions": "Is it a cat?"}]}
    first = media_server.request("POST", "/v1/decisions", body)
    assert first.status == 200, first.body
    retry_body = {**body, "questions": [{**body["questions"][0], "instructions": "Is it a dog?"}]}
    hang_up_while_queued(media_server, "/v1/decisions", retry_body)
    reply, seconds = timed(lambda: media_server.request("POST", "/v1/decisions", retry_body))
    assert reply.status == 200 and seconds < 5, (reply.status, seconds, reply.body[:300])
    again = media_server.request("POST", "/v1/decisions", retry_body)
    assert reply.json()["answers"] == again.json()["answers"]
