"""The CPU worker's head passes, with the decision service's fake model: one pass over the requests it took, never
holding more prompt tokens than one decode takes, and a failed pass again one request at a time."""

from __future__ import annotations

import asyncio
import threading
from types import SimpleNamespace

import pytest
from clef_bridge.bridge.media.request import NO_MEDIA
from clef_bridge.bridge.model.worker import InferenceWorker
from clef_bridge.head.schema import parse_request

from .serverkit import wait_until
from .test_service import BODY, FakeModel

pytestmark = pytest.mark.unit


class PassModel(FakeModel):
    """The fake model with 4-token prompts (one question): alone in a batch of budget 4, two fill a decode of 8;
    records each head pass's size and fails a pass that holds the state 'fail'."""

    def __init__(self, decode_budget: int):
        super().__init__(gate=threading.Event())
        self.backbone = SimpleNamespace(on_gpu=False, decode_budget=decode_budget, batch_budget=4)
        self.passes: list[list[str]] = []

    def score(self, items):
        self.passes.append([item.prepared.request.state for item in items])
        if len(items) > 1 and any(item.prepared.request.state == "fail" for item in items):
            raise MemoryError("injected: the pass over several requests ran out of memory")
        return super().score(items)


def take(model: PassModel, states: list[str]) -> list:
    """A first request holds the worker; then `states` queue and are taken together: what each got."""
    worker = InferenceWorker(model, max_queue=8, overlap=False)
    worker.start()

    async def main():
        def submit(state):
            return worker.submit(model.prepare(parse_request({**BODY, "state": state}), NO_MEDIA))

        first = submit("first")
        await asyncio.to_thread(wait_until, model.started.is_set, "the first request in the backbone")
        jobs = [submit(s) for s in states]
        model.gate.set()
        await first.future
        return await asyncio.gather(*(j.future for j in jobs), return_exceptions=True)

    try:
        return asyncio.run(main())
    finally:
        model.gate.set()
        worker.stop()


def test_the_requests_taken_together_share_one_head_pass():
    model = PassModel(decode_budget=4096)
    got = take(model, ["a", "b", "c", "d"])
    assert model.prefilled == ["first", "a", "b", "c", "d"]  # each its own batch: 4 tokens fill one
    assert model.passes == [["first"], ["a", "b", "c", "d"]]
    assert all(g.answers[0].id == "urgent" for g in got)


def test_a_pass_holds_no_more_prompt_tokens_than_one_decode():
    model = PassModel(decode_budget=8)
    take(model, ["a", "b", "c", "d"])
    assert model.passes == [["first"], ["a", "b"], ["c", "d"]]


def test_a_failed_pass_is_run_again_one_request_at_a_time():
    model = PassModel(decode_budget=4096)
    got = take(model, ["a", "fail", "c"])
    assert model.passes == [["first"], ["a", "fail", "c"], ["a"], ["fail"], ["c"]]
    assert [g.answers[0].id for g in got] == ["urgent"] * 3  # alone, 'fail' passes: the fault was the pass's
