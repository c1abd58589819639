"""The inference worker on its own: both head modes give the same answers, and both stop cleanly."""

from __future__ import annotations

import asyncio
import threading

import pytest
from clef_bridge.bridge.model.worker import InferenceWorker, RequestOptions, WorkerStopped
from clef_bridge.head.schema import parse_request

from .conftest import open_tiny
from .corpus import varied_requests
from .deciding import respond, systemone
from .serverkit import WrappedModel, wait_until

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


class CountingModel(WrappedModel):
    """A real model whose first batch waits at a gate, recording each batch's size and each head pass's."""

    def __init__(self, model):
        super().__init__(model)
        self.gate, self.entered = threading.Event(), threading.Event()
        self.batches: list[int] = []
        self.passes: list[int] = []

    def prefill_batch(self, batch):
        self.batches.append(len(batch))
        self.entered.set()
        self.gate.wait(60)
        return self._model.prefill_batch(batch)

    def score(self, inputs):
        self.passes.append(len(inputs))
        return self._model.score(inputs)


def test_the_cpu_worker_runs_one_head_pass_over_what_it_took(fx):
    """Three requests taken together decode in three batches (each longer than the CPU's one-ubatch budget) and
    share ONE head pass; the second and third reuse the first's prefix from the cache within that same take
    (its memory rows went to the cache after its batch, not after the shared pass); answers as decided alone."""
    model = CountingModel(open_tiny(fx, n_ubatch=64, prefix_cache_mb=64, prefix_cache_every=32))
    state = {"ticket": 88, "message": "the nightly export failed three times and the dashboard is stale " * 2}
    bodies = [{"model": "tiny", "state": state, "questions": {q: {"type": "noul", "instructions": f"{q}?"}}}
              for q in ("urgent", "billing", "outage")]
    worker = InferenceWorker(model, max_queue=8, overlap=False)
    worker.start()
    try:
        async def main():
            first = worker.submit(model.prepare(parse_request({**bodies[0], "state": "the first, alone"})))
            await asyncio.to_thread(wait_until, model.entered.is_set, "the first request in the backbone")
            jobs = [worker.submit(model.prepare(parse_request(b))) for b in bodies]
            model.gate.set()
            return await first.future, await asyncio.gather(*(j.future for j in jobs))

        _, decided = asyncio.run(main())
    finally:
        model.gate.set()
        worker.stop()
    assert model.batches == [1, 1, 1, 1] and model.passes == [1, 3]
    assert [d.timings.reused_tokens > 0 for d in decided] == [False, True, True]
    assert [systemone(d, b) for d, b in zip(decided, bodies)] == [respond(model._model, b) for b in bodies]
    model.close()


class SlowToReturn(InferenceWorker):
    """A worker whose prefill thread, after its first take, is held before it looks for work again: the moment after
    an answer was delivered and before the thread is back waiting, which a loaded machine stretches."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.takes, self.back = 0, threading.Event()

    def _take(self):
        self.takes += 1
        if self.takes == 2:
            self.back.wait(60)
        return super()._take()


def test_a_request_sent_once_the_answers_came_is_not_refused_as_busy(tiny_model):
    """rejectIfBusy refuses a request that would wait behind work under way; once every answer has been delivered
    nothing is, even before the prefill thread is back waiting (it once answered 429 in that moment: Workers AI's
    test_reject_if_busy_answers_429_with_3040_instead_of_queueing failed on a loaded machine)."""
    worker = SlowToReturn(tiny_model, max_queue=4, overlap=False)
    worker.start()
    try:
        async def main():
            await worker.submit(tiny_model.prepare(parse_request(REQUESTS[0]))).future
            wait_until(lambda: worker.takes == 2, "the thread to deliver and be held before it waits again")
            worker.release(worker.reserve(RequestOptions(reject_if_busy=True)))  # admitted: no Busy

        asyncio.run(main())
    finally:
        worker.back.set()
        worker.stop()
