"""soak: many requests of mixed sizes against a server, watching its memory, file descriptors and tail
latency over time. A command to run and read, not a unit test."""

from __future__ import annotations

import asyncio
import os
import random
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import numpy as np
from clef_bridge.head.errors import Category, ClefError

WORDS = ("invoice refund printer outage password upgrade contract delivery dashboard export account "
         "billing urgent broken slow error please thanks yesterday again customer").split()


def mixed_request(rng: random.Random) -> dict[str, Any]:
    """Distinct bodies of 5 to 80 words and 1 to 6 questions (identical ones would be coalesced)."""
    state = " ".join(rng.choice(WORDS) for _ in range(rng.choice([5, 15, 40, 80])))
    questions: dict[str, Any] = {"urgent": {"type": "noul", "instructions": "Is it urgent?"}}
    for i in range(rng.randint(0, 5)):
        if i % 2:
            questions[f"level{i}"] = {"type": "score", "criteria": ["low", "mid", "high"][: rng.randint(2, 3)]}
        else:
            names = rng.sample(WORDS, rng.randint(2, 8))
            questions[f"pick{i}"] = {"type": "choice", "criteria": {n: None for n in names}}
    return {"model": "jev-latest", "state": f"#{rng.random()} {state}", "questions": questions}


@dataclass
class Sample:
    at: float
    rss_kib: int
    fds: int


@dataclass
class SoakResult:
    requests: int
    errors: int
    seconds: float
    samples: list[Sample] = field(repr=False)
    latencies: list[tuple[float, float]] = field(repr=False)  # (finished at, ms)

    def summary(self, warmup: float) -> dict[str, Any]:
        after = [s for s in self.samples if s.at >= warmup] or self.samples
        first_min = [ms for t, ms in self.latencies if t < 60]
        last_min = [ms for t, ms in self.latencies if t >= self.seconds - 60]
        p99_first = float(np.percentile(first_min, 99)) if first_min else float("nan")
        p99_last = float(np.percentile(last_min, 99)) if last_min else float("nan")
        return {
            "requests": self.requests, "errors": self.errors, "seconds": round(self.seconds, 1),
            "throughput_rps": round(self.requests / self.seconds, 1),
            "rss_kib_after_warmup": after[0].rss_kib, "rss_kib_end": after[-1].rss_kib,
            "rss_growth_pct": round(100 * (after[-1].rss_kib - after[0].rss_kib) / after[0].rss_kib, 2),
            "fds_after_warmup": after[0].fds, "fds_end": after[-1].fds, "fds_max": max(s.fds for s in after),
            "p99_ms_first_minute": round(p99_first, 1), "p99_ms_last_minute": round(p99_last, 1),
            "p99_last_over_first": round(p99_last / p99_first, 3),
        }


def _proc_sample(pid: int, start: float) -> Sample:
    status = Path(f"/proc/{pid}/status").read_text()
    rss = int(next(line.split()[1] for line in status.splitlines() if line.startswith("VmRSS:")))
    return Sample(time.perf_counter() - start, rss, len(os.listdir(f"/proc/{pid}/fd")))


async def _drive(url: str, pid: int, total: int, concurrency: int, seed: int) -> SoakResult:
    rng = random.Random(seed)
    bodies = (mixed_request(rng) for _ in range(total))
    latencies: list[tuple[float, float]] = []
    samples: list[Sample] = []
    errors = 0
    start = time.perf_counter()

    async def client(session: aiohttp.ClientSession) -> None:
        nonlocal errors
        for body in bodies:
            t0 = time.perf_counter()
            try:
                async with session.post(f"{url}/v1/systemone", json=body) as resp:
                    await resp.read()
                    ok = resp.status == 200
            except (aiohttp.ClientError, asyncio.TimeoutError):
                ok = False
            errors += not ok
            now = time.perf_counter()
            latencies.append((now - start, (now - t0) * 1e3))

    async def watch() -> None:
        while True:
            samples.append(_proc_sample(pid, start))
            await asyncio.sleep(2)

    watcher = asyncio.create_task(watch())
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=120)) as session:
        await asyncio.gather(*(client(session) for _ in range(concurrency)))
    watcher.cancel()
    samples.append(_proc_sample(pid, start))
    return SoakResult(total, errors, time.perf_counter() - start, samples, latencies)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_ready(url: str, server: subprocess.Popen, command: list[str], error: type[ClefError]) -> None:
    """Until the started server's /ready answers (5 minutes at most); error when it dies or never does."""
    deadline = time.time() + 300
    while True:
        try:
            with urllib.request.urlopen(f"{url}/ready", timeout=2):
                return
        except OSError:
            if time.time() > deadline or server.poll() is not None:
                raise error("the server did not start", fix=f"run `{' '.join(command[2:])}` to see why") from None
            time.sleep(0.3)


class SoakError(ClefError):
    category = Category.HOST
    error_type = "soak_error"


RSS_GROWTH_MAX_PCT = 5.0  # memory after warm-up may grow this much by the end
P99_DRIFT_MAX = 1.2  # last minute's p99 over the first minute's


@dataclass(frozen=True)
class SoakVerdict:
    summary: dict[str, Any]
    failures: tuple[str, ...]  # one line per threshold that failed, naming it

    @property
    def ok(self) -> bool:
        return not self.failures

    @property
    def verdict(self) -> str:
        return "PASS" if self.ok else "FAIL: " + "; ".join(self.failures)

    def to_dict(self) -> dict[str, Any]:
        return {**self.summary, "thresholds": {"errors": 0, "rss_growth_pct": RSS_GROWTH_MAX_PCT,
                                               "p99_last_over_first": P99_DRIFT_MAX}, "verdict": self.verdict}


def judge(summary: dict[str, Any]) -> SoakVerdict:
    failures = []
    if summary["errors"]:
        failures.append(f"{summary['errors']} of {summary['requests']} requests failed (threshold: 0)")
    if summary["rss_growth_pct"] >= RSS_GROWTH_MAX_PCT:
        failures.append(f"RSS grew {summary['rss_growth_pct']}% after warm-up (threshold: < {RSS_GROWTH_MAX_PCT}%)")
    if not summary["p99_last_over_first"] <= P99_DRIFT_MAX:
        failures.append(f"p99 of the last minute is {summary['p99_last_over_first']}x the first minute's "
                        f"(threshold: <= {P99_DRIFT_MAX}x)")
    return SoakVerdict(summary, tuple(failures))


def run(requests: int, concurrency: int, models: Path | None, warmup: float, seed: int) -> SoakVerdict:
    """Start `clef-bridge serve` (the demo without --models), soak it, stop it, judge it."""
    port = _free_port()
    command = [sys.executable, "-m", "clef_bridge.tools.cli", "serve", "--port", str(port)]
    if models:
        command += ["--models", str(models)]
    server = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    try:
        wait_ready(url, server, command, SoakError)
        result = asyncio.run(_drive(url, server.pid, requests, concurrency, seed))
    finally:
        server.send_signal(signal.SIGTERM)
        server.wait(120)
    return judge(result.summary(warmup))
