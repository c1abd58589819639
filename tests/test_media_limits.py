"""Media limits at their boundaries, from header bytes built by hand (bridge/media/video.py `check`, request.py
`extract`, audio.py `sniff`): a video of exactly max_video_seconds passes and one just over is a 413, as audio's
are; max_media_bytes counts every kind of a request with videos together; a WAV whose odd-sized chunk before the
data is padded to even (as ffmpeg writes its LIST/ISFT tag) is read with its true duration; the service hands the
decoder pool each medium's kind, so a video gets decode_video_timeout_s."""

from __future__ import annotations

import base64
import struct

import pytest
from clef_bridge.bridge.media.audio import AudioLimits, sniff as sniff_audio
from clef_bridge.bridge.media.request import AUDIO, VIDEO, extract
from clef_bridge.bridge.media.video import MAX_SOURCE_FPS, VideoLimits, VideoTooLarge, check, sniff
from clef_bridge.bridge.service.systemone import decide_systemone

from .fixturegen_vision import encoded, picture
from .test_media_headers import data_chunk, fmt_chunk, riff
from .test_video_headers import box, mkv, mp4

pytestmark = pytest.mark.unit

LOC = ("body", "videos", 0)
BODY = {"state": "s", "questions": {"q": {"type": "noul"}}}


def ffmpeg_mp4(movie_ticks: int, track_ticks: int, track_scale: int = 15360, frames: int = 60) -> bytes:
    """An MP4's header as `ffmpeg -t` writes one: the movie's duration in 1/1000 s, the video track's in its own
    timescale (15,360 for 30 fps H.264), 64 x 64 frames of 10 bytes."""
    mvhd = box(b"mvhd", struct.pack(">B3xIIII", 0, 0, 0, 1000, movie_ticks), bytes(80))
    tkhd = box(b"tkhd", bytes(76), struct.pack(">II", 64 << 16, 64 << 16))
    mdhd = box(b"mdhd", struct.pack(">B3xIIII", 0, 0, 0, track_scale, track_ticks), bytes(4))
    hdlr = box(b"hdlr", bytes(8), b"vide", bytes(13))
    stsz = box(b"stsz", struct.pack(">B3xII", 0, 10, frames))
    trak = box(b"trak", tkhd, box(b"mdia", mdhd, hdlr, box(b"minf", box(b"stbl", stsz))))
    return box(b"ftyp", b"isom", bytes(4)) + box(b"moov", mvhd, trak) + box(b"mdat", bytes(10 * frames))


def checked(data: bytes, limits: VideoLimits = VideoLimits()) -> None:
    check(sniff(data, LOC), len(data), limits, LOC)


def test_a_video_of_exactly_max_video_seconds_passes_and_one_just_over_is_a_413():
    """`ffmpeg -t 60` writes a header of exactly 60 s: it is allowed; a tick more is not (audio's boundary too)."""
    exact = ffmpeg_mp4(60_000, 60 * 15360)
    assert sniff(exact, LOC).duration_s == 60.0
    checked(exact)
    for over in (ffmpeg_mp4(60_000, 60 * 15360 + 1), mp4(60.001, 64, 64, 2, 10, mdat=20), mkv(60.001, 64, 64, 2.0)):
        with pytest.raises(VideoTooLarge, match=r"the limit is 60 s per video \(max_video_seconds\)") as caught:
            checked(over)
        assert caught.value.category.value == "too_large" and caught.value.problems[0].type == \
            "value_error.video.seconds"
    checked(mkv(60.0, 64, 64, 2.0))
    checked(mp4(2.5, 64, 64, 2, 10, mdat=20), VideoLimits(max_seconds=2.5))  # a configured limit: the same boundary
    with pytest.raises(VideoTooLarge, match="max_video_seconds"):
        checked(mp4(2.501, 64, 64, 2, 10, mdat=20), VideoLimits(max_seconds=2.5))


def test_the_frame_count_bound_is_inclusive_too():
    """At most MAX_SOURCE_FPS frames per allowed second are decoded: that many pass, one more is refused."""
    limits = VideoLimits(max_seconds=2.0)
    most = int(MAX_SOURCE_FPS * limits.max_seconds)
    checked(ffmpeg_mp4(2000, 2 * 15360, frames=most), limits)
    with pytest.raises(VideoTooLarge, match="frames"):
        checked(ffmpeg_mp4(2000, 2 * 15360, frames=most + 1), limits)


def test_a_video_request_over_max_video_seconds_is_refused_through_extract():
    body = {**BODY, "videos": [base64.b64encode(ffmpeg_mp4(60_000, 60 * 15360 + 1)).decode()]}
    with pytest.raises(VideoTooLarge) as caught:
        extract(body)
    assert caught.value.problems[0].loc == LOC
    extract({**BODY, "videos": [base64.b64encode(ffmpeg_mp4(60_000, 60 * 15360)).decode()]})


PNG = encoded(picture(64, 64, seed=5), "PNG")
WAV = riff(fmt_chunk(), data_chunk(bytes(3200)))
CLIP = mp4(1.0, 64, 64, 2, 10, mdat=20)


def media_body(images: int = 1, audio: int = 1, videos: int = 1, assets: bool = False) -> dict:
    """A body with an image, an audio clip and a video (each included `n` times), inline or as assets."""
    items = [("image", PNG)] * images + [("audio", WAV)] * audio + [("video", CLIP)] * videos
    if assets:
        formats = {"image": "png", "audio": "wav", "video": "mp4"}
        assets = {f"<m{i}>": {"type": kind, "format": formats[kind], "data_base64": base64.b64encode(data).decode()}
                  for i, (kind, data) in enumerate(items)}
        return {**BODY, "state": " ".join(assets), "assets": assets}
    fields = {"image": "images", "audio": "audio", "video": "videos"}
    body = dict(BODY)
    for kind, data in items:
        body.setdefault(fields[kind], []).append(base64.b64encode(data).decode())
    return body


@pytest.mark.parametrize("assets", [False, True], ids=["inline", "assets"])
def test_max_media_bytes_counts_images_and_audio_beside_the_videos(assets):
    total = len(PNG) + len(WAV) + len(CLIP)
    assert len(CLIP) < total - max(len(PNG), len(WAV))  # any one kind left out fits under total - 1
    extract(media_body(assets=assets), None, {VIDEO: VideoLimits(max_media_bytes=total)})
    tight = VideoLimits(max_media_bytes=total - 1)
    with pytest.raises(VideoTooLarge) as caught:
        extract(media_body(assets=assets), None, {VIDEO: tight})
    [problem] = caught.value.problems
    assert problem.type == "value_error.video.total_bytes" and "max_media_bytes" in problem.msg
    assert f"hold {total} bytes together" in problem.msg
    assert problem.loc == ("body", "assets" if assets else "videos")
    for fewer in ({"images": 0}, {"audio": 0}):  # without either kind the request fits: both were counted
        extract(media_body(assets=assets, **fewer), None, {VIDEO: tight})


def test_max_media_bytes_binds_only_requests_with_videos():
    tiny = VideoLimits(max_media_bytes=10)
    found = extract(media_body(images=2, audio=2, videos=0), None, {VIDEO: tiny})
    assert len(found.media.images) == 2 and len(found.media.audio) == 2


def odd_chunk_wav(samples: int = 1600, rate: int = 16000) -> bytes:
    """16-bit mono PCM with a LIST/INFO chunk of odd size (an ISFT tag of 13 bytes) before `data`, padded to even
    with one zero byte after it, as RIFF requires."""
    isft = b"Lavf61.7.100\0"
    info = b"INFO" + b"ISFT" + struct.pack("<I", len(isft)) + isft
    assert len(info) % 2 == 1
    listed = b"LIST" + struct.pack("<I", len(info)) + info + b"\0"
    return riff(fmt_chunk(rate=rate), listed, data_chunk(bytes(2 * samples)))


def test_a_wav_with_an_odd_sized_chunk_before_its_data_has_its_true_duration():
    for samples, rate in ((1600, 16000), (44100 * 3 + 7, 44100)):
        data = odd_chunk_wav(samples, rate)
        header = sniff_audio(data, ("body", "audio", 0), AudioLimits())
        assert header.format == "wav" and header.duration_s == samples / rate


class RecordingPool:
    """The decoder pool's interface (DecoderPool.run, its default kind included): records each job's kind and
    answers stand-ins without decoding."""

    def __init__(self):
        self.jobs: list[tuple[str, str]] = []

    async def run(self, fn, args, loc, kind: str = AUDIO):
        medium, inputs, _ = args
        self.jobs.append((medium, kind))
        return tuple(f"decoded {medium} {i}" for i in range(len(inputs)))


def test_the_service_hands_the_pool_each_mediums_kind_for_its_time_limit():
    """A video's job must be the pool's video job (decode_video_timeout_s), not audio's (decode_timeout_s)."""
    from .test_service import BODY as DECIDE, WAV as CLIP_WAV, FakeModel, run, service_for, with_media

    model = FakeModel(media=(AUDIO, VIDEO))
    service, workers = service_for(model)
    service.decoders = pool = RecordingPool()
    body = with_media(DECIDE, audio=CLIP_WAV, videos=ffmpeg_mp4(2000, 2 * 15360))
    run(workers, lambda: decide_systemone(service, body, "fake"))
    assert sorted(pool.jobs) == [(AUDIO, AUDIO), (VIDEO, VIDEO)]
    [(_, media)] = model.prepared
    assert media.of(VIDEO) == ("decoded video 0",) and media.of(AUDIO) == ("decoded audio 0",)
