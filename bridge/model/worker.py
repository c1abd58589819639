"""One inference thread per model: admission, batching into one decode, results back to asyncio."""

from __future__ import annotations

import asyncio
import collections
import itertools
import logging
import queue
import threading
import time
from dataclasses import dataclass, field, replace
from typing import Callable, Iterator

from ...head.errors import Category, ClefError
from .clef_model import ClefModel, HeadInput, HiddenStates, Prefilled, Prepared, Scored

log = logging.getLogger("clef_bridge.worker")

# Media requests wait with their decoded pixels (up to 4 x 48 MiB at the default limits) and audio samples
# (4 x 3.7 MiB): this many per model bounds that memory; more get 429 before their media are decoded.
MAX_MEDIA_JOBS = 8
CANCELLED = object()  # what _deliver gives a job that nobody waits for: its future is cancelled


class Overloaded(ClefError):
    """The admission queue is full."""

    category = Category.BUSY
    error_type = "overloaded"

    def __init__(self, model: str, depth: int, what: str = "requests"):
        super().__init__(f"model {model!r} has {depth} {what} waiting, the most this server queues; retry shortly")


class Busy(ClefError):
    """The model is deciding other requests and this one asked not to wait (Workers AI's rejectIfBusy)."""

    category = Category.BUSY
    error_type = "busy"

    def __init__(self, model: str, depth: int):
        super().__init__(f"model {model!r} is busy deciding other requests ({depth} more waiting) and the request "
                         "set options.rejectIfBusy; retry shortly, or leave rejectIfBusy out to wait in the queue")


class WorkerStopped(ClefError):
    """The server is shutting down or the worker died."""

    category = Category.UNAVAILABLE
    error_type = "unavailable"


class TenantOverloaded(ClefError):
    """One tenant has as much work queued as it may (max_queue_per_key): others keep their share of the queue."""

    category = Category.BUSY
    error_type = "key_overloaded"

    def __init__(self, model: str, tenant: str, depth: int):
        super().__init__(f"key {tenant!r} has {depth} requests (a batch's states counted one each) waiting for model "
                         f"{model!r}, the most one key may queue (max_queue_per_key); retry shortly")


class ShadowDropped(ClefError):
    """A shadow's scoring was not queued or left the queue: the model has primary work (shadows go first under
    load)."""

    category = Category.BUSY
    error_type = "shadow_dropped"


class Handoff:
    """Where a model's worker leaves a scored request's hidden states for the model's head-only shadows
    (ClefModel.hidden_states, keep_hidden models only): written in the worker's thread before the answer is
    delivered, read on the event loop once it is, the delivery ordering the two. Left empty where the answer was
    another request's (joined, or cached) or failed."""

    __slots__ = ("states",)

    def __init__(self) -> None:
        self.states: HiddenStates | None = None


@dataclass(frozen=True)
class RequestOptions:
    """What a request asks beyond its body, ONE immutable value from its front door to the model: the door sets it
    (Workers AI's rejectIfBusy, OpenAI's prompt_cache_key), the server its tenant, the coalescer and the worker
    read it."""

    reject_if_busy: bool = False  # answer 429 at once rather than wait behind other requests
    partition: tuple[str, ...] = ()  # the prefix cache's (PrefillRequest.partition): shares no KV, state or answer
    tenant: str = ""  # whose request (the key's name; "" for one anonymous tenant): queues are fair between them
    shadow: bool = False  # a shadow model's scoring of an answered request: taken only when nothing else waits
    # the server's door gives each request one, for its model's head-only shadows; a value that rides along, never
    # compared: the service and the coalescer pass options on whole
    handoff: Handoff | None = field(default=None, compare=False, repr=False)


class FairQueue:
    """Queued jobs, one first-in-first-out line per tenant, taken round-robin: a tenant with one request waits
    behind at most one job of each other tenant, not behind their whole backlog. Not thread-safe: the worker holds
    its condition's lock around every call."""

    def __init__(self) -> None:
        self._lines: collections.OrderedDict[str, collections.deque[Job]] = collections.OrderedDict()
        self._size = 0
        self.shadows: collections.deque[Job] = collections.deque()  # shadow jobs: a lane of their own, taken last

    def __len__(self) -> int:
        """The jobs waiting that are not shadows' (what admission, fairness and the queue's depth count)."""
        return self._size

    def __iter__(self):
        return itertools.chain((job for line in self._lines.values() for job in line), self.shadows)

    def waiting(self, tenant: str) -> int:
        return len(self._lines.get(tenant, ()))

    def append(self, job: Job) -> None:
        if job.options.shadow:
            self.shadows.append(job)
            return
        self._lines.setdefault(job.options.tenant, collections.deque()).append(job)
        self._size += 1

    def remove(self, job: Job) -> None:
        """Raises ValueError when job is not queued (taken already)."""
        if job.options.shadow:
            self.shadows.remove(job)
            return
        line = self._lines.get(job.options.tenant)
        if line is None:
            raise ValueError("not queued")
        line.remove(job)
        self._size -= 1
        if not line:
            del self._lines[job.options.tenant]

    def take(self, n: int) -> list[Job]:
        """Up to n jobs, one from each tenant's line in turn (a tenant served goes to the end of the turn); shadow
        jobs only when no other job waits, never beside one."""
        jobs: list[Job] = []
        while self._lines and len(jobs) < n:
            tenant, line = next(iter(self._lines.items()))
            jobs.append(line.popleft())
            self._size -= 1
            del self._lines[tenant]
            if line:
                self._lines[tenant] = line
        if not jobs:  # nothing else waits: the shadows' turn
            jobs = [self.shadows.popleft() for _ in range(min(n, len(self.shadows)))]
        return jobs

    def clear(self) -> list[Job]:
        jobs = list(self)
        self._lines.clear()
        self._size = 0
        self.shadows.clear()
        return jobs


@dataclass(eq=False)
class Slot:
    """A request's place in its worker's queue, taken when it is admitted (InferenceWorker.reserve) and held while its
    media are decoded and its prompt encoded: submit() queues it without checking again, release() gives back one
    that was never queued. Held slots count as queued requests for every admission rule."""

    tenant: str
    media: bool
    counted: bool  # False for a shadow's: the shadow lane is never counted, its rule applies when it is queued
    held: bool = True


@dataclass(eq=False)
class Job:
    prepared: Prepared  # encoded, its media decoded: every refusal of the request came before it was queued
    future: asyncio.Future
    loop: asyncio.AbstractEventLoop
    options: RequestOptions = RequestOptions()
    enqueued: float = field(default_factory=time.perf_counter)
    cancelled: bool = False  # set from the event loop when nobody waits for it any more (InferenceWorker.withdraw)
    queue_s: float = 0.0
    hidden: HiddenStates | None = None  # a head-only shadow's job: another model's hidden states, no prefill
    taken: bool = False  # taken by the prefill thread and not yet delivered (counted in InferenceWorker._under_way)


@dataclass(frozen=True)
class BatchStats:
    size: int
    tokens: int


class InferenceWorker:
    """Owns a ClefModel; the event loop never touches llama.cpp or numpy.

    With the backbone on a GPU, two threads form a pipeline: one batches and prefills (llama.cpp),
    the other runs the head over each batch, so the next batch's prefill overlaps this batch's heads.
    On a CPU-only backbone the head runs in the same thread (llama.cpp's spinning CPU threads and BLAS
    fighting over the same cores would slow both), and once for all the requests taken together: a batch
    there holds one ubatch of tokens, often one request, while the head's decision layers read their weights
    once per pass whatever its rows (docs/llama-cpp.md: 8 requests in 960 ms, one in 175-195). Each prefilled
    request's memory rows go to the prefix cache right after its batch, so the next batch can reuse them.
    """

    def __init__(self, model: ClefModel, max_queue: int, on_batch: Callable[[BatchStats], None] = lambda s: None,
                 overlap: bool | None = None, max_media_jobs: int = MAX_MEDIA_JOBS, max_per_tenant: int = 0):
        self.model = model
        self.max_media_jobs = max_media_jobs
        self.overlap = model.backbone.on_gpu if overlap is None else overlap
        self.name = model.name
        self.max_queue = max_queue
        self.max_per_tenant = max_per_tenant or max_queue  # one tenant's share of the queue
        self._on_batch = on_batch
        self._queue = FairQueue()
        self._held: collections.Counter[str] = collections.Counter()  # admitted, not yet queued: slots by tenant
        self._held_media = 0  # of them, requests with media
        # whether the server has other work under way (a request being decided, another model's queue): shadow jobs
        # then give way (the app sets it)
        self.busy_elsewhere: Callable[[], bool] = lambda: False
        self._cv = threading.Condition()
        self._stopping = False
        self._idle = False  # the prefill thread waits for work: a request submitted now starts at once
        # jobs taken and not yet delivered: what a rejectIfBusy request would wait behind (counted down before an
        # answer reaches its client, so a request sent once the last answer came is never refused as busy)
        self._under_way = 0
        self._heads: queue.SimpleQueue[list[tuple[Job, Prefilled]] | None] = queue.SimpleQueue()
        self._thread = threading.Thread(target=self._run, name=f"clef-prefill-{self.name}", daemon=True)
        self._head_thread = threading.Thread(target=self._run_heads, name=f"clef-head-{self.name}", daemon=True)

    def start(self) -> None:
        self._thread.start()
        self._head_thread.start()

    def stop(self) -> None:
        """Finish what is queued, then end both threads; a job still queued after that (the prefill thread died)
        answers WorkerStopped."""
        with self._cv:
            self._stopping = True
            self._cv.notify_all()
        if self._thread.ident is not None:  # started
            self._thread.join()
        self._drop_queued()
        self._heads.put(None)
        if self._head_thread.ident is not None:
            self._head_thread.join()

    @property
    def alive(self) -> bool:
        return self._thread.is_alive() and self._head_thread.is_alive() and not self._stopping

    @property
    def depth(self) -> int:
        return len(self._queue)

    def reserve(self, options: RequestOptions = RequestOptions(), has_media: bool = False) -> Slot:
        """Admit a request (stopped, busy, a full queue, the tenant's share or the media room full: refused here and
        nowhere else) and hold its place while it is decoded and encoded; submit() or release() ends the hold."""
        with self._cv:
            self._admit(options, has_media)
            slot = Slot(options.tenant, has_media, counted=not options.shadow)
            if slot.counted:
                self._held[slot.tenant] += 1
                self._held_media += has_media
            return slot

    def release(self, slot: Slot) -> None:
        """Give back a slot never submitted (the request was refused, joined another, or its waiter left); a slot
        already queued or released is left as it is."""
        with self._cv:
            self._unhold(slot)

    def _unhold(self, slot: Slot) -> None:
        if slot.held and slot.counted:
            self._held[slot.tenant] -= 1
            if not self._held[slot.tenant]:
                del self._held[slot.tenant]
            self._held_media -= slot.media
        slot.held = False

    def submit(self, prepared: Prepared, options: RequestOptions = RequestOptions(), slot: Slot | None = None) -> Job:
        """Queue one prepared request (ClefModel.prepare: call from the event loop) in the place its slot holds
        (reserve(): admitted then), or admitted now without one; options.reject_if_busy: refuse (429) instead of
        waiting behind other requests; options.partition: its prefix cache partition."""
        loop = asyncio.get_running_loop()
        if options.partition:
            prepared = replace(prepared, partition=options.partition)
        return self._enqueue(Job(prepared, loop.create_future(), loop, options), slot)

    async def score_hidden(self, states: HiddenStates, options: RequestOptions) -> Scored:
        """This model's answers to a request from another model's hidden states of it (a head-only shadow's
        scoring, options.shadow: the shadow lane, dropped under load): one head pass, no prefill."""
        loop = asyncio.get_running_loop()
        job = self._enqueue(Job(states.prepared, loop.create_future(), loop, options, hidden=states))
        try:
            return await job.future
        except asyncio.CancelledError:  # the server is stopping: the job leaves the lane
            self.withdraw(job)
            raise

    def _enqueue(self, job: Job, slot: Slot | None = None) -> Job:
        with self._cv:
            if slot is None or not slot.held or not slot.counted:  # a shadow's lane rule holds when it is queued
                self._admit(job.options, job.prepared.has_media)
            elif self._stopping or not self._thread.is_alive():  # admitted, but the worker stopped while it encoded
                raise WorkerStopped(f"model {self.name!r} is not accepting requests (shutting down)")
            if slot is not None:
                self._unhold(slot)
            self._queue.append(job)
            # under load (a take's worth of requests waiting) the shadows waiting go first: they would only wait
            dropped = list(self._queue.shadows) if len(self._queue) >= self.model.n_seq_max else []
            if dropped:
                self._queue.shadows.clear()
            self._cv.notify()
        for shadow in dropped:
            self._deliver(shadow, ShadowDropped(f"model {self.name!r} has requests waiting: its shadow scoring was "
                                                "dropped"))
        return job

    def _admit(self, options: RequestOptions, has_media: bool) -> None:
        if self._stopping or not self._thread.is_alive():
            raise WorkerStopped(f"model {self.name!r} is not accepting requests (shutting down)")
        if options.shadow:  # never counted against the queue or a tenant: dropped rather than waiting behind load
            if self._queue or self._held or self.busy_elsewhere() or len(self._queue.shadows) >= self.model.n_seq_max:
                raise ShadowDropped(f"model {self.name!r} has {len(self._queue)} requests and "
                                    f"{len(self._queue.shadows)} shadow scorings waiting: this one was dropped")
            return
        waiting = len(self._queue) + sum(self._held.values())  # held slots are requests about to be queued
        # it would wait when a batch is in progress, or when a full batch is already queued
        if options.reject_if_busy and (self._under_way or waiting >= self.model.n_seq_max):
            raise Busy(self.name, waiting)
        if waiting >= self.max_queue:
            raise Overloaded(self.name, waiting)
        mine = self._queue.waiting(options.tenant) + self._held[options.tenant]
        if mine >= self.max_per_tenant:
            raise TenantOverloaded(self.name, options.tenant or "anonymous", mine)
        if has_media:  # queued media requests hold their pixels and samples in memory
            media = sum(1 for job in self._queue if job.prepared.has_media) + self._held_media
            if media >= self.max_media_jobs:
                raise Overloaded(self.name, self.max_media_jobs, "image or audio requests")

    def withdraw(self, job: Job) -> None:
        """Nobody waits for job any more (call from the event loop): it leaves the queue at once, freeing its slot,
        and its future is cancelled; a job the prefill thread has taken already runs on, its answer dropped."""
        job.cancelled = True
        with self._cv:
            try:
                self._queue.remove(job)
            except ValueError:  # taken already
                pass
        job.future.cancel()

    def _drop_queued(self) -> None:
        """Answer every job still queued WorkerStopped and refuse new ones: no future is left pending."""
        with self._cv:
            self._stopping = True
            jobs = self._queue.clear()
        for job in jobs:
            self._deliver(job, WorkerStopped(f"model {self.name!r} stopped before deciding the request; retry"))

    def _take(self) -> list[Job]:
        while True:
            with self._cv:
                self._idle = not self._queue and not self._queue.shadows
                while not self._queue and not self._queue.shadows and not self._stopping:
                    self._cv.wait()
                self._idle = False
                jobs = self._queue.take(self.model.n_seq_max)
                for job in jobs:
                    job.taken = True
                self._under_way += len(jobs)
            if not jobs or not jobs[0].options.shadow or not self.busy_elsewhere():
                return jobs
            for job in jobs:  # requests are under way: shadow scorings give way, dropped
                self._deliver(job, ShadowDropped(f"the server has requests under way: model {self.name!r}'s shadow "
                                                 "scoring was dropped"))

    def _run(self) -> None:
        try:
            self._serve()
        except Exception:  # noqa: BLE001 - a bug of ours: logged, the model refuses requests from now on
            log.exception("the prefill thread of model %r stopped; restart the server", self.name)
        finally:  # ended or died: what is still queued is answered, never left waiting
            self._drop_queued()

    def _serve(self) -> None:
        while True:
            jobs = self._take()
            if not jobs:
                return  # stopping, and the queue is empty
            now = time.perf_counter()
            ready: list[tuple[Job, Prepared]] = []
            for job in jobs:
                if job.cancelled:  # withdrawn as it was taken: its future is cancelled already, or is now
                    self._deliver(job, CANCELLED)
                    continue
                job.queue_s = now - job.enqueued
                ready.append((job, job.prepared))
            taken: list[tuple[Job, HeadInput]] = []
            held = 0  # prompt tokens whose hidden states wait in taken
            for done in self._prefilled(ready):
                if self.overlap:
                    self._heads.put(done)
                    continue
                taken += self._head_inputs(done)
                held += sum(len(job.prepared.encoded.input_ids) for job, _ in done)
                if held >= self.model.backbone.decode_budget:  # no more waits than one decode on a GPU holds
                    self._finish(taken)
                    taken, held = [], 0
            if taken:
                self._finish(taken)

    def _prefilled(self, ready: list[tuple[Job, Prepared]]) -> Iterator[list[tuple[Job, Prefilled]]]:
        """The jobs prefilled, batch by batch; head-only shadows' jobs first, as they come: their hidden states are
        another model's, so the backbone does not run for them."""
        given = []
        for job in (job for job, _ in ready if job.hidden is not None):
            try:
                given.append((job, job.hidden.prefilled()))
            except MemoryError as exc:  # joining a long prompt's pieces: that shadow's scoring fails, nothing else
                self._deliver(job, exc)
        if given:
            yield given
        for batch in self._batches([item for item in ready if item[0].hidden is None]):
            yield self._prefill(batch)

    def _batches(self, ready: list[tuple[Job, Prepared]]) -> list[list[tuple[Job, Prepared]]]:
        """Greedy packing of text requests under the backbone's batch budget (n_ctx on a GPU, n_ubatch on the CPU:
        Backbone.batch_budget); a request with media decodes alone (llama.cpp takes token ids or embeddings in one
        batch, not both)."""
        budget = self.model.backbone.batch_budget
        batches = [[item] for item in ready if item[1].has_media]
        current, used = [], 0
        for item in (item for item in ready if not item[1].has_media):
            n = len(item[1].encoded.input_ids)
            if current and used + n > budget:
                batches.append(current)
                current, used = [], 0
            current.append(item)
            used += n
        if current:
            batches.append(current)
        return batches

    def _prefill(self, batch: list[tuple[Job, Prepared]]) -> list[tuple[Job, Prefilled]]:
        """One batch through the backbone (a failed batch again one request at a time); a request that fails is
        answered here."""
        try:
            items = self.model.prefill_batch([p for _, p in batch])
        except Exception as exc:  # noqa: BLE001 - MemoryError and the unexpected too: one request must not sink others
            if len(batch) == 1:
                if not isinstance(exc, ClefError):
                    log.error("request failed in the backbone: %r", exc)
                self._deliver(batch[0][0], exc)
                return []
            log.warning("batch of %d failed (%r); retrying one request at a time", len(batch), exc)
            return [done for item in batch for done in self._prefill([item])]
        try:
            self._on_batch(BatchStats(len(batch), sum(len(p.encoded.input_ids) for _, p in batch)))
        except Exception:  # noqa: BLE001 - a metrics fault must not cost the batch its answers
            log.exception("the batch callback failed")
        return [(job, item) for (job, _), item in zip(batch, items)]

    def _run_heads(self) -> None:
        while (work := self._heads.get()) is not None:
            self._finish(self._head_inputs(work))

    def _head_inputs(self, work: list[tuple[Job, Prefilled]]) -> list[tuple[Job, HeadInput]]:
        """Each request's memory rows (ClefModel.head_input); a request that fails is answered here."""
        out = []
        for job, item in work:
            try:
                out.append((job, self.model.head_input(item)))
            except Exception as exc:  # noqa: BLE001 - a fault in one head answers that request only
                self._deliver(job, exc)
        return out

    def _finish(self, work: list[tuple[Job, HeadInput]]) -> None:
        """The head once over the requests still awaited (ClefModel.score); when that fails, each request again
        alone, so that a fault answers its own request only."""
        for job, _ in work:
            if job.cancelled:  # withdrawn while it was prefilled: nobody reads its answer
                self._deliver(job, CANCELLED)
        work = [(job, done) for job, done in work if not job.cancelled]
        if not work:
            return
        try:
            scored = self.model.score([done for _, done in work])
        except Exception as exc:  # noqa: BLE001 - MemoryError, a non-finite answer and the unexpected too
            if len(work) == 1:
                self._deliver(work[0][0], exc)
                return
            log.info("the head over %d requests failed (%r); scoring them one at a time", len(work), exc)
            for one in work:
                self._finish([one])
            return
        for (job, done), outcome in zip(work, scored):
            self._hand_over(job, done)
            self._deliver(job, outcome)

    def _hand_over(self, job: Job, done: HeadInput) -> None:
        """A scored request's hidden states for its model's head-only shadows (keep_hidden models only), left before its
        answer is delivered so the door finds them once it has the answer; references, no copy, no compute."""
        handoff = job.options.handoff
        if handoff is not None and self.model.keep_hidden:
            handoff.states = self.model.hidden_states(done.item)

    def _deliver(self, job: Job, outcome: Scored | BaseException | object) -> None:
        """Resolve job's future on its loop: an answer, an error, or CANCELLED (a taken job no longer under way)."""
        if job.taken:
            with self._cv:
                job.taken = False
                self._under_way -= 1

        def resolve() -> None:
            if job.future.done():
                return
            if outcome is CANCELLED:
                job.future.cancel()
            elif isinstance(outcome, BaseException):
                job.future.set_exception(outcome)
            else:
                job.future.set_result(outcome)

        try:
            job.loop.call_soon_threadsafe(resolve)
        except RuntimeError:  # the loop closed: nobody is waiting any more
            pass
