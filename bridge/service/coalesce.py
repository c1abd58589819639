"""Identical requests share one computation: in flight always, and from an LRU answer cache when sized.

Clients retry on timeouts (the official SDK up to 3 times), so the same body can arrive while its
first copy is still queued; it waits on that job instead of queueing another. A computation nobody waits
for any more (its clients hung up, or their deadlines passed) is withdrawn from the worker and forgotten
at once, so a retry that comes after computes afresh rather than joining a job that will never answer.

The prefix cache's partition (the tenant's, then a client's prompt_cache_key) is part of the key: identical bodies
under different keys would give the same probabilities, but sharing their computation or a cached answer would
show one client, through its latency, that another sent the same request, which is what partitioning the cache
is for. A client's own retries carry its key, so they still share. A request that joins gets the answer, never
the timings of the request that computed it (the decision service gives it its own).
"""

from __future__ import annotations

import asyncio
import functools
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any, Callable

import orjson

from ..media.request import NO_MEDIA, Media
from ..model.clef_model import Prepared, Scored
from ..model.worker import InferenceWorker, Job, RequestOptions, Slot

Key = tuple[str, tuple[str, ...], bytes]


@dataclass(eq=False)
class Shared:
    """One computation that identical requests wait on together; job is None for a cached answer."""

    future: asyncio.Future
    job: Job | None
    # called with this computation when its last waiter leaves before the answer (taking it as an argument, not
    # closing over it: a closure would tie it, its future and the error in it into a cycle only the GC frees)
    abandon: Callable[[Shared], None] = lambda shared: None
    waiters: int = 0

    @property
    def queue_s(self) -> float:
        return self.job.queue_s if self.job is not None else 0.0

    def leave(self) -> None:
        """One waiter is gone; when none is left before the answer, the computation is abandoned: its job leaves
        the worker's queue (or its answer is dropped) and its future is cancelled."""
        self.waiters -= 1
        if self.waiters == 0 and not self.future.done():
            self.abandon(self)


def request_key(model: str, body: Any, media: Media = NO_MEDIA, partition: tuple[str, ...] = ()) -> Key | None:
    """(model, the prefix cache's partition, canonical body + the sha256 of each medium, in prompt order:
    bridge.media.request.Media.digests); body: what decides the answer (the service gives the validated state and
    questions, so bodies that differ only in what nothing reads share); None: it is no JSON, never shared."""
    try:
        return model, partition, orjson.dumps(body, option=orjson.OPT_SORT_KEYS) + b"".join(media.digests)
    except (orjson.JSONEncodeError, TypeError):
        return None


class Coalescer:
    """In-flight jobs and finished answers by (model, canonical body)."""

    def __init__(self, cache_size: int, on_shared: Callable[[str, str], None] = lambda model, source: None):
        self.cache_size = cache_size
        self._on_shared = on_shared
        self._inflight: dict[Key, Shared] = {}
        self._cache: OrderedDict[Key, Scored] = OrderedDict()

    def join(self, worker: InferenceWorker, key: Key | None) -> Shared | None:
        """A cached answer or a computation in flight for this request_key, joined; None: nothing to join, prepare it
        and submit()."""
        if key is not None and key in self._cache:
            self._cache.move_to_end(key)
            self._on_shared(worker.name, "cache")
            done = asyncio.get_running_loop().create_future()
            done.set_result(self._cache[key])
            return self._join(Shared(done, None))
        running = self._inflight.get(key) if key is not None else None
        if running is not None and not running.future.cancelled():
            self._on_shared(worker.name, "in_flight")
            return self._join(running)
        return None

    def submit(self, worker: InferenceWorker, key: Key | None, prepared: Prepared,
               options: RequestOptions = RequestOptions(), slot: Slot | None = None) -> tuple[Shared, bool]:
        """The computation for this request_key (prepared: its request encoded, with its decoded media), and whether
        this request started it: one to join (join()), since a copy may have started while this one was prepared, or
        a new job on the worker in the place its slot holds (InferenceWorker.reserve: admitted before the request was
        decoded and encoded; joining an answer that exists or is under way takes no place and waits behind nothing)."""
        joined = self.join(worker, key)
        if joined is not None:
            return joined, False
        job = worker.submit(prepared, options, slot)
        shared = Shared(job.future, job)
        shared.abandon = functools.partial(self._abandon, key, worker)
        if key is not None:
            self._inflight[key] = shared
            job.future.add_done_callback(lambda future: self._finished(key, future))
        return self._join(shared), True

    def _abandon(self, key: Key | None, worker: InferenceWorker, shared: Shared) -> None:
        if key is not None and self._inflight.get(key) is shared:
            del self._inflight[key]
        worker.withdraw(shared.job)

    @staticmethod
    def _join(shared: Shared) -> Shared:
        shared.waiters += 1
        return shared

    def _finished(self, key: Key, future: asyncio.Future) -> None:
        if key in self._inflight and self._inflight[key].future is future:  # not a fresh copy of an abandoned one
            del self._inflight[key]
        if self.cache_size and not future.cancelled() and future.exception() is None:
            self._cache[key] = future.result()
            while len(self._cache) > self.cache_size:
                self._cache.popitem(last=False)
