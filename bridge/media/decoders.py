"""Untrusted media decoded in worker processes: a decoder bomb costs one worker, never the server.

A pool of `workers` processes, forked from multiprocessing's forkserver (a fresh interpreter that has
imported numpy, PyAV and Pillow once; never a fork of the server, whose llama.cpp threads a fork would
copy half-held). Each worker caps its own address space (RLIMIT_AS, `memory_mb`), so an allocation past
it fails inside the worker (MemoryError, or FFmpeg's ENOMEM) instead of growing the server; each job
has a wall-clock limit (`seconds`), past which its worker is killed (SIGKILL reaches a resampler that
holds the GIL in C). A worker that fails a job on memory, runs out of time or dies is replaced by a
fresh one, forked when a job next needs it. The event loop awaits a job; the work of sending it and
waiting runs in the pool's own threads, one per worker, never in the default executor the model
workers' callers share.

A job is a module-level function and its arguments (pickled by reference and by value: request.decode_kind
and a kind's inputs), so a medium's decoding runs here unchanged; errors cross back pickled by their
fields (errors.MediaRejected.__reduce__), without tracebacks.
"""

from __future__ import annotations

import asyncio
import ctypes
import logging
import multiprocessing
import os
import pickle
import queue
import resource
import signal
import threading
import time
import traceback
import weakref
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace
from typing import Any, Callable

from ...head.media import AUDIO, VIDEO
from .errors import DecodeOverMemory, DecodeOverTime, DecoderStopped, MediaRejected
from .kinds import TABLE
from .video import FPS, MAX_FRAME_PIXELS, VideoLimits

log = logging.getLogger("clef_bridge.decoders")

# The kinds decoded here: containers and codecs from anyone. Images stay in a thread: their pixels are bounded from
# the header before decoding (max_image_pixels), and shipping them back costs more than decoding them (docs/media.md
# has the numbers).
ISOLATED = frozenset(kind for kind, row in TABLE.items() if row.isolated)
# What the forkserver imports once, so that a worker forked from it starts in milliseconds: this module (the
# workers' main), the decoders (request.py imports audio.py and images.py) and their libraries.
PRELOAD = ("numpy", "av", "PIL.Image", "clef_bridge.bridge.media.request", __name__)
DECODER_NICE = 10
MIN_MEMORY_MB = 384  # an idle worker (Python, numpy, PyAV with FFmpeg, Pillow) maps about 260 MB
# a worker decoding the largest source (MAX_SOURCE_PIXELS): its libraries, two malloc arenas and FFmpeg's buffers
BASE_MEMORY_MB = 768
# a kept frame (at most MAX_FRAME_PIXELS) once sized for the tower: smart_resize's rounding to whole 32-pixel tokens
# grows a frame of extreme shape by under half again, so twice the pixels bound it
MAX_TOWER_FRAME_BYTES = 3 * 2 * MAX_FRAME_PIXELS
_OK, _REJECTED, _MEMORY, _FAULT = "ok", "rejected", "memory", "fault"  # a worker's answers
_TIMEOUT, _STOPPED = "timeout", "stopped"  # what the server finds when none came
_ABANDONED = "abandoned"  # the request went away (its client hung up): its decoder is stopped, not waited for
POLL_S = 0.05  # how often a job's thread looks whether its request is still there
M_ARENA_MAX = -8  # glibc's mallopt parameter (malloc.h)


@dataclass(frozen=True)
class DecoderLimits:
    """[server] decode_workers, decode_memory_mb, decode_timeout_s, decode_video_timeout_s: the pool's size and each
    job's caps."""

    workers: int = 2  # processes decoding at once; more jobs wait for one
    # one worker's address space, its ~260 MB of libraries included; 0: what the video limits need (memory_for)
    memory_mb: int = 0
    # one job's wall clock (a request's clips), sending and answering included: four 60 s MP3s take 0.3 s on one core
    seconds: float = 5.0
    # a request's videos: a 60 s 1080p clip decodes in 10-30 s on one loaded core (docs/media.md)
    video_seconds: float = 60.0

    def seconds_for(self, kind: str) -> float:
        """A job's wall-clock limit for one kind of media."""
        return self.video_seconds if kind == VIDEO.name else self.seconds

    def timeout_key(self, kind: str) -> str:
        return "decode_video_timeout_s" if kind == VIDEO.name else "decode_timeout_s"


# --- the worker process ---------------------------------------------------------------------------

def _serve(conn: Any, memory_bytes: int) -> None:
    """A worker's main: jobs in, outcomes out, until the pipe closes or a job ran out of memory."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C stops the server, which stops the pool
    _few_arenas()
    resource.setrlimit(resource.RLIMIT_AS, (memory_bytes, memory_bytes))
    while True:
        try:
            fn, args = conn.recv()
        except (EOFError, OSError):
            return
        outcome = _outcome(fn, args)
        try:
            _send(conn, outcome)
        except MemoryError:  # the result itself did not fit: a fresh worker will
            _send(conn, (_MEMORY, None))
            return
        if outcome[0] == _MEMORY:
            return  # its heap may be fragmented near the cap: a fresh worker takes the next job


def memory_for(videos: VideoLimits) -> int:
    """The address space (MB, rounded up to 64) a worker needs for the largest request the video limits allow: its
    base, then every video's kept frames at the most a tower-sized frame takes. Measured at the defaults: two 60 s
    H.264 clips of 7,680 x 4,320 (MAX_SOURCE_PIXELS) peaked at 908 MB of address space, 186 MB of it their frames,
    two 4K or 1080p ones at 780 MB; four 60 s audio clips at 340 MB."""
    frames = int(videos.max_seconds * FPS) + 2  # kept at 2 fps, and the padding frame
    need = BASE_MEMORY_MB + videos.max_videos * frames * MAX_TOWER_FRAME_BYTES / 2**20
    return -(-int(need) // 64) * 64


def _few_arenas() -> None:
    """glibc gives each thread that allocates a malloc arena of its own, 64 MB of address space each, which
    RLIMIT_AS counts though little of it is used: FFmpeg's threads took some 300 MB of the cap that way. Two arenas
    serve a worker's few threads (no effect where the C library is not glibc)."""
    try:
        ctypes.CDLL("libc.so.6").mallopt(M_ARENA_MAX, 2)
    except (OSError, AttributeError):
        pass


def _outcome(fn: Callable[..., Any], args: tuple) -> tuple[str, Any]:
    try:
        return _OK, fn(*args)
    except MediaRejected as exc:
        return _REJECTED, exc
    except MemoryError:  # av's error.MemoryError (FFmpeg's ENOMEM) is one too
        return _MEMORY, None
    except Exception:  # noqa: BLE001 - a fault of ours: reported to the server, which logs it
        return _FAULT, traceback.format_exc()


# --- the server's side ----------------------------------------------------------------------------

class _Worker:
    """One worker process and the server's end of its pipe."""

    def __init__(self, context: Any, memory_bytes: int):
        self.conn, child = context.Pipe()
        self.process = context.Process(target=_serve, args=(child, memory_bytes), name="clef-decoder", daemon=True)
        self.process.start()
        child.close()

    def kill(self) -> None:
        self.process.kill()
        self.process.join()
        self.conn.close()


def _kill_all(workers: set[_Worker]) -> None:
    for worker in list(workers):
        worker.kill()
    workers.clear()


def _send(conn: Any, outcome: tuple[str, Any]) -> None:
    """(status, value) over the pipe with its arrays out of band (pickle protocol 5): the frames go from their own
    memory to the pipe, never copied into one pickled bytes object first (a 60 s clip's frames are about 90 MB)."""
    buffers: list[pickle.PickleBuffer] = []
    head = pickle.dumps(outcome, protocol=5, buffer_callback=buffers.append)
    conn.send_bytes(len(buffers).to_bytes(4, "little") + head)
    for buffer in buffers:
        conn.send_bytes(buffer.raw())


def _recv(conn: Any) -> tuple[str, Any]:
    head = conn.recv_bytes()
    buffers = [conn.recv_bytes() for _ in range(int.from_bytes(head[:4], "little"))]
    return pickle.loads(head[4:], buffers=buffers)


def _receive(conn: Any) -> tuple[str, Any]:
    """A worker's (status, value), its MediaRejected raised; no frame here keeps the error (the error's traceback
    keeps the frames, so a frame that kept the error would make a cycle that lives until a full collection)."""
    status, value = _recv(conn)
    if status != _REJECTED:
        return status, value
    try:
        raise value
    finally:
        del value


class DecoderPool:
    """`limits.workers` decoder processes: run(fn, args, loc) awaits fn(*args) in one, within the limits."""

    def __init__(self, limits: DecoderLimits = DecoderLimits()):
        # unset memory: what the default video limits need (a server passes ServerSpec.decoder_limits, its own)
        self.limits = limits if limits.memory_mb else replace(limits, memory_mb=memory_for(VideoLimits()))
        self._context = multiprocessing.get_context("forkserver")
        self._idle: queue.SimpleQueue[_Worker | None] = queue.SimpleQueue()  # None: a slot with no worker yet
        for _ in range(limits.workers):
            self._idle.put(None)
        self._workers: set[_Worker] = set()
        self._threads = ThreadPoolExecutor(limits.workers, thread_name_prefix="clef-decode")  # threads start lazily
        self._lock = threading.Lock()
        self._closed = False
        self.replaced = 0  # workers killed or lost, and so replaced: for tests and logs
        self._finalizer = weakref.finalize(self, _kill_all, self._workers)

    def start(self) -> None:
        """Fork the workers in the background: the server's start does not wait for them, a first job might."""
        threading.Thread(target=self._warm, name="clef-decoder-start", daemon=True).start()

    def _warm(self) -> None:
        slots = []
        while len(slots) < self.limits.workers:
            try:
                slots.append(self._idle.get_nowait())
            except queue.Empty:  # the others are out with jobs, which fork their own
                break
        for slot in slots:
            self._idle.put(slot if slot is not None else self._fork())

    def _fork(self) -> _Worker | None:
        # Linux's nice is per thread and a child inherits its forking thread's: the forkserver's imports and every
        # decoder run behind the server's event loop and llama.cpp threads (the first answers do not wait on them)
        tid = threading.get_native_id()
        os.setpriority(os.PRIO_PROCESS, tid, max(DECODER_NICE, os.getpriority(os.PRIO_PROCESS, tid)))
        with self._lock:
            if self._closed:
                return None
            self._context.set_forkserver_preload(list(PRELOAD))  # read once, when the forkserver starts
            worker = _Worker(self._context, self.limits.memory_mb * 2**20)
            self._workers.add(worker)
            return worker

    def close(self) -> None:
        """Kill every worker; a job in flight answers DecoderStopped."""
        with self._lock:
            self._closed = True
        self._threads.shutdown(wait=False, cancel_futures=True)
        self._finalizer()

    async def run(self, fn: Callable[..., Any], args: tuple, loc: tuple[str | int, ...], kind: str = AUDIO.name
                  ) -> Any:
        """fn(*args) in a worker (fn: a module-level function); a job over a limit (kind's time limit) raises its
        error at loc. A request that goes away mid-decode stops its job's decoder (a fresh one replaces it), so
        abandoned jobs never hold the pool while their clients' retries wait."""
        abandoned = threading.Event()
        try:
            return await asyncio.get_running_loop().run_in_executor(self._threads, self._job, fn, args, loc, kind,
                                                                    abandoned)
        except asyncio.CancelledError:
            abandoned.set()
            raise

    def _job(self, fn: Callable[..., Any], args: tuple, loc: tuple[str | int, ...], kind: str,
             abandoned: threading.Event) -> Any:
        worker = self._idle.get()
        if worker is not None and not worker.process.is_alive():  # lost while idle: not this job's doing
            self._discard(worker)
            worker = None
        if worker is None:
            worker = self._fork_or_free_slot()
            if worker is None:
                raise RuntimeError("the decoder pool is closed")
        status = _REJECTED  # what leaves _exchange as an exception (a pickling error included): the worker is fine
        try:
            status, value = self._exchange(worker, (fn, args), self.limits.seconds_for(kind), abandoned)
        finally:
            if status in (_OK, _REJECTED, _FAULT):
                self._idle.put(worker)
            else:
                self._retire(worker)
        if status == _OK:
            return value
        raise self._error(status, value, worker, loc, kind)

    def _exchange(self, worker: _Worker, job: tuple, seconds: float, abandoned: threading.Event
                  ) -> tuple[str, Any]:
        try:
            worker.conn.send(job)
            deadline = time.monotonic() + seconds
            while not worker.conn.poll(max(0.0, min(POLL_S, deadline - time.monotonic()))):
                if abandoned.is_set():
                    return _ABANDONED, None
                if time.monotonic() >= deadline:
                    return _TIMEOUT, None
            return _receive(worker.conn)
        except (EOFError, OSError):  # it died (or the pool closed) before or while it worked
            return _STOPPED, None

    def _fork_or_free_slot(self) -> _Worker | None:
        """A new worker for a slot; where forking fails the slot goes back empty (a later job forks again), so a
        failed fork never leaves the pool a slot short and later jobs waiting forever."""
        try:
            return self._fork()
        except BaseException:
            self._idle.put(None)
            raise

    def _error(self, status: str, value: Any, worker: _Worker, loc: tuple[str | int, ...], kind: str) -> Exception:
        limits = self.limits
        if status == _TIMEOUT:
            return DecodeOverTime(loc, f"took more than {limits.seconds_for(kind):g} s to decode, the limit per "
                                       f"request and medium ({limits.timeout_key(kind)} in models.toml [server]); its "
                                       "decoder was stopped",
                                  "value_error.decode.timeout")
        if status == _MEMORY:
            return DecodeOverMemory(loc, f"needed more than {limits.memory_mb} MB to decode, the limit per decoder "
                                         "(decode_memory_mb in models.toml [server]); its decoder was replaced",
                                    "value_error.decode.memory")
        if status == _FAULT:
            log.error("a decoder failed:\n%s", value)
            return RuntimeError("a decoder failed (its traceback is in the server's log)")
        code = worker.process.exitcode
        how = f"signal {-code}" if code is not None and code < 0 else f"exit code {code}"
        return DecoderStopped(loc, f"stopped its decoder ({how}) before it was decoded; re-encode it",
                              "value_error.decode.stopped")

    def _retire(self, worker: _Worker) -> None:
        """Kill a worker and fork its successor in the background (the next job need not wait for it)."""
        self._discard(worker)
        threading.Thread(target=self._replace, name="clef-decoder-start", daemon=True).start()

    def _replace(self) -> None:
        try:
            self._idle.put(self._fork())
        except Exception:  # noqa: BLE001 - the slot goes back empty: the next job forks it
            log.exception("could not start a decoder; the next job will try again")
            self._idle.put(None)

    def _discard(self, worker: _Worker) -> None:
        worker.kill()
        with self._lock:
            self._workers.discard(worker)
            self.replaced += 1
