"""llama-server's chat-message state (issue 50 item 8): `"state": [{"role": "user", "content": [{"type": "text", ...},
{"type": "image_url", "image_url": {"url": "data:image/png;base64,..."}}]}]`, as its own /v1/systemone takes it, over
a real socket. The image_url parts are read as images, in order, after the body's own `images`: the same answer as
the state without them and the images in `images` (it was tokenized as text: an 8 x 8 PNG answered 200 with no image
read). A model without vision refuses them with the usual 422; media left in a state's text gets an x_warnings line.
"""

from __future__ import annotations

import base64

import pytest
from clef_bridge.bridge.media.request import chat_images

from .conftest import tiny_spec
from .fixturegen_vision import encoded, picture
from .serverkit import RunningServer, demo_server, registry_for

pytestmark = pytest.mark.integration

QUESTIONS = {"urgent": {"type": "noul", "instructions": "Is it urgent?"}}


def url(seed: int, size: int = 64) -> str:
    return "data:image/png;base64," + base64.b64encode(encoded(picture(size, size, seed=seed), "PNG")).decode()


def chat(*parts: dict) -> list[dict]:
    return [{"role": "system", "content": "Triage the ticket."}, {"role": "user", "content": list(parts)}]


TEXT = {"type": "text", "text": "My screen shows this error."}


@pytest.fixture(scope="module")
def demo(tmp_path_factory):
    with demo_server(tmp_path_factory.mktemp("demo")) as running:
        yield running


def answers(reply) -> dict:
    assert reply.status == 200, reply.body[:400]
    return reply.json()["answers"]


@pytest.mark.parametrize("wrapped", [False, True], ids=["messages", "messages_object"])
def test_image_url_parts_answer_as_the_images_field(demo, wrapped):
    one, two = url(1), url(2)
    state = chat(TEXT, {"type": "image_url", "image_url": {"url": one}}, {"type": "image_url", "image_url": two})
    stripped = chat(TEXT)
    if wrapped:
        state, stripped = {"messages": state}, {"messages": stripped}
    sent = demo.post({"model": "demo", "state": state, "questions": QUESTIONS})
    same = demo.post({"model": "demo", "state": stripped, "questions": QUESTIONS, "images": [one, two]})
    assert answers(sent) == answers(same)
    assert sent.json()["usage"] == same.json()["usage"] and "images_ms" in sent.json()["x_timings"]
    swapped = demo.post({"model": "demo", "state": stripped, "questions": QUESTIONS, "images": [two, one]})
    assert answers(swapped) != answers(sent)  # in order: the parts' order is the images' order
    text_only = demo.post({"model": "demo", "state": stripped, "questions": QUESTIONS})
    assert answers(text_only) != answers(sent)  # the image is read, not dropped
    assert not [w for w in sent.json().get("x_warnings", []) if w.startswith("state.embedded_media")]


def test_the_bodys_own_images_come_first(demo):
    first, second = url(3), url(4)
    sent = demo.post({"model": "demo", "state": chat(TEXT, {"type": "image_url", "image_url": {"url": second}}),
                      "questions": QUESTIONS, "images": [first]})
    same = demo.post({"model": "demo", "state": chat(TEXT), "questions": QUESTIONS, "images": [first, second]})
    assert answers(sent) == answers(same)


def test_media_left_in_a_states_text_is_said(demo):
    png = url(5)
    for state in (f"the screenshot: {png}", "pasted: " + png.split(",", 1)[1]):
        reply = demo.post({"model": "demo", "state": state, "questions": QUESTIONS})
        warned = [w for w in reply.json()["x_warnings"] if w.startswith("state.embedded_media")]
        assert reply.status == 200 and len(warned) == 1, reply.json().get("x_warnings")
    plain = demo.post({"model": "demo", "state": "ticket 8d3f a1b2c3d4e5f60718293a4b5c6d7e8f90 was reopened",
                       "questions": QUESTIONS})
    assert not [w for w in plain.json()["x_warnings"] if w.startswith("state.embedded_media")]


def test_a_model_without_vision_refuses_image_url_parts(fx, tmp_path):
    with RunningServer(registry_for(tiny_spec(fx), tmp_path / "models.toml")) as server:
        reply = server.post({"model": "tiny", "questions": QUESTIONS,
                             "state": chat(TEXT, {"type": "image_url", "image_url": {"url": url(6)}})})
    assert reply.status == 422, reply.body[:300]
    assert "image" in reply.body.decode() and "mmproj" in reply.body.decode()


def test_other_states_are_left_as_they_are():
    for body in ({"state": "text"}, {"state": {"a": 1}}, {"state": [1, {"content": "x"}]}, [1], {"state": None},
                 {"state": [{"content": [{"type": "text", "text": "t"}]}]}):
        assert chat_images(body) is body
