"""bridge/media/decoders.py: jobs run in worker processes; a job over its memory cap answers 413, one over its time
limit 422, and either costs its worker (killed, replaced), never the caller; a worker that dies is replaced; the
event loop runs on meanwhile; audio decodes there to the very samples the thread made.

The jobs are functions of the standard library (a worker imports them by name): time.sleep to outlast the limit,
bytearray to outgrow the cap, os._exit and os.abort to die."""

from __future__ import annotations

import asyncio
import os
import pickle
import signal
import struct
import time

import numpy as np
import pytest
from clef_bridge.bridge.media.images import ImageGeometry
from clef_bridge.bridge.config.registry import ServerSpec
from clef_bridge.bridge.media import video
from clef_bridge.bridge.media.audio import AudioInput, AudioRejected
from clef_bridge.bridge.media.decoders import ISOLATED, DecoderLimits, DecoderPool
from clef_bridge.bridge.media.errors import DecodeOverMemory, DecodeOverTime, DecoderStopped
from clef_bridge.bridge.media.request import AUDIO, FIELDS, VIDEO, DecodeSettings, decode_kind
from clef_bridge.bridge.media.video import VideoInput
from clef_bridge.bridge.service.local import LocalService

from . import fixturegen_video
from .fixturegen import FIXTURES
from .test_audio import _input, clip
from .test_media_cycles import codec
from .test_service import BODY, WAV, FakeModel, with_media

pytestmark = pytest.mark.integration

LOC = ("body", "audio")
# The shared pool's jobs must never meet its time limit, however loaded the machine (a worker's first job waits for
# its fork): the time-limit tests use pools of their own with short limits.
LIMITS = DecoderLimits(workers=2, memory_mb=512, seconds=120.0)
SHORT = DecoderLimits(workers=1, memory_mb=512, seconds=1.5)
SETTINGS = DecodeSettings(ImageGeometry(), ServerSpec().media_limits)  # Qwen3-Omni's 32-pixel tokens


@pytest.fixture(scope="module")
def pool():
    decoders = DecoderPool(LIMITS)
    decoders.start()
    yield decoders
    decoders.close()


def run(coro):
    return asyncio.run(coro)


async def ticking(job):
    """The job's outcome and the longest the event loop went without a tick while it ran."""
    gaps, last = [0.0], time.monotonic()

    async def tick():
        nonlocal last
        while True:
            await asyncio.sleep(0.01)
            gaps.append(time.monotonic() - last)
            last = time.monotonic()

    ticker = asyncio.create_task(tick())
    try:
        return await job, max(gaps)
    finally:
        ticker.cancel()


def test_audio_decodes_in_a_worker_to_the_samples_the_thread_makes(pool):
    clips = (_input(clip(1.5, 44100, 2, "wav")), _input(clip(1.0, 22050, 1, "mp3")))
    got = run(pool.run(decode_kind, (AUDIO, clips, SETTINGS), LOC))
    want = decode_kind(AUDIO, clips, SETTINGS)
    assert len(got) == 2 and all(np.array_equal(g, w) and g.dtype == np.float32 for g, w in zip(got, want))


def test_a_refusal_crosses_back_with_its_problems_and_keeps_the_worker(pool):
    replaced = pool.replaced
    good = _input(clip(0.5, 16000, 1, "wav"))
    bad = [AudioInput(("body", "audio", i), codec(good.data, 0x3F3F), good.header, b"") for i in (1, 2)]
    with pytest.raises(AudioRejected) as info:
        run(pool.run(decode_kind, (AUDIO, (good, *bad), SETTINGS), LOC))
    assert type(info.value) is AudioRejected and [p.loc for p in info.value.problems] == [("body", "audio", 1),
                                                                                          ("body", "audio", 2)]
    assert all("cannot be decoded as WAV" in p.msg for p in info.value.problems) and pool.replaced == replaced


def test_a_job_past_the_time_limit_is_killed_answered_422_and_its_worker_replaced():
    pool = DecoderPool(SHORT)
    try:
        assert run(pool.run(abs, (-2,), LOC)) == 2  # its worker forked: the time below is the job's
        started = time.monotonic()
        with pytest.raises(DecodeOverTime) as info:
            run(pool.run(time.sleep, (30,), LOC))
        assert time.monotonic() - started < SHORT.seconds + 1.0
        assert info.value.category.value == "invalid" and "decode_timeout_s" in str(info.value)
        assert info.value.loc == LOC and pool.replaced == 1
        assert run(pool.run(abs, (-3,), LOC)) == 3  # the pool still answers
    finally:
        pool.close()


def test_a_job_past_the_memory_cap_answers_413_and_the_server_never_holds_it(pool):
    """Whatever the load: the pool's time limit (LIMITS.seconds) is far beyond any fork and allocation."""
    replaced = pool.replaced
    before = _rss_mb()
    with pytest.raises(DecodeOverMemory) as info:
        run(pool.run(bytearray, (2 * 2**30,), LOC))
    assert info.value.category.value == "too_large" and "decode_memory_mb" in str(info.value)
    assert pool.replaced == replaced + 1 and _rss_mb() - before < 50
    assert len(run(pool.run(bytearray, (64 * 2**20,), LOC))) == 64 * 2**20  # within the cap: answered


@pytest.mark.parametrize("fn, args, how", [(os._exit, (3,), "exit code 3"), (os.abort, (), "signal 6")])
def test_a_worker_that_dies_answers_422_and_is_replaced(pool, fn, args, how):
    replaced = pool.replaced
    with pytest.raises(DecoderStopped, match=how):
        run(pool.run(fn, args, LOC))
    assert pool.replaced == replaced + 1 and run(pool.run(abs, (-1,), LOC)) == 1


def test_workers_lost_while_idle_are_replaced_before_a_job_meets_them(pool):
    run(pool.run(abs, (-1,), LOC))
    for worker in list(pool._workers):
        os.kill(worker.process.pid, signal.SIGKILL)
        worker.process.join()
    assert [run(pool.run(abs, (-i,), LOC)) for i in range(4)] == [0, 1, 2, 3]


def test_the_event_loop_ticks_while_jobs_run(pool):
    async def four():
        return await asyncio.gather(*(pool.run(time.sleep, (0.3,), LOC) for _ in range(4)))

    results, gap = run(ticking(four()))
    assert results == [None] * 4 and gap < 0.2


def test_a_fault_of_ours_in_a_worker_is_a_500_with_the_traceback_logged(pool, caplog):
    with pytest.raises(RuntimeError, match="a decoder failed"):
        run(pool.run(int, ("not a number",), LOC))
    assert "ValueError: invalid literal" in caplog.text


def test_closing_kills_the_workers():
    decoders = DecoderPool(DecoderLimits(workers=1, memory_mb=512, seconds=5))
    assert run(decoders.run(abs, (-2,), LOC)) == 2
    [worker] = list(decoders._workers)
    decoders.close()
    assert not worker.process.is_alive()


def _rss_mb() -> float:
    with open("/proc/self/status") as status:
        return next(int(line.split()[1]) for line in status if line.startswith("VmRSS:")) / 1024


def test_the_service_decodes_audio_in_its_pool_and_refuses_a_lying_header_before_it():
    """The service's path: a clip's samples come from a decoder process; the issue's 2^31-1 Hz WAV is refused from
    its header (422) before any worker decodes it (the pool's own cap, the second line, is tested above)."""
    model = FakeModel(media=(AUDIO,))
    with LocalService(model, ServerSpec(decoders=LIMITS)) as local:
        local.decide(with_media(BODY, audio=WAV))
        pids = {w.process.pid for w in local.service.decoders._workers}
        with pytest.raises(AudioRejected) as refused:
            local.decide(with_media(BODY, audio=lying_wav(2**31 - 1)))
        assert refused.value.problems[0].type == "value_error.audio.rate"
        assert pids and local.service.decoders.replaced == 0
        assert {w.process.pid for w in local.service.decoders._workers} == pids
    [(_, media)] = model.prepared
    assert media.audio[0].shape == (1600,) and not any(w.process.is_alive() for w in local.service.decoders._workers)


def lying_wav(rate: int) -> bytes:
    """The issue's repro: 8-bit PCM whose rate and byte rate say `rate`, 4,096 zero bytes."""
    fmt = struct.pack("<HHIIHH", 1, 1, rate, rate, 1, 8)
    body = b"WAVE" + b"fmt " + struct.pack("<I", 16) + fmt + b"data" + struct.pack("<I", 4096) + bytes(4096)
    return b"RIFF" + struct.pack("<I", len(body)) + body


def test_a_video_decodes_in_a_worker_to_the_frames_the_thread_makes(pool):
    """Video is an ISOLATED kind: its frames and soundtrack come back from a worker equal to the thread's."""
    data = fixturegen_video.build_clips(FIXTURES / "video")["mp4_sounded_big"].read_bytes()
    videos = (VideoInput(("body", "videos", 0), data, video.sniff(data, LOC), b""),)
    got = run(pool.run(decode_kind, (VIDEO, videos, SETTINGS), LOC, VIDEO))
    want = decode_kind(VIDEO, videos, SETTINGS)
    assert VIDEO in ISOLATED and LIMITS.seconds_for(VIDEO) == LIMITS.video_seconds != LIMITS.seconds
    assert pickle.dumps(got) == pickle.dumps(want)


def test_a_videos_time_limit_is_its_own_key():
    limits = DecoderLimits(workers=1, memory_mb=512, seconds=1.0, video_seconds=0.5)
    decoders = DecoderPool(limits)
    try:
        with pytest.raises(DecodeOverTime) as info:
            run(decoders.run(time.sleep, (30,), LOC, VIDEO))
        assert "decode_video_timeout_s" in str(info.value) and "0.5 s" in str(info.value)
    finally:
        decoders.close()


def test_a_job_whose_request_went_away_frees_its_decoder_at_once():
    """A request dropped mid-decode (its client hung up) stops its decoder, so its client's retry does not wait out
    the abandoned job's time limit behind it (issue 37's shape in the pool)."""
    decoders = DecoderPool(DecoderLimits(workers=1, memory_mb=512, seconds=30))

    async def main():
        abandoned = asyncio.create_task(decoders.run(time.sleep, (30,), LOC))
        for _ in range(3000):  # until its job holds the one worker (sent to it, or about to be)
            if decoders._workers and decoders._idle.qsize() == 0:
                break
            await asyncio.sleep(0.01)
        abandoned.cancel()
        assert await asyncio.wait_for(decoders.run(abs, (-2,), LOC), 10) == 2

    try:
        run(main())
        assert decoders.replaced == 1  # the abandoned job's decoder, stopped
    finally:
        decoders.close()


def test_a_failed_fork_leaves_no_slot_lost():
    decoders = DecoderPool(DecoderLimits(workers=1, memory_mb=512, seconds=5))
    real_fork, calls = decoders._fork, []

    def fork_once_failing():
        calls.append(1)
        if len(calls) == 1:
            raise OSError(12, "Cannot allocate memory")
        return real_fork()

    decoders._fork = fork_once_failing
    try:
        with pytest.raises(OSError):
            run(decoders.run(abs, (-1,), LOC))
        assert run(asyncio.wait_for(decoders.run(abs, (-4,), LOC), 10)) == 4  # the slot came back: no wait forever
    finally:
        decoders.close()


@pytest.mark.parametrize("kind", [AUDIO, VIDEO])
def test_the_service_gives_each_kind_its_own_time_limit(kind):
    """The service hands the pool each medium's kind: a video decodes under decode_video_timeout_s, audio under
    decode_timeout_s. The other kind's limit is too short for any job (1 us), so the medium answers only under its
    own; the limit each job was given is read where the pool waits for its worker (a timing would depend on load)."""
    movie = fixturegen_video.build_clips(FIXTURES / "video")["mp4_silent_small"].read_bytes()
    other = VIDEO if kind == AUDIO else AUDIO
    seconds = {kind: 120.0, other: 1e-6}
    limits = DecoderLimits(workers=1, memory_mb=512, seconds=seconds[AUDIO], video_seconds=seconds[VIDEO])
    model = FakeModel(media=(AUDIO, VIDEO))
    body = {AUDIO: with_media(BODY, audio=WAV), VIDEO: with_media(BODY, videos=movie)}
    with LocalService(model, ServerSpec(decoders=limits)) as local:
        pool, waited = local.service.decoders, []
        exchange = pool._exchange
        pool._exchange = lambda worker, job, s, gone: waited.append((job[1][0], s)) or exchange(worker, job, s, gone)
        local.decide(body[kind])
    assert waited == [(kind, seconds[kind])]
    [(_, media)] = model.prepared
    assert media.kinds == (kind,) and len(media.of(kind)) == 1
    if kind == VIDEO:
        assert media.of(VIDEO)[0].frames.ndim == 4  # decoded frames reached the model
