"""The inference worker on its own: both head modes give the same answers, and both stop cleanly."""

from __future__ import annotations

import asyncio

import pytest
from clef_bridge.bridge.model.worker import InferenceWorker, WorkerStopped
from clef_bridge.head.schema import parse_request

from .corpus import varied_requests
from .deciding import respond, systemone

pytestmark = pytest.mark.integration

REQUESTS = [varied_requests()[i] for i in (0, 1, 2, 6, 8, 11, 22)]


def run_worker(model, requests: list, overlap: bool) -> list:
    """Every request through a fresh worker at once; the decisions, in order, after it stopped."""
    worker = InferenceWorker(model, max_queue=64, overlap=overlap)
    worker.start()
    try:
        async def main():
            jobs = [worker.submit(model.prepare(parse_request(r, model.limits))) for r in requests]
            return await asyncio.gather(*(j.future for j in jobs))

        return asyncio.run(main())
    finally:
        worker.stop()
        assert not worker.alive


@pytest.mark.parametrize("overlap", [False, True], ids=["inline-head", "pipelined-head"])
def test_worker_answers_equal_decide(tiny_model, overlap):
    decisions = run_worker(tiny_model, REQUESTS, overlap)
    assert [systemone(d, r) for d, r in zip(decisions, REQUESTS)] == [respond(tiny_model, r) for r in REQUESTS]
    assert max(d.timings.batch_size for d in decisions) > 1  # queued together, decoded together


def test_a_stopped_worker_refuses_new_requests(tiny_model):
    worker = InferenceWorker(tiny_model, max_queue=4, overlap=True)
    worker.start()
    worker.stop()

    async def submit():
        worker.submit(tiny_model.prepare(parse_request(REQUESTS[0])))

    with pytest.raises(WorkerStopped, match="not accepting requests"):
        asyncio.run(submit())
