"""gpu-check's serving step: a random model served in this process over a real socket, timed from a
client (tools/bench.py) at concurrency 1, 4 and 16, with the GPU's peak memory against fit's plan."""

from __future__ import annotations

import asyncio
import threading
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterator

from aiohttp import web
from clef_bridge.bridge.config.memory_plan import head_gpu_bytes, serving_plan
from clef_bridge.bridge.config.registry import ModelSpec, Registry, ServerSpec, model_spec
from clef_bridge.bridge.host.gpu import nvml_handle, read_gpu, visible_device
from clef_bridge.bridge.model.loading import backbone_file
from clef_bridge.bridge.server.app import RUNNER_OPTIONS, create_app
from clef_bridge.head.config import config_path_for, load_config
from clef_bridge.head.encoder import encode
from clef_bridge.head.schema import parse_request
from clef_bridge.tools.bench import router_request
from clef_bridge.tools.bench import run as bench_run

LEVELS = (1, 4, 16)
NAME = "gpu-check"


@contextmanager
def served(registry: Registry) -> Iterator[str]:
    """The real app on 127.0.0.1 (an event loop in a thread); its URL until the block ends."""
    loop = asyncio.new_event_loop()
    runner = web.AppRunner(create_app(registry), **RUNNER_OPTIONS)  # the app holds its connection options
    started: dict[str, Any] = {}
    ready = threading.Event()

    async def start() -> None:
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        started["port"] = site._server.sockets[0].getsockname()[1]

    def main() -> None:
        asyncio.set_event_loop(loop)
        try:
            loop.run_until_complete(start())
        except BaseException as exc:  # noqa: BLE001 - raised again in the caller's thread
            started["error"] = exc
            ready.set()
            return
        ready.set()
        loop.run_forever()

    thread = threading.Thread(target=main, name="gpu-check-server", daemon=True)
    thread.start()
    ready.wait()
    if "error" in started:
        raise started["error"]
    try:
        yield f"http://127.0.0.1:{started['port']}"
    finally:
        asyncio.run_coroutine_threadsafe(runner.cleanup(), loop).result()
        loop.call_soon_threadsafe(loop.stop)
        thread.join()


class PeakMemory:
    """The GPU's used memory sampled every 10 ms through NVML, in a thread; nothing without NVML."""

    def __init__(self):
        self.baseline = self.peak = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample, name="gpu-check-nvml", daemon=True)

    def _sample(self) -> None:
        import pynvml as nvml

        nvml.nvmlInit()
        try:
            handle = nvml_handle(nvml, visible_device())
            while not self._stop.is_set():
                used = int(nvml.nvmlDeviceGetMemoryInfo(handle).used)
                self.baseline = used if self.baseline is None else self.baseline
                self.peak = max(self.peak or 0, used)
                self._stop.wait(0.01)
        finally:
            nvml.nvmlShutdown()

    def __enter__(self) -> PeakMemory:
        if read_gpu() is not None:
            self._thread.start()
            while self.baseline is None and self._thread.is_alive():
                time.sleep(0.005)
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join()


def registry_of(spec: ModelSpec) -> Registry:
    """One model served alone, its queue and timeout wide enough for every request a benchmark sends at once."""
    return Registry(path=spec.gguf.with_name("models.toml"), default=spec.name, models={spec.name: spec},
                    server=ServerSpec(max_queue=1024, request_timeout_s=600.0))


def router_body(gguf: Path, tokens: int) -> tuple[dict, int]:
    """The router request (4 questions, 19 options) with the state grown to about `tokens` tokens
    in this GGUF's vocabulary (0: the shortest); the body and its token count."""
    from tests.vocab import VocabOnly

    vocab = VocabOnly(gguf)
    try:
        count = lambda body: len(encode(parse_request(body), vocab.tokenize).input_ids)  # noqa: E731
        body, n = router_request(NAME, sentences=0), count(router_request(NAME, sentences=0))
        for sentences in range(1, 40):
            if n >= tokens:
                break
            body, n = router_request(NAME, sentences=sentences), count(router_request(NAME, sentences=sentences))
        return body, n
    finally:
        vocab.close()


def _split(run: dict) -> dict[str, float]:
    """Where a level's median request spent its time: waiting for a batch, backbone, head, the rest of
    the server (tokenizing, waiting for the head thread, answers, JSON), and the client and HTTP
    beyond the server's own total."""
    s = run["server_split_ms"]
    parts = {k: s.get(f"{k}_ms", 0.0) for k in ("queue", "backbone", "head")}
    server = s.get("total_ms", 0.0) - sum(parts.values())
    return {**{f"{k}_ms": v for k, v in parts.items()}, "server_ms": round(server, 2),
            "client_and_http_ms": round(run["p50_ms"] - s.get("total_ms", 0.0), 2)}


def serve_step(gguf: Path, head: Path, head_device: str, tokens: int, requests: tuple[int, ...]) -> dict[str, Any]:
    """p50/p95 end to end, the split, throughput per concurrency level, and peak GPU memory vs the plan
    (the model loads as `serve` loads it, n_gpu_layers = "auto")."""
    spec: ModelSpec = model_spec(NAME, gguf, head, head_device=head_device, n_gpu_layers="auto")
    registry = registry_of(spec)
    body, n_tokens = router_body(gguf, tokens)
    free = read_gpu()
    head_bytes = head_gpu_bytes(load_config(config_path_for(head)), head_device, spec.head_dtype)
    with PeakMemory() as memory, served(registry) as url:
        runs = [bench_run(url, [level], count, None, None, NAME, body=body).result["runs"][0]
                for level, count in zip(LEVELS, requests)]
    out: dict[str, Any] = {"tokens": n_tokens, "head_device": head_device, "levels": {}}
    for run in runs:
        out["levels"][str(run["concurrency"])] = {
            "requests": run["requests"], "errors": run["errors"], "p50_ms": run["p50_ms"], "p95_ms": run["p95_ms"],
            "throughput_rps": run["throughput_rps"], "split_ms": _split(run)}
    out["ok"] = all(r["errors"] == 0 for r in runs)
    if free is not None and memory.peak is not None:
        plan = serving_plan(backbone_file(gguf), spec.backbone, head_bytes, free.free_bytes)
        peak = memory.peak - memory.baseline
        out["vram"] = {"device": free.device, "peak_bytes": peak, "plan_bytes": plan.total_bytes,
                       "plan_margin_bytes": plan.margin_bytes,
                       "peak_over_plan_without_margin": round(peak / (plan.total_bytes - plan.margin_bytes), 3),
                       "within_plan": peak <= plan.total_bytes}
        out["ok"] = out["ok"] and peak <= plan.total_bytes
    else:
        out["vram"] = {"skipped": "no NVML (nvidia-ml-py) or no GPU visible"}
    return out
