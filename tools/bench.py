"""bench: latency and throughput of a running server, with optional baselines measured in the same run.

- `--gguf`: the bare llama.cpp prefill of the same token ids, in this process (the floor), alternated
  with single HTTP requests;
- `--reference HF_DIR --head HEAD`: Cloudflare's reference code in this process on the same weights
  (needs the test extra).
"""

from __future__ import annotations

import asyncio
import json
import os
import statistics
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import aiohttp
import numpy as np

from ..head.errors import Category, ClefError

ROUTER_QUESTIONS = {
    "needs_tools": {"type": "noul", "instructions": "Does answering need tools or live data?"},
    "model": {"type": "choice", "instructions": "Which model should answer?",
              "criteria": {"small": "fast and cheap, short factual answers", "medium": "balanced everyday model",
                           "large": "strongest reasoning, expensive", "code": "programming specialist",
                           "vision": "reads images", "long": "long documents", "math": "math and proofs"}},
    "difficulty": {"type": "score", "instructions": "How hard is the task?",
                   "criteria": ["trivial", "easy", "medium", "hard", "expert"]},
    "domain": {"type": "choice", "instructions": "Which domain?",
               "criteria": {"creative": "writing and style", "tech": "technical work", "chat": "small talk",
                            "biz": "business", "sci": "science"}},
}
TIMEOUT_S = 600  # per request
SENTENCE = ("The customer writes that the nightly export job has failed three times this week, that the "
            "dashboard shows stale numbers, and that the finance team needs the report before Friday. ")


def router_request(model: str = "jev-latest", sentences: int = 6, ticket: int = 4471) -> dict[str, Any]:
    """A router request of about 750 tokens with the Qwen3.5 vocabulary (4 questions, 19 options)."""
    return {"model": model, "state": {"ticket": ticket, "channel": "email", "message": SENTENCE * sentences},
            "questions": ROUTER_QUESTIONS}


class ServerUnreachable(ClefError):
    """No server answers at the URL (connection refused, unknown host): there is nothing to measure."""

    category = Category.UNAVAILABLE
    error_type = "server_unreachable"


def _connect_failure(url: str, exc: aiohttp.ClientConnectorError) -> str:
    err = exc.os_error
    reason = os.strerror(err.errno).lower() if isinstance(err.errno, int) and err.errno > 0 else str(err)
    return f"cannot connect to {url}: {reason}"


def _http_failure(status: int, payload: Any) -> str:
    """'HTTP 404: <the server's message>' from a Jev error body, else the status alone."""
    detail = payload.get("detail") if isinstance(payload, dict) else None
    message = detail.get("message") if isinstance(detail, dict) else None
    return f"HTTP {status}: {message}" if isinstance(message, str) else f"HTTP {status}"


@dataclass
class RunStats:
    concurrency: int
    requests: int
    errors: int
    seconds: float
    latencies_ms: list[float] = field(repr=False)
    split_ms: dict[str, float]  # server-side medians from x_timings
    input_tokens: int
    causes: dict[str, int] = field(default_factory=dict)  # why requests failed, with how many each
    unreachable: int = 0  # requests that found no server (their causes say why)

    @property
    def throughput(self) -> float:
        return (self.requests - self.errors) / self.seconds

    def percentile(self, q: float) -> float:
        return float(np.percentile(self.latencies_ms, q)) if self.latencies_ms else float("nan")

    def summary(self) -> dict[str, Any]:
        return {"concurrency": self.concurrency, "requests": self.requests, "errors": self.errors,
                "p50_ms": round(self.percentile(50), 2), "p95_ms": round(self.percentile(95), 2),
                "p99_ms": round(self.percentile(99), 2), "throughput_rps": round(self.throughput, 3),
                "input_tokens": self.input_tokens, "server_split_ms": self.split_ms, "error_causes": self.causes}


async def _run(url: str, body: dict, concurrency: int, requests: int, headers: dict[str, str]) -> RunStats:
    latencies: list[float] = []
    timings: list[dict[str, float]] = []
    causes: Counter[str] = Counter()
    unreachable = tokens = 0
    counter = iter(range(requests))

    async def client(session: aiohttp.ClientSession) -> None:
        nonlocal tokens, unreachable
        for i in counter:
            t0 = time.perf_counter()
            unique = with_ticket(body, 1000 + i)
            try:
                async with session.post(f"{url}/v1/systemone", json=unique, headers=headers) as resp:
                    payload = await resp.json(content_type=None)
                    cause = None if resp.status == 200 else _http_failure(resp.status, payload)
            except aiohttp.ClientConnectorError as exc:
                cause = _connect_failure(url, exc)
                unreachable += 1
            except (aiohttp.ClientError, json.JSONDecodeError) as exc:
                cause = f"{type(exc).__name__}: {exc}"
            except asyncio.TimeoutError:
                cause = f"no answer within {TIMEOUT_S} s"
            if cause is not None:
                causes[cause] += 1
                continue
            latencies.append((time.perf_counter() - t0) * 1e3)
            timings.append(payload.get("x_timings", {}))
            tokens = payload["usage"]["input_tokens"]

    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=TIMEOUT_S)) as session:
        t0 = time.perf_counter()
        await asyncio.gather(*(client(session) for _ in range(concurrency)))
        seconds = time.perf_counter() - t0
    split = {k: round(statistics.median(t[k] for t in timings if k in t), 2)
             for k in ("queue_ms", "tokenize_ms", "backbone_ms", "head_ms", "total_ms") if timings}
    return RunStats(concurrency, requests, sum(causes.values()), seconds, latencies, split, tokens, dict(causes),
                    unreachable)


def with_ticket(body: dict, ticket: int) -> dict:
    """The body with another ticket number: a distinct request of the same token count (the server
    would answer identical bodies in flight with one computation)."""
    return {**body, "state": {**body["state"], "ticket": ticket}}


def timed_ms(fn, repeats: int) -> list[float]:
    """Wall times of `repeats` calls of fn in milliseconds, after one warm-up call."""
    fn()
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append((time.perf_counter() - t0) * 1e3)
    return times


def median_ms(fn, repeats: int) -> float:
    """Median wall time of fn in milliseconds, after one warm-up call."""
    return statistics.median(timed_ms(fn, repeats))


async def _alternate(url: str, body: dict, headers: dict[str, str], prefill, repeats: int) -> tuple[list, list]:
    http: list[float] = []
    bare: list[float] = []
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=TIMEOUT_S)) as session:
        for i in range(repeats + 1):  # the first pair warms both up
            t0 = time.perf_counter()
            async with session.post(f"{url}/v1/systemone", json=with_ticket(body, 5000 + i), headers=headers) as resp:
                await resp.read()
                ok = resp.status == 200
            t1 = time.perf_counter()
            prefill()
            t2 = time.perf_counter()
            if i and ok:
                http.append((t1 - t0) * 1e3)
                bare.append((t2 - t1) * 1e3)
    return http, bare


def bare_prefill_floor(url: str, body: dict, headers: dict[str, str], gguf: Path, repeats: int) -> dict[str, float]:
    """Single-client HTTP latency and llama.cpp alone on exactly the token ids the server encodes.

    The two alternate, one request then one bare prefill, so the machine's drift (these CPUs are
    shared and noisy) lands on both sides of the ratio.
    """
    from ..bridge.llama.backbone import Backbone, BackboneOptions
    from ..bridge.model.loading import backbone_file
    from ..head.encoder import encode
    from ..head.schema import parse_request

    backbone = Backbone(backbone_file(gguf), BackboneOptions(n_ctx=4096))  # a clef GGUF's backbone, converted once
    try:
        ids = encode(parse_request(body), backbone.tokenize).input_ids
        http, bare = asyncio.run(_alternate(url, body, headers, lambda: backbone.prefill(ids), repeats))
    finally:
        backbone.close()
    if not http:
        return {}
    p50, floor = statistics.median(http), statistics.median(bare)
    return {"alternated_http_p50_ms": round(p50, 2), "bare_prefill_ms": round(floor, 2),
            "http_over_bare_prefill": round(p50 / floor, 3)}


@dataclass(frozen=True)
class BenchResult:
    result: dict[str, Any]  # url, runs (per concurrency), and the baselines asked for
    notes: tuple[str, ...] = ()  # files written

    @property
    def ok(self) -> bool:
        return all(r["errors"] == 0 for r in self.result["runs"])

    def to_dict(self) -> dict[str, Any]:
        return self.result


def run(url: str, concurrency: list[int], requests: int, api_key: str | None, gguf: Path | None, model: str,
        out: Path | None = None, body: dict[str, Any] | None = None,
        reference: Callable[[dict, int, str], float] | None = None) -> BenchResult:
    """body: the request to time (default: the ~750-token router request in the Qwen3.5 vocabulary);
    reference(body, repeats, dtype): milliseconds of Cloudflare's reference code on the same request
    (benchmarks/__main__.py passes it; it needs torch)."""
    body = body or router_request(model)
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    warm = asyncio.run(_run(url, body, 1, 3, headers))
    if warm.unreachable == warm.requests:
        raise ServerUnreachable(next(iter(warm.causes)),
                                fix="start the server (clef-bridge serve), or pass --url of a running one")
    runs = [asyncio.run(_run(url, body, c, requests, headers)) for c in concurrency]
    single = next((r for r in runs if r.concurrency == 1), runs[0])
    result: dict[str, Any] = {"url": url, "runs": [r.summary() for r in runs]}
    repeats = max(5, min(requests, 15))
    if gguf:
        result.update(bare_prefill_floor(url, body, headers, gguf, repeats))
    if reference is not None:
        for dtype in ("float32", "bfloat16"):  # load_release_model's default is bfloat16
            ref_ms = reference(body, repeats, dtype)
            result[f"reference_{dtype}_ms"] = round(ref_ms, 2)
            result[f"http_over_reference_{dtype}"] = round(single.percentile(50) / ref_ms, 3)
    notes: list[str] = []
    if out is not None:
        from .plots import latency_charts

        out.mkdir(parents=True, exist_ok=True)
        (out / "bench.json").write_text(json.dumps(result, indent=2) + "\n")
        notes.append(f"wrote {out / 'bench.json'}")
        notes.append(latency_charts({r.concurrency: r.latencies_ms for r in runs},
                                    {r.concurrency: r.throughput for r in runs}, out / "bench.png"))
    return BenchResult(result, tuple(notes))
