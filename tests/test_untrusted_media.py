"""Issue 32's repros against `clef-bridge serve` on the built-in demos, over a socket, under a memory cap: every
decoder bomb, lying header and oversized input is refused with a 4xx (never a 5xx) within 3 s, /health answers
within 1 s all the while, the server's RSS ends within 200 MB of its baseline, and a valid clip answers as
before.

The server runs in a process of its own with RLIMIT_AS at SERVER_CAP (its llama.cpp mappings peak at 2.3 GB of
address space on the demos), so a regression that inflates it fails here instead of swapping; its decoder
processes cap themselves lower (decode_memory_mb)."""

from __future__ import annotations

import base64
import http.client
import io
import json
import math
import os
import resource
import socket
import struct
import subprocess
import sys
import threading
import time
import wave
from dataclasses import dataclass

import pytest

from .test_server_images import multipart

pytestmark = pytest.mark.slow

SERVER_CAP = 4 * 2**30  # the server's address space: its 2.3 GB peak on the demos, and room for requests
OMNI = "/accounts/x/ai/run/@cf/cloudflare/clef-omni"
QUESTIONS = {"urgent": {"type": "noul", "instructions": "Does the caller need help today?"}}
REFUSE_S, HEALTH_S, RSS_MB = 3.0, 1.0, 200


# --- the inputs ---------------------------------------------------------------------------------

def wav(rate: int, byte_rate: int, block_align: int, n_bytes: int, channels: int = 1, bits: int = 8,
        fmt_size: int = 16, data_size: int | None = None, chunks: bytes = b"") -> bytes:
    """A PCM WAV built by hand, its header saying whatever it is told to."""
    fmt = struct.pack("<HHIIHH", 1, channels, rate, byte_rate, block_align, bits)  # fmt_size may lie about it
    size = n_bytes if data_size is None else data_size
    body = b"WAVE" + b"fmt " + struct.pack("<I", fmt_size) + fmt + chunks + b"data" + struct.pack("<I", size)
    return b"RIFF" + struct.pack("<I", (len(body) + n_bytes) & 0xFFFFFFFF) + body + bytes(n_bytes)


def tone(seconds: float = 3.0, rate: int = 16000) -> bytes:
    out = io.BytesIO()
    with wave.open(out, "wb") as w:
        w.setnchannels(1), w.setsampwidth(2), w.setframerate(rate)
        w.writeframes(b"".join(struct.pack("<h", int(8000 * math.sin(i / rate * 2 * math.pi * 440)))
                               for i in range(int(seconds * rate))))
    return out.getvalue()


def id3_chain(n_bytes: int) -> bytes:
    """Empty ID3v2 tags back to back, then one MP3 frame header."""
    return b"ID3\x04\x00\x00\x00\x00\x00\x00" * (n_bytes // 10) + b"\xff\xf3\x14\xc4" + bytes(20)


def tiny_chunks(n: int) -> bytes:
    """A WAV of n empty chunks between its fmt and data chunks."""
    return wav(16000, 16000, 1, 4096, chunks=b"junk\x00\x00\x00\x00" * n)


ISSUE = {  # the issue's repros, each a few KB unless it says otherwise
    "rate 1, block align 1024": wav(1, 10**9, 1024, 4096),
    "rate 1, block align 8192": wav(1, 10**9, 8192, 32768),
    "rate 99,999,999": wav(99_999_999, 99_999_999, 1, 4096),
    "rate 2^31-1": wav(2**31 - 1, 2**31 - 1, 1, 4096),
    "8 MB ID3 chain": id3_chain(8_000_000),
    "a million tiny chunks": tiny_chunks(1_000_000),
}


def header_lies() -> dict[str, bytes]:
    """The family generated from the repros: rates, byte rates, block aligns, channels, bits, chunk sizes, cuts."""
    lies = {}
    for rate in (1, 100, 7_999, 384_001, 1_000_000, 99_999_999, 2**31 - 1, 2**32 - 1):
        lies[f"rate {rate}"] = wav(rate, rate, 1, 4096)
    for block_align in (0, 3, 1024, 8192, 65535):
        lies[f"block align {block_align}"] = wav(16000, 10**9, block_align, 32768)
    for channels in (0, 64, 255, 65535):
        lies[f"channels {channels}"] = wav(16000, 16000 * max(channels, 1), max(channels, 1), 4096, channels=channels)
    for bits in (0, 64, 65535):
        lies[f"bits {bits}"] = wav(16000, 16000, 1, 4096, bits=bits)
    for byte_rate in (1, 2**32 - 1):
        lies[f"byte rate {byte_rate}"] = wav(8000, byte_rate, 1, 4096)
    lies["fmt chunk of 4 GB"] = wav(16000, 16000, 1, 4096, fmt_size=2**32 - 2)
    lies["data chunk longer than the file"] = wav(1, 1, 1, 4096, data_size=2**32 - 2)
    lies["data chunk of 0xFFFFFFFF"] = wav(1, 10**9, 8192, 32768, data_size=2**32 - 1)
    for cut in (12, 20, 36, 44, 45):
        lies[f"rate 1 cut at {cut}"] = wav(1, 10**9, 1024, 4096)[:cut]
    return lies


def audio_body(data: bytes) -> dict:
    return {"state": "A voicemail", "questions": QUESTIONS,
            "audio": [f"data:audio/wav;base64,{base64.b64encode(data).decode()}"]}


# --- the server ---------------------------------------------------------------------------------

@dataclass
class Reply:
    status: int
    body: bytes
    seconds: float


class Server:
    """`clef-bridge serve` (no models.toml: the demos) in a process capped at SERVER_CAP, and /health polled
    beside every request."""

    def __init__(self, folder):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            self.port = s.getsockname()[1]
        env = dict(os.environ, CLEF_BRIDGE_CACHE=str(folder / "cache"))
        self.log = open(folder / "serve.log", "wb")
        self.proc = subprocess.Popen([sys.executable, "-m", "clef_bridge.tools.cli", "serve", "--port",
                                      str(self.port)], cwd=folder, env=env, stdout=self.log, stderr=subprocess.STDOUT,
                                     preexec_fn=lambda: resource.setrlimit(resource.RLIMIT_AS,
                                                                           (SERVER_CAP, SERVER_CAP)))
        deadline = time.monotonic() + 120
        while self.request("GET", "/ready", timeout=2).status != 200:
            assert self.proc.poll() is None and time.monotonic() < deadline, (folder / "serve.log").read_text()
            time.sleep(0.1)
        self.health: list[tuple[float, float]] = []  # (sent at, seconds to answer)
        self._stop = threading.Event()
        self._poller = threading.Thread(target=self._poll, daemon=True)
        self._poller.start()

    def request(self, method: str, path: str, body: bytes | None = None, headers: dict | None = None,
                timeout: float = 60) -> Reply:
        t0 = time.monotonic()
        try:
            conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=timeout)
            conn.request(method, path, body=body, headers=headers or {})
            resp = conn.getresponse()
            reply = Reply(resp.status, resp.read(), 0.0)
            conn.close()
        except OSError:
            reply = Reply(0, b"", 0.0)
        reply.seconds = time.monotonic() - t0
        return reply

    def post(self, path: str, body: dict) -> Reply:
        return self.request("POST", path, json.dumps(body).encode(), {"Content-Type": "application/json"})

    def _poll(self) -> None:
        while not self._stop.is_set():
            sent = time.monotonic()
            reply = self.request("GET", "/health", timeout=30)
            self.health.append((sent, reply.seconds if reply.status == 200 else math.inf))
            time.sleep(0.05)

    def slowest_health(self, since: float) -> float:
        """The slowest /health answer sent since then (the one in flight counted as late as it already is)."""
        answered = [s for sent, s in list(self.health) if sent >= since]
        return max(answered + [time.monotonic() - (self.health[-1][0] if self.health else since) - 0.05])

    def rss_mb(self) -> float:
        with open(f"/proc/{self.proc.pid}/status") as status:
            return next(int(line.split()[1]) for line in status if line.startswith("VmRSS:")) / 1024

    def close(self) -> None:
        self._stop.set()
        self._poller.join(35)
        self.proc.terminate()
        self.proc.wait(60)
        self.log.close()


def answer(reply: Reply) -> dict:
    assert reply.status == 200, reply.body[:500]
    result = json.loads(reply.body)["result"]
    return {k: v for k, v in result.items() if not k.startswith("x_")}


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    srv = Server(tmp_path_factory.mktemp("untrusted"))
    try:
        srv.valid = answer(srv.post(OMNI, audio_body(tone())))  # the decoders warm, the answer to compare with
        srv.post(OMNI, audio_body(wav(1, 10**9, 8192, 32768)))  # one refusal before the baseline: its code paths
        time.sleep(1.0)
        srv.baseline_mb = srv.rss_mb()
        yield srv
    finally:
        srv.close()


def refused_quickly(server: Server, send) -> Reply:
    since = time.monotonic()
    reply = send()
    health = server.slowest_health(since)
    assert 400 <= reply.status < 500, (reply.status, reply.body[:300])
    assert reply.seconds < REFUSE_S, f"refused after {reply.seconds:.1f} s"
    assert health < HEALTH_S, f"/health took {health:.2f} s meanwhile"
    return reply


# --- the repros ---------------------------------------------------------------------------------

@pytest.mark.parametrize("name", list(ISSUE))
def test_the_issues_clips_are_refused_quickly(server, name):
    refused_quickly(server, lambda: server.post(OMNI, audio_body(ISSUE[name])))


LIES = header_lies()


@pytest.mark.parametrize("name", list(LIES))
def test_lying_headers_are_refused_quickly(server, name):
    refused_quickly(server, lambda: server.post(OMNI, audio_body(LIES[name])))


def test_a_55_mb_multipart_part_is_refused_quickly(server):
    part = b"\xff\xf3\x14\xc4" + bytes(20)
    request = {"model": "clef-omni", "state": {"vm": "<vm>"}, "questions": QUESTIONS,
               "assets": {"<vm>": {"type": "audio", "part": "asset-0"}}}
    body, headers = multipart([("request", "application/json", json.dumps(request).encode()),
                               ("asset-0", "application/octet-stream", part * (55_000_000 // len(part)))])
    refused_quickly(server, lambda: server.request("POST", "/v1/systemone", body, headers))


def test_a_4_mb_model_name_is_refused_quickly_without_echoing_it(server):
    reply = refused_quickly(server, lambda: server.post("/v1/systemone", {"model": "m" * 4_000_000, "state": "s",
                                                                          "questions": QUESTIONS}))
    assert len(reply.body) < 10_000


def test_afterwards_the_server_is_within_its_baseline_and_answers_as_before(server):
    """Last in the file (pytest keeps the order): after every refusal above."""
    time.sleep(1.0)
    assert server.rss_mb() < server.baseline_mb + RSS_MB, (server.baseline_mb, server.rss_mb())
    assert answer(server.post(OMNI, audio_body(tone()))) == server.valid
