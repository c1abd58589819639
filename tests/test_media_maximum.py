"""The defaults agree with each other (issue 50 item 3): a request holding the most media the documented limits allow,
all at once, is answered (it was a 413 decode_memory_exceeded: one valid 60 s 720p H.264 + AAC clip already failed
at the old 768 MB decoder default). On the built-in Clef-omni demo over a real socket, with the server's default
[server] limits: max_videos (2) clips of max_video_seconds (60 s) at the largest source frame (MAX_SOURCE_PIXELS, 8K
UHD) with soundtracks, max_audio_clips (4) clips of max_audio_seconds, max_images (4) images of max_image_pixels,
within max_media_bytes together; the context is Clef-omni's own 65,536 tokens (the demo's default is half that)."""

from __future__ import annotations

import base64
import io
import wave
from dataclasses import replace
from fractions import Fraction

import numpy as np
import pytest
from clef_bridge.bridge.config.registry import ServerSpec, parse_registry
from clef_bridge.bridge.media.video import MAX_SOURCE_PIXELS

from .fixturegen import FIXTURES, _lock
from .serverkit import RunningServer

pytestmark = pytest.mark.slow

LIMITS = ServerSpec()
WIDTH, HEIGHT = 7680, 4320


def clip(path, seconds: float, fps: int = 2) -> bytes:
    """An H.264 + AAC clip of WIDTH x HEIGHT (a moving square on gradients: small files), made once."""
    import av

    with _lock(path.parent):
        if not path.exists():
            tmp = path.with_suffix(".tmp.mp4")
            with av.open(str(tmp), "w", format="mp4") as out:
                video = out.add_stream("libx264", rate=fps, options={"preset": "ultrafast"})
                video.width, video.height, video.pix_fmt = WIDTH, HEIGHT, "yuv420p"
                sound = out.add_stream("aac", rate=44100)
                sound.layout = "stereo"
                y, x = np.mgrid[0:HEIGHT, 0:WIDTH]
                base = np.stack([x * 255 // WIDTH, y * 255 // HEIGHT, (x + y) * 255 // (WIDTH + HEIGHT)], -1)
                base = base.astype(np.uint8)
                for i in range(int(fps * seconds)):
                    image = base.copy()
                    at = (i * 97) % (WIDTH - 400)
                    image[HEIGHT // 3:HEIGHT // 3 + 400, at:at + 400] = (250, 40, 200)
                    frame = av.VideoFrame.from_ndarray(image, format="rgb24")
                    frame.pts = i
                    out.mux(video.encode(frame))
                out.mux(video.encode(None))
                n = int(44100 * seconds)
                t = np.arange(n) / 44100
                samples = np.stack([0.3 * np.sin(2 * np.pi * 440 * t), 0.3 * np.sin(2 * np.pi * 660 * t)])
                for start in range(0, n, 1024):
                    part = np.ascontiguousarray(samples[:, start:start + 1024].astype(np.float32))
                    frame = av.AudioFrame.from_ndarray(part.reshape(1, -1, order="F"), format="flt", layout="stereo")
                    frame.sample_rate, frame.pts, frame.time_base = 44100, start, Fraction(1, 44100)
                    out.mux(sound.encode(frame))
                out.mux(sound.encode(None))
            tmp.rename(path)
    return path.read_bytes()


def wav(seconds: float, rate: int = 16000) -> bytes:
    out = io.BytesIO()
    with wave.open(out, "wb") as w:
        w.setnchannels(1), w.setsampwidth(2), w.setframerate(rate)
        t = np.arange(int(seconds * rate)) / rate
        w.writeframes((8000 * np.sin(2 * np.pi * 330 * t)).astype("<i2").tobytes())
    return out.getvalue()


def png(side: int, seed: int) -> bytes:
    from PIL import Image

    y, x = np.mgrid[0:side, 0:side]
    image = np.stack([x * 255 // side, y * 255 // side, np.full_like(x, 40 * seed)], -1).astype(np.uint8)
    out = io.BytesIO()
    Image.fromarray(image).save(out, "PNG")
    return out.getvalue()


def url(kind: str, data: bytes) -> str:
    return f"data:{kind};base64," + base64.b64encode(data).decode()


def test_the_most_media_the_limits_allow_is_answered(tmp_path, monkeypatch):
    assert WIDTH * HEIGHT == MAX_SOURCE_PIXELS
    videos, audio, images = LIMITS.videos, LIMITS.audio, LIMITS.images
    movie = clip(FIXTURES / "video" / "max" / "8k_60s.mp4", videos.max_seconds)
    side = int(images.max_pixels ** 0.5)
    media = {"videos": [url("video/mp4", movie)] * videos.max_videos,
             "audio": [url("audio/wav", wav(audio.max_seconds))] * audio.max_clips,
             "images": [url("image/png", png(side, i)) for i in range(images.max_images)]}
    raw = sum(len(base64.b64decode(u.split(",", 1)[1])) for urls in media.values() for u in urls)
    assert raw <= videos.max_media_bytes, raw  # within every limit at once
    assert all(len(u) * 3 // 4 <= audio.max_bytes for u in media["audio"])
    monkeypatch.setenv("CLEF_BRIDGE_CACHE", str(tmp_path / "cache"))
    # the request's time is not what this test is about (about 54 s of the default 60 s request_timeout_s on 2 idle
    # cores, over it on busy ones): every limit but the deadline is the default
    registry = parse_registry({"server": {"request_timeout_s": 600},
                               "models": {"omni": {"builtin": "demo-omni", "n_ctx": 65536, "max_length": 65536}}},
                              tmp_path / "models.toml")
    assert replace(registry.server, request_timeout_s=LIMITS.request_timeout_s) == LIMITS  # the defaults, as documented
    body = {"model": "omni", "state": "A long recording, four photos and four voicemails.", **media,
            "questions": {"urgent": {"type": "noul", "instructions": "Urgent?"}}}
    with RunningServer(registry) as server:
        reply = server.request("POST", "/v1/systemone", body, timeout=600)  # Workers AI's route caps at 13 MiB
    assert reply.status == 200, reply.body[:500]
    result = reply.json()
    assert result["usage"]["input_tokens"] > 30_000 and result["x_timings"]["videos_ms"] > 0
