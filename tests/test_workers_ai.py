"""Cloudflare's hosted contract on the Workers AI routes, over a real socket: options.rejectIfBusy (429,
code 3040, no queueing), 1 to 64 questions, question ids of [A-Za-z0-9_.-]{1,100}, a 13 MiB body, each
refused in the Workers AI envelope with its reason, while POST /v1/systemone keeps its wider contract."""

from __future__ import annotations

import asyncio
import json

import aiohttp
import pytest
from clef_bridge.bridge.server.appstate import SERVED
from clef_bridge.bridge.server.doors.workers_ai import MAX_BODY_BYTES

from .conftest import tiny_spec
from .serverkit import RunningServer, registry_for, slow_loader, strip_extensions

pytestmark = pytest.mark.integration

NOUL = {"type": "noul", "instructions": "ok?"}
ROUTES = ("/accounts/acct/ai/run/@cf/cloudflare/tiny", "/client/v4/accounts/acct/ai/run/@cf/cloudflare/tiny")


def body(questions: dict | None = None, **extra) -> dict:
    return {"state": "s", "questions": {"q": NOUL} if questions is None else questions, **extra}


def refused(reply, status: int, code: int, *reasons: str) -> str:
    """The Workers AI error envelope with Cloudflare's code and a message holding every reason."""
    assert reply.status == status, reply.body[:400]
    envelope = reply.json()
    assert set(envelope) == {"result", "success", "errors", "messages"}, envelope
    assert envelope["success"] is False and envelope["result"] is None and envelope["messages"] == []
    [error] = envelope["errors"]
    assert error["code"] == code, error
    assert all(reason in error["message"] for reason in reasons), error["message"]
    return error["message"]


@pytest.fixture(scope="module")
def server(fx, tmp_path_factory):
    # limits wider than the hosted ones, so that each hosted refusal is the route's own
    registry = registry_for(tiny_spec(fx), tmp_path_factory.mktemp("wai") / "m.toml", max_questions=100,
                            max_body_bytes=16 * 2**20)
    with RunningServer(registry) as srv:
        yield srv


@pytest.mark.parametrize("route", ROUTES)
def test_64_questions_pass_65_are_refused_where_jev_takes_them(server, route):
    # one question of an unknown type in each: the 422 lists the problems the counts raise, without inference
    questions = {"q0": {"type": "poll"}, **{f"q{i}": NOUL for i in range(1, 65)}}
    first_64 = dict(list(questions.items())[:64])
    only_type = refused(server.request("POST", route, body(first_64)), 422, 422, "body.questions.q0.type")
    assert "Workers AI" not in only_type
    refused(server.request("POST", route, body(questions)), 422, 422, "body.questions.q0.type",
            "body.questions: Workers AI takes 1 to 64 questions per request, got 65", "POST /v1/systemone")
    jev = server.post(body(questions, model="tiny"))
    assert jev.status == 422 and [p["loc"] for p in jev.json()["detail"]] == [["body", "questions", "q0", "type"]]
    refused(server.request("POST", route, body({})), 422, 422, "questions must be a non-empty object")


@pytest.mark.parametrize("route", ROUTES)
def test_question_ids_of_letters_digits_and_three_marks_up_to_100(server, route):
    fine = {"a" * 100: NOUL, "Ticket_2.v-1": NOUL, "0": NOUL}
    reply = server.request("POST", route, body(fine))
    assert reply.status == 200 and list(reply.json()["result"]["answers"]) == list(fine)
    for bad in ("a" * 101, "needs tools", "ü", "q/1", "q:1", ""):
        message = refused(server.request("POST", route, body({"ok": NOUL, bad: NOUL})), 422, 422,
                          f"body.questions.{bad}: Workers AI takes question ids of 1 to 100 letters, digits")
        assert "body.questions.ok" not in message
        assert server.post(body({bad: {"type": "noul", "instructions": "ok?"}}, model="tiny")).status == 200


def test_a_hosted_refusal_names_every_other_problem_too(server):
    refused(server.request("POST", ROUTES[0], body({"bad id": {"type": "poll"}})), 422, 422,
                      "body.questions.bad id: Workers AI takes question ids", "body.questions.bad id.type")


def test_a_body_over_13_mib_is_refused_where_jev_takes_it(server):
    padded = json.dumps(body(padding="x" * (MAX_BODY_BYTES + 1024))).encode()
    refused(server.request("POST", ROUTES[1], raw=padded), 413, 3006, f"exceeds {MAX_BODY_BYTES} bytes",
            "the most Workers AI takes", "POST /v1/systemone")
    jev = server.post(None, raw=json.dumps(body(model="tiny", padding="x" * (MAX_BODY_BYTES + 1024))).encode())
    assert jev.status == 200, jev.body[:300]  # unknown fields are ignored; the Jev route's cap is 16 MiB here
    empty = json.dumps(body(padding="")).encode()
    at_the_limit = json.dumps(body(padding="x" * (MAX_BODY_BYTES - len(empty)))).encode()
    assert len(at_the_limit) == MAX_BODY_BYTES
    assert server.request("POST", ROUTES[0], raw=at_the_limit).status == 200


def test_options_are_checked(server):
    for options, loc in (("fast", "body.options"), ({"rejectIfBusy": "yes"}, "body.options.rejectIfBusy")):
        refused(server.request("POST", ROUTES[0], body(options=options)), 422, 422, loc)
    idle = server.request("POST", ROUTES[0], body(options={"rejectIfBusy": True, "other": 1}))
    assert idle.status == 200  # nothing else running: it starts at once


def test_reject_if_busy_answers_429_with_3040_instead_of_queueing(fx, tmp_path):
    registry = registry_for(tiny_spec(fx, n_seq_max=1), tmp_path / "m.toml")
    with RunningServer(registry, slow_loader(1.0)) as srv:
        async def main():
            async with aiohttp.ClientSession() as session:
                async def post(state: str, **extra):  # distinct states: identical bodies would share one run
                    async with session.post(srv.url + ROUTES[1], json=body(state=state, **extra)) as resp:
                        return resp.status, resp.headers.get("Retry-After"), await resp.json()

                busy = asyncio.create_task(post("first"))
                started = srv.app[SERVED]["tiny"].worker.model.started  # set once its batch reaches the backbone
                assert await asyncio.get_running_loop().run_in_executor(None, started.wait, 30)
                queued = asyncio.create_task(post("queued"))  # without the option: waits its turn
                rejected = await post("in a hurry", options={"rejectIfBusy": True})
                return rejected, await busy, await queued

        (status, retry_after, envelope), first, queued = asyncio.run(main())
        assert (status, retry_after) == (429, "1")
        assert envelope["success"] is False and envelope["result"] is None
        [error] = envelope["errors"]
        assert error["code"] == 3040 and "busy" in error["message"] and "rejectIfBusy" in error["message"]
        assert first[0] == 200 and queued[0] == 200
        assert srv.app[SERVED]["tiny"].worker.model.decided == 2  # the refused request never reached the model
        line = srv.access_line(lambda entry: entry.get("error_type") == "busy")
        assert line["status"] == 429
        # once the worker is idle again the same request is answered, and identical to the plain one
        calm = srv.request("POST", ROUTES[1], body(state="in a hurry", options={"rejectIfBusy": True}))
        plain = srv.request("POST", ROUTES[0], body(state="in a hurry"))
        assert calm.status == 200 and strip_extensions(calm.json()["result"]) == strip_extensions(
            plain.json()["result"])
