"""`python -m benchmarks shadows`: what a shadow model costs the requests it shadows. One server on the tiny test model
serves it twice over one backbone, `plain` and `shadowed` (the same GGUF and head; `shadowed` has a head-only
fine-tune, `candidate`, as its shadow, scored from each request's own hidden states: one head pass, no prefill), and
rounds of distinct requests at a given concurrency go to each in turn; the p50 and p95 of each, their ratio, how many
shadow scorings ran or were dropped, and the shadow's own llama_decode calls (0: it prefilled nothing)."""

from __future__ import annotations

import concurrent.futures
import statistics
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

QUESTIONS = {"refund": {"type": "noul", "instructions": "Does the customer ask for a refund?"},
             "team": {"type": "choice", "instructions": "Which team?", "criteria": {"billing": "money", "tech": "bugs"}}}


@dataclass(frozen=True)
class ShadowBench:
    concurrency: int
    requests: int  # per round and model
    rounds: int
    p50_ms: dict[str, float]  # plain, shadowed
    p95_ms: dict[str, float]
    ratio_p50: float  # shadowed / plain
    scorings: dict[str, float]  # shadow outcome -> count
    shadow_backbone_runs: float  # the candidate's batched llama_decode calls: 0, its scorings read the primary's states

    def to_dict(self) -> dict[str, Any]:
        return dict(vars(self))


def _registry(folder: Path) -> Any:
    from clef_bridge.bridge.config.registry import load_registry

    from tests import fixturegen_lora

    lfx = fixturegen_lora.build()
    base = lfx.base
    entry = f'gguf = "{base.gguf_f32}"\nn_ctx = 8192\nmax_length = 4096\nn_seq_max = 8\n'
    toml = folder / "models.toml"
    toml.write_text(f'default = "plain"\n[server]\nrequest_timeout_s = 600\n'
                    f'[models.plain]\n{entry}head = "{base.head}"\n'
                    f'[models.shadowed]\n{entry}head = "{base.head}"\nshadow = ["candidate"]\n'
                    f'[models.candidate]\n{entry}head = "{lfx.head("claims")}"\n')
    return load_registry(toml)


def run(concurrency: int = 8, requests: int = 24, rounds: int = 3) -> ShadowBench:
    from tests.serverkit import RunningServer

    latencies: dict[str, list[float]] = {"plain": [], "shadowed": []}
    with tempfile.TemporaryDirectory() as tmp, RunningServer(_registry(Path(tmp))) as server:
        def post(body: dict[str, Any]) -> float:
            t0 = time.perf_counter()
            reply = server.post(body)
            if reply.status != 200:
                raise RuntimeError(f"HTTP {reply.status}: {reply.body[:200]!r}")
            return (time.perf_counter() - t0) * 1e3

        n = 0
        for r in range(rounds + 1):  # the first round warms both and is not counted
            for model in ("plain", "shadowed") if r % 2 else ("shadowed", "plain"):
                bodies = [{"model": model, "state": f"Ticket {(n := n + 1)}: my parcel is late " * 6,
                           "questions": QUESTIONS} for _ in range(requests)]
                with concurrent.futures.ThreadPoolExecutor(concurrency) as pool:
                    times = list(pool.map(post, bodies))
                if r:
                    latencies[model] += times
                time.sleep(1.0)  # the shadows of this round finish before the next
        scorings = {outcome: server.metric("clef_shadow_scorings_total", outcome=outcome)
                    for outcome in ("answered", "dropped", "failed")}
        runs = server.metric("clef_backbone_runs_total", model="candidate")
    p50 = {m: statistics.median(v) for m, v in latencies.items()}
    p95 = {m: sorted(v)[int(0.95 * (len(v) - 1))] for m, v in latencies.items()}
    return ShadowBench(concurrency, requests, rounds, p50, p95, p50["shadowed"] / p50["plain"], scorings, runs)
