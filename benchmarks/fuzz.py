"""fuzz: hostile input against a live `clef-bridge serve` under a memory cap, for a while, and what it did.

Two phases share the time: schemathesis over /openapi.json (every door, its schema-shaped and malformed bodies;
its HAR report gives each request's status and time), then byte-mutated real media (every container and codec the
project decodes: PNG, JPEG, WebP; WAV, MP3; MP4/H.264 + AAC, WebM/VP9 + Opus, Matroska/MPEG-4 + MP3 and FFV1 +
PCM) sent as a request's images, audio or videos. Meanwhile /health is asked every 0.2 s. It prints requests sent,
statuses, 5xx (the run fails on any), the slowest refusal, /health's worst latency and the server's RSS before and
after. A command to run and read, not a unit test: docs/security.md holds its figures."""

from __future__ import annotations

import base64
import io
import json
import random
import resource
import signal
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from clef_bridge.head.errors import Category, ClefError

from .soak import _free_port, wait_ready

QUESTIONS = {"urgent": {"type": "noul", "instructions": "Is it urgent?"}}
FIELD = {"image": "images", "audio": "audio", "video": "videos"}
MIME = {"png": "image/png", "jpeg": "image/jpeg", "webp": "image/webp", "wav": "audio/wav", "mp3": "audio/mpeg",
        "mp4": "video/mp4", "webm": "video/webm", "mkv": "video/x-matroska"}


class FuzzError(ClefError):
    category = Category.HOST
    error_type = "fuzz_error"


@dataclass
class Tally:
    """What the server answered: statuses, the slowest refusal, the 5xx (route and what was sent)."""

    statuses: Counter = field(default_factory=Counter)
    slowest_refusal: tuple[float, str] = (0.0, "")
    server_errors: list[str] = field(default_factory=list)

    def add(self, status: int, ms: float, what: str) -> None:
        self.statuses[status] += 1
        if 400 <= status < 500 and ms > self.slowest_refusal[0]:
            self.slowest_refusal = (ms, what)
        if status >= 500:
            self.server_errors.append(f"{status} {what}")


def samples(folder: Path) -> dict[str, tuple[str, bytes]]:
    """A real file of every format the server decodes: name -> (kind, bytes)."""
    import numpy as np
    from PIL import Image

    from tests.fixturegen_video import Clip, write_clip

    out: dict[str, tuple[str, bytes]] = {}
    picture = Image.fromarray((np.indices((96, 128)).sum(0) % 256).astype(np.uint8)).convert("RGB")
    for fmt, name in (("PNG", "png"), ("JPEG", "jpeg"), ("WEBP", "webp")):
        buf = io.BytesIO()
        picture.save(buf, fmt)
        out[name] = ("image", buf.getvalue())
    clips = {"mp4": Clip("mp4", ".mp4", "libx264", "aac", 160, 120, 4, 1.0),
             "webm": Clip("webm", ".webm", "libvpx-vp9", "libopus", 160, 120, 4, 1.0, audio_rate=48000),
             "mkv": Clip("matroska", ".mkv", "mpeg4", "libmp3lame", 160, 120, 4, 1.0),
             "mkv_ffv1": Clip("matroska", ".mkv", "ffv1", "pcm_s16le", 160, 120, 4, 1.0, audio_rate=16000,
                              layout="mono")}
    for name, clip in clips.items():
        path = folder / f"{name}{clip.suffix}"
        write_clip(clip, path)
        out[name] = ("video", path.read_bytes())
    out["wav"] = ("audio", _audio("wav", "pcm_s16le"))
    out["mp3"] = ("audio", _audio("mp3", "libmp3lame"))
    return out


def _audio(container: str, codec: str, seconds: float = 1.0, rate: int = 16000) -> bytes:
    import av
    import numpy as np

    buf = io.BytesIO()
    with av.open(buf, "w", format=container) as out:
        stream = out.add_stream(codec, rate=rate)
        stream.layout = "mono"
        t = np.arange(int(seconds * rate)) / rate
        samples = (0.3 * np.sin(2 * np.pi * 440 * t)).astype(np.float32)
        step = 1152 if codec == "libmp3lame" else 1024
        for at in range(0, len(samples), step):
            frame = av.AudioFrame.from_ndarray(samples[None, at:at + step], format="flt", layout="mono")
            frame.sample_rate, frame.pts = rate, at
            for packet in stream.encode(frame):
                out.mux(packet)
        for packet in stream.encode(None):
            out.mux(packet)
    return buf.getvalue()


def mutate(data: bytes, rng: random.Random) -> bytes:
    """A few random edits: bytes set, runs inserted or cut, an integer field grown, a tail lost, halves swapped."""
    out = bytearray(data)
    for _ in range(rng.randint(1, 6)):
        op = rng.choice(["set", "set", "insert", "cut", "grow", "truncate", "splice"])
        at = rng.randrange(len(out) + 1) if out else 0
        if op == "set" and out:
            out[min(at, len(out) - 1)] = rng.randrange(256)
        elif op == "insert":
            out[at:at] = bytes(rng.randrange(256) for _ in range(rng.randint(1, 32)))
        elif op == "cut":
            del out[at:at + rng.randint(1, 256)]
        elif op == "grow":
            out[at:at] = bytes([rng.choice([0x00, 0x01, 0x7F, 0xFF])]) * rng.randint(4, 4096)
        elif op == "truncate":
            del out[at:]
        elif op == "splice" and len(out) > 2:
            half = len(out) // 2
            out = out[half:] + out[:half]
    return bytes(out)


def _post(url: str, body: dict[str, Any], timeout: float = 120) -> tuple[int, float]:
    data = json.dumps(body).encode()
    request = urllib.request.Request(url, data=data, headers={"Content-Type": "application/json"})
    t0 = time.perf_counter()
    try:
        with urllib.request.urlopen(request, timeout=timeout) as reply:
            reply.read()
            status = reply.status
    except urllib.error.HTTPError as error:
        error.read()
        status = error.code
    return status, (time.perf_counter() - t0) * 1e3


def media_phase(url: str, seconds: float, seed: int, tally: Tally, folder: Path) -> int:
    """Byte-mutated real media as requests, until the time is up: how many were sent."""
    rng = random.Random(seed)
    files = samples(folder)
    names = sorted(files)
    end, sent = time.monotonic() + seconds, 0
    while time.monotonic() < end:
        name = names[sent % len(names)]
        kind, data = files[name]
        bad = mutate(data, rng)
        mime = MIME[name.split("_")[0]]
        body = {"model": "clef-omni", "state": "a fuzzed attachment", "questions": QUESTIONS,
                FIELD[kind]: [f"data:{mime};base64," + base64.b64encode(bad).decode()]}
        status, ms = _post(url + "/v1/systemone", body)
        tally.add(status, ms, f"{kind} {name}, {len(bad)} bytes (seed {seed}, case {sent})")
        sent += 1
    return sent


def schema_phase(url: str, seconds: float, seed: int, tally: Tally, folder: Path) -> int:
    """schemathesis over /openapi.json within the time; its HAR report's requests, tallied."""
    har = folder / "schemathesis.har"
    subprocess.run(["schemathesis", "run", f"{url}/openapi.json", "--max-time", str(int(max(5, seconds))),
                    "--seed", str(seed), "--checks", "not_a_server_error", "--report", "har",
                    "--report-har-path", str(har), "--request-timeout", "120"],
                   capture_output=True, text=True, cwd=folder, timeout=seconds + 300)
    if not har.exists():
        raise FuzzError("schemathesis wrote no report", fix="run `schemathesis run URL/openapi.json` to see why")
    entries = json.loads(har.read_text())["log"]["entries"]
    for entry in entries:
        req = entry["request"]
        tally.add(entry["response"]["status"], float(entry.get("time", 0.0)),
                  f"{req['method']} {req['url'].removeprefix(url)} (schemathesis)")
    return len(entries)


class HealthWatch(threading.Thread):
    """GET /health every 0.2 s: the worst latency seen (a stalled event loop shows here first)."""

    def __init__(self, url: str):
        super().__init__(daemon=True)
        self.url, self.worst_ms, self.failed = url, 0.0, 0
        self.stop = threading.Event()

    def run(self) -> None:
        while not self.stop.is_set():
            t0 = time.perf_counter()
            try:
                with urllib.request.urlopen(self.url + "/health", timeout=30) as reply:
                    reply.read()
            except OSError:
                self.failed += 1
            self.worst_ms = max(self.worst_ms, (time.perf_counter() - t0) * 1e3)
            self.stop.wait(0.2)


def rss_mib(pid: int) -> float:
    status = Path(f"/proc/{pid}/status").read_text()
    return int(next(line.split()[1] for line in status.splitlines() if line.startswith("VmRSS:"))) / 1024


@dataclass(frozen=True)
class FuzzReport:
    """One fuzz run: what was sent, what came back, and how the server held."""

    figures: dict[str, Any]

    @property
    def ok(self) -> bool:
        return self.figures["verdict"] == "PASS"

    def to_dict(self) -> dict[str, Any]:
        return self.figures


def run(seconds: float, memory_gib: float, models: Path | None, seed: int) -> FuzzReport:
    """Start the server (the built-in demos without --models) under RLIMIT_AS = memory_gib, fuzz it, stop it."""
    port = _free_port()
    command = [sys.executable, "-m", "clef_bridge.tools.cli", "serve", "--port", str(port)]
    if models:
        command += ["--models", str(models)]
    cap = int(memory_gib * 2**30)
    server = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                              preexec_fn=lambda: resource.setrlimit(resource.RLIMIT_AS, (cap, cap)))
    url = f"http://127.0.0.1:{port}"
    tally = Tally()
    try:
        wait_ready(url, server, command, FuzzError)
        before = rss_mib(server.pid)
        watch = HealthWatch(url)
        watch.start()
        with tempfile.TemporaryDirectory() as folder:
            schema = schema_phase(url, seconds / 2, seed, tally, Path(folder))
            media = media_phase(url, seconds / 2, seed, tally, Path(folder))
        watch.stop.set()
        watch.join()
        after = rss_mib(server.pid)
        alive = server.poll() is None
    finally:
        server.send_signal(signal.SIGTERM)
        server.wait(120)
    return FuzzReport({"seconds": seconds, "memory_cap_gib": memory_gib, "requests": schema + media,
            "schemathesis_requests": schema, "media_requests": media,
            "statuses": dict(sorted(tally.statuses.items())), "server_errors": len(tally.server_errors),
            "server_error_cases": tally.server_errors[:20],
            "slowest_refusal_ms": round(tally.slowest_refusal[0], 1), "slowest_refusal": tally.slowest_refusal[1],
            "health_worst_ms": round(watch.worst_ms, 1), "health_failures": watch.failed,
            "rss_mib_before": round(before, 1), "rss_mib_after": round(after, 1), "server_alive": alive,
            "verdict": "PASS" if not tally.server_errors and alive and not watch.failed else "FAIL"})
