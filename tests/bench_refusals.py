"""Memory and time of oversized refusals: does the server give its memory back after big bodies?

    python -m tests.bench_refusals [--requests 2000] [--warmup 200]

Starts `clef-bridge serve` on the tiny test model (n_ctx = max_length = 8192) and sends, on one
keep-alive connection, the 3.8 MB body of issue 18 (255 options of 15 KB) that must be refused with
413 context_length_exceeded. The server's RSS is read from /proc after the warm-up and every 100
requests. The baseline, in the same run, is the same body for a model that does not exist (404: read
and parsed, refused before any model work), so `refusal_over_baseline` is what the context check
adds to receiving and parsing the body. Exits 1 when RSS grows 10% or more after the warm-up, or
when a refusal is not a 413.
"""

from __future__ import annotations

import argparse
import http.client
import json
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from . import fixturegen
from .test_server_adversarial import big_choice

MAX_GROWTH = 0.10


def rss_mib(pid: int) -> float:
    status = Path(f"/proc/{pid}/status").read_text()
    return int(next(line.split()[1] for line in status.splitlines() if line.startswith("VmRSS:"))) / 1024


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _serve(folder: Path, fx: fixturegen.Fixtures, port: int) -> subprocess.Popen:
    toml = folder / "models.toml"
    toml.write_text(f'[models.tiny]\ngguf = "{fx.gguf_f32}"\nhead = "{fx.head}"\nn_ctx = 8192\nmax_length = 8192\n')
    proc = subprocess.Popen([sys.executable, "-m", "clef_bridge.tools.cli", "serve", "--models", str(toml),
                             "--port", str(port)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=1):
                return proc
        except OSError:
            time.sleep(0.2)
    proc.kill()
    raise SystemExit("the server did not start within 120 s")


def _send(conn: http.client.HTTPConnection, data: bytes) -> tuple[int, float]:
    t0 = time.perf_counter()
    conn.request("POST", "/v1/systemone", body=data, headers={"Content-Type": "application/json"})
    resp = conn.getresponse()
    resp.read()
    return resp.status, (time.perf_counter() - t0) * 1e3


def run(requests: int, warmup: int) -> dict:
    fx = fixturegen.build()
    refusal = json.dumps(big_choice()).encode()
    baseline = json.dumps({**big_choice(), "model": "no-such-model"}).encode()
    with tempfile.TemporaryDirectory() as tmp:
        port = _port()
        proc = _serve(Path(tmp), fx, port)
        try:
            conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
            rss_start = rss_mib(proc.pid)
            statuses = [_send(conn, refusal)[0] for _ in range(warmup)]
            rss_warm = rss_mib(proc.pid)
            started = time.perf_counter()
            samples, refusal_ms, baseline_ms = [], [], []
            for i in range(requests):
                status, ms = _send(conn, refusal)
                statuses.append(status)
                refusal_ms.append(ms)
                if i % 10 == 0:  # the baseline, interleaved so that drift hits both
                    baseline_ms.append(_send(conn, baseline)[1])
                if (i + 1) % 100 == 0:
                    samples.append(round(rss_mib(proc.pid), 1))
            seconds = time.perf_counter() - started
        finally:
            proc.terminate()
            proc.wait(60)
    growth = (samples[-1] - rss_warm) / rss_warm
    return {
        "requests": requests, "warmup": warmup, "body_bytes": len(refusal), "seconds": round(seconds, 1),
        "statuses": sorted(set(statuses)), "rss_mib_at_start": round(rss_start, 1),
        "rss_mib_after_warmup": round(rss_warm, 1), "rss_mib_end": samples[-1], "rss_mib_max": max(samples),
        "rss_growth_after_warmup": round(growth, 4), "rss_mib_every_100": samples,
        "refusal_p50_ms": round(float(np.median(refusal_ms)), 2),
        "baseline_404_p50_ms": round(float(np.median(baseline_ms)), 2),
        "refusal_over_baseline": round(float(np.median(refusal_ms) / np.median(baseline_ms)), 3),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=2000, help="oversized refusals after the warm-up")
    parser.add_argument("--warmup", type=int, default=200, help="refusals before the RSS baseline is read")
    args = parser.parse_args()
    result = run(args.requests, args.warmup)
    print(json.dumps(result, indent=1))
    ok = result["statuses"] == [413] and result["rss_growth_after_warmup"] < MAX_GROWTH
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
