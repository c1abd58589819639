"""How fast a newcomer's first `clef-bridge serve` answers: the built-in demos' write time (`make_demo`, what
`serve` runs on first start), then `clef-bridge serve` without a models.toml on a fresh cache, timed from the
process start to /ready, to the first text answer, to the first image answer after it, and to a first `clef-omni`
answer with an image and an audio clip after that. Medians of `runs` fresh starts."""

from __future__ import annotations

import base64
import io
import json
import math
import os
import socket
import statistics
import struct
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
import wave
from dataclasses import dataclass, field
from pathlib import Path

from clef_bridge.bridge.demo.builtins import make_demo

QUESTIONS = {"urgent": {"type": "noul", "instructions": "Is it urgent?"}}


@dataclass(frozen=True)
class DemoStart:
    runs: int
    write_s: float  # make_demo into an empty folder, in this process (median)
    write_mb: float
    steps: dict[str, float]  # step -> median seconds (ready and first text from the process start; media after it)
    statuses: dict[str, list[int]] = field(default_factory=dict)
    load: float = 0.0  # the machine's 1-minute load average at the end


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _post(port: int, path: str, body: dict) -> int:
    req = urllib.request.Request(f"http://127.0.0.1:{port}{path}", data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=300) as reply:
            return reply.status
    except urllib.error.HTTPError as exc:
        return exc.code


def _media() -> tuple[str, str]:
    """A 320x256 PNG and a 1.7 s WAV, base64."""
    from PIL import Image

    png = io.BytesIO()
    Image.radial_gradient("L").convert("RGB").resize((320, 256)).save(png, "PNG")
    wav = io.BytesIO()
    with wave.open(wav, "wb") as w:
        w.setnchannels(1), w.setsampwidth(2), w.setframerate(16000)
        w.writeframes(b"".join(struct.pack("<h", int(8000 * math.sin(i / 16000 * 2 * math.pi * 440)))
                               for i in range(27200)))
    return base64.b64encode(png.getvalue()).decode(), base64.b64encode(wav.getvalue()).decode()


def _serve_once(work: Path) -> tuple[dict[str, float], dict[str, int]]:
    png, wav = _media()
    port = _port()
    env = dict(os.environ, CLEF_BRIDGE_CACHE=str(work / "cache"))
    t0 = time.perf_counter()
    proc = subprocess.Popen([sys.executable, "-m", "clef_bridge.tools.cli", "serve", "--port", str(port)], cwd=work,
                            env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    steps, statuses = {}, {}
    try:
        while True:
            if proc.poll() is not None:
                raise RuntimeError(f"clef-bridge serve exited with {proc.returncode} before it was ready")
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/ready", timeout=2):
                    break
            except OSError:
                time.sleep(0.02)
        steps["ready"] = time.perf_counter() - t0
        statuses["text"] = _post(port, "/v1/systemone", {"model": "jev-latest", "state": "The printer is on fire.",
                                                         "questions": QUESTIONS})
        steps["first text answer"] = time.perf_counter() - t0
        image = {"model": "clef-flash", "state": {"scan": "<r>"}, "questions": QUESTIONS,
                 "assets": {"<r>": {"type": "image", "format": "png", "data_base64": png}}}
        t1 = time.perf_counter()
        statuses["image"] = _post(port, "/v1/systemone", image)
        steps["then first image answer"] = time.perf_counter() - t1
        t1 = time.perf_counter()
        statuses["clef-omni"] = _post(port, "/accounts/local/ai/run/@cf/cloudflare/clef-omni",
                                      {"state": "A voicemail", "questions": QUESTIONS,
                                       "images": [f"data:image/png;base64,{png}"],
                                       "audio": [f"data:audio/wav;base64,{wav}"]})
        steps["then first clef-omni answer (image + audio)"] = time.perf_counter() - t1
        return steps, statuses
    finally:
        proc.terminate()
        proc.wait(60)


def run(runs: int = 3) -> DemoStart:
    with tempfile.TemporaryDirectory(prefix="clef-demo-start-") as tmp:
        folder = Path(tmp)
        writes = []
        for i in range(max(runs, 3)):
            t0 = time.perf_counter()
            make_demo(folder / f"write{i}")
            writes.append(time.perf_counter() - t0)
        size = sum(f.stat().st_size for f in (folder / "write0").rglob("*") if f.is_file())
        served = [_serve_once(Path(tempfile.mkdtemp(dir=folder))) for _ in range(runs)]
    steps = {k: round(statistics.median(s[k] for s, _ in served), 3) for k in served[0][0]}
    statuses = {k: [st[k] for _, st in served] for k in served[0][1]}
    return DemoStart(runs, round(statistics.median(writes), 4), round(size / 1e6, 2), steps, statuses,
                     os.getloadavg()[0])
