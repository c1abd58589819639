"""bench --agent-loop: the prefix cache on agent traffic, at the backbone level (prefill time only).

Two patterns, real Clef prompts (head.encoder) of single router questions:
- conversation: a JSON state whose transcript grows by one message a turn, `questions` separate
  single-question requests a turn, the history reaching about turns x message_tokens tokens;
- same state: one state of about `state_tokens` tokens, `questions` separate single-question requests.
The cached backbone and a plain one (same GGUF, each decode from empty memory) alternate request by
request, so the drift of a shared machine lands on both sides. The plain side runs only on the last
`baseline_turns` turns (and `baseline_questions` of their questions): its cost depends on nothing
but the prompt's length, and a 4k-token prefill takes tens of seconds on a small CPU.
"""

from __future__ import annotations

import json
import resource
import statistics
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np

from ..bridge.backbone import Backbone, BackboneOptions
from ..bridge.prefix_cache import PrefillRequest, PrefixCacheOptions
from ..head.encoder import PREFIX, encode, render
from ..head.schema import parse_request
from .bench import ROUTER_QUESTIONS

WORDS = ("the build failed again after the dependency update so I pinned the version and reran the tests "
         "which now pass except one flaky integration check that times out when the staging database is "
         "slow; the customer asked whether the export can run nightly and whether the dashboard numbers "
         "include refunds, and the tool returned three rows with totals by region and a warning about "
         "missing currency codes for two invoices").split()


@dataclass(frozen=True)
class AgentLoopConfig:
    turns: int = 20
    message_tokens: int = 190  # the transcript grows by about this many tokens a turn
    questions: int = 4  # separate single-question requests per turn (and on the same state)
    state_tokens: int = 1500  # the same-state pattern's state
    baseline_turns: int = 2  # the plain backbone runs on the last turns only
    baseline_questions: int = 2
    n_ctx: int = 8192
    threads: int = 0
    cache_mb: float = 512
    every: int = 1024
    seed: int = 1234


class TimedMemory:
    """The backbone's SequenceMemory with the seconds each operation took, for the time split."""

    def __init__(self, backbone: Backbone):
        self.backbone = backbone
        self.seconds: dict[str, float] = {}
        self.decoded = 0

    def __getattr__(self, name: str) -> Any:
        op = getattr(self.backbone, name)

        def timed(*args):
            t0 = time.perf_counter()
            try:
                return op(*args)
            finally:
                self.seconds[name] = self.seconds.get(name, 0.0) + time.perf_counter() - t0
                if name == "decode_chunks":
                    self.decoded += sum(len(ids) for _, _, ids in args[0])

        return timed


def message(rng: np.random.Generator, backbone: Backbone, tokens: int) -> str:
    text = ""
    while len(backbone.tokenize(text, False)) < tokens:
        text += " ".join(rng.choice(WORDS, size=8)) + ". "
    return text.strip()


def prompt(backbone: Backbone, state: Any, question: str) -> PrefillRequest:
    """The Clef prompt of one single-question request, with its state section as the cache span."""
    body = {"model": "bench", "state": state, "questions": {question: ROUTER_QUESTIONS[question]}}
    ids = encode(parse_request(body), backbone.tokenize).input_ids
    start = len(backbone.tokenize(PREFIX, True))
    return PrefillRequest(ids, (start, start + len(backbone.tokenize(render(state), False))))


def timed_ms(fn) -> tuple[Any, float]:
    t0 = time.perf_counter()
    out = fn()
    return out, (time.perf_counter() - t0) * 1e3


def ask(cached: Backbone, plain: Backbone | None, req: PrefillRequest) -> dict[str, float]:
    """One request on the cached backbone and, when given, on the plain one right after."""
    [result], cached_ms = timed_ms(lambda: cached.prefill_cached([req]))
    row = {"tokens": len(req.tokens), "reused": result.reused, "cached_ms": cached_ms}
    if plain is not None:
        row["plain_ms"] = timed_ms(lambda: plain.prefill(req.tokens))[1]
    return row


def p50(rows: list[dict], key: str) -> float | None:
    values = [r[key] for r in rows if key in r]
    return round(statistics.median(values), 1) if values else None


def conversation(cached: Backbone, plain: Backbone, cfg: AgentLoopConfig) -> list[dict]:
    rng = np.random.default_rng(cfg.seed)
    questions = list(ROUTER_QUESTIONS)[:cfg.questions]
    state = {"goal": message(rng, cached, 40), "transcript": []}
    turns = []
    for turn in range(1, cfg.turns + 1):
        role = ("user", "assistant", "tool")[turn % 3]
        state["transcript"].append({"role": role, "text": message(rng, cached, cfg.message_tokens)})
        baseline = turn > cfg.turns - cfg.baseline_turns
        requests = [prompt(cached, state, q) for q in questions]
        rows = [ask(cached, plain if baseline and i < cfg.baseline_questions else None, req)
                for i, req in enumerate(requests)]
        turns.append({"turn": turn, "tokens": max(r["tokens"] for r in rows), "rows": rows,
                      "last_request": requests[-1],
                      "cached_p50_ms": p50(rows, "cached_ms"), "plain_p50_ms": p50(rows, "plain_ms"),
                      "reused": sum(r["reused"] for r in rows)})
        print(f"  turn {turn:2d}: {turns[-1]['tokens']:5d} tokens, cached p50 {turns[-1]['cached_p50_ms']:8.1f} ms"
              + (f", plain p50 {turns[-1]['plain_p50_ms']:8.1f} ms" if baseline else "")
              + f", reused {[r['reused'] for r in rows]}", file=sys.stderr, flush=True)
    return turns


def hit_anatomy(cached: Backbone, req: PrefillRequest) -> dict[str, float]:
    """Where one hit's time goes: the restore, and its new tokens decoded on top of the cached cells
    against the same tokens decoded from empty memory (the difference is attention to the prefix)."""
    timer = cached.prefix_cache.memory
    timer.seconds.clear()
    [result], hit_ms = timed_ms(lambda: cached.prefill_cached([req]))
    spent = {k: v * 1e3 for k, v in timer.seconds.items()}
    fresh = req.tokens[result.reused:]
    empty_ms = timed_ms(lambda: cached.prefill_many([fresh]))[1]
    return {"reused": result.reused, "new_tokens": len(fresh), "hit_ms": round(hit_ms, 1),
            "restore_ms": round(spent.get("restore_state", 0) + spent.get("copy_cells", 0), 2),
            "decode_on_prefix_ms": round(spent.get("decode_chunks", 0), 1),
            "same_tokens_from_empty_ms": round(empty_ms, 1)}


def same_state(cached: Backbone, plain: Backbone, cfg: AgentLoopConfig) -> list[dict]:
    rng = np.random.default_rng(cfg.seed + 1)
    state = {"goal": message(rng, cached, 40), "log": message(rng, cached, cfg.state_tokens)}
    return [ask(cached, plain, prompt(cached, state, q)) for q in list(ROUTER_QUESTIONS)[:cfg.questions]]


def agent_loop(gguf: Path, cfg: AgentLoopConfig = AgentLoopConfig()) -> dict[str, Any]:
    """Both patterns, cache on and off in one run; numbers in a dict (see print_report)."""
    base = dict(n_ctx=cfg.n_ctx, n_seq_max=4, n_threads=cfg.threads)
    cache = PrefixCacheOptions(max_mb=cfg.cache_mb, every=cfg.every, sequences=4)
    with Backbone(gguf, BackboneOptions(**base)) as plain, \
            Backbone(gguf, BackboneOptions(**base, prefix_cache=cache)) as cached:
        timer = TimedMemory(cached)
        cached.prefix_cache.memory = timer
        turns = conversation(cached, plain, cfg)
        split = {k: round(v, 2) for k, v in timer.seconds.items()}
        decoded, stats = timer.decoded, asdict(cached.prefix_cache.stats())
        anatomy = hit_anatomy(cached, turns[-1]["last_request"])
        cached.prefix_cache.clear()
        same = same_state(cached, plain, cfg)
    last = [r for t in turns[-cfg.baseline_turns:] for r in t["rows"]]
    cached_ms, plain_ms = p50(last, "cached_ms"), p50(last, "plain_ms")
    return {
        "gguf": str(gguf), "config": asdict(cfg),
        "conversation": {"turns": [{k: v for k, v in t.items() if k not in ("rows", "last_request")} for t in turns],
                         "last_turns_cached_p50_ms": cached_ms, "last_turns_plain_p50_ms": plain_ms,
                         "plain_over_cached": round(plain_ms / cached_ms, 2) if cached_ms and plain_ms else None,
                         "cached_seconds": round(sum(r["cached_ms"] for t in turns for r in t["rows"]) / 1e3, 1),
                         "cached_split_s": split, "tokens_decoded": decoded, "cache": stats,
                         "hit_anatomy_ms": anatomy},
        "same_state": {"requests": same, "cached_first_ms": round(same[0]["cached_ms"], 1),
                       "cached_p50_ms": p50(same[1:], "cached_ms"), "plain_p50_ms": p50(same, "plain_ms"),
                       "plain_over_cached": round(p50(same, "plain_ms") / p50(same[1:], "cached_ms"), 2)
                       if len(same) > 1 else None},
        "max_rss_mb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1),
    }


def print_report(result: dict[str, Any]) -> None:
    conv, same = result["conversation"], result["same_state"]
    cfg = result["config"]
    print(f"clef-bridge bench --agent-loop on {result['gguf']} (backbone prefill only)")
    print(f"  conversation: {cfg['turns']} turns, {cfg['questions']} single-question requests a turn, "
          f"{conv['turns'][-1]['tokens']} tokens at the last turn")
    for t in conv["turns"]:
        plain = f", plain p50 {t['plain_p50_ms']:.1f} ms" if t["plain_p50_ms"] else ""
        print(f"    turn {t['turn']:2d}: {t['tokens']:5d} tokens, cached p50 {t['cached_p50_ms']:.1f} ms{plain}, "
              f"{t['reused']} tokens reused")
    print(f"  last {cfg['baseline_turns']} turns: cached p50 {conv['last_turns_cached_p50_ms']} ms, plain p50 "
          f"{conv['last_turns_plain_p50_ms']} ms: plain / cached = {conv['plain_over_cached']}")
    split = ", ".join(f"{k} {v:.2f}" for k, v in conv["cached_split_s"].items())
    print(f"  cached conversation: {conv['cached_seconds']} s in all, {conv['tokens_decoded']} tokens decoded; "
          f"seconds in {split}")
    a = conv["hit_anatomy_ms"]
    print(f"  one hit at the last turn ({a['reused']} tokens restored, {a['new_tokens']} decoded): {a['hit_ms']} ms; "
          f"restore {a['restore_ms']} ms, decode on the prefix {a['decode_on_prefix_ms']} ms, the same tokens "
          f"from empty memory {a['same_tokens_from_empty_ms']} ms")
    c = conv["cache"]
    print(f"  cache: {c['hits']} hits, {c['misses']} misses, {c['tokens_reused']} tokens reused, "
          f"{c['tokens_prefilled']} prefilled, {c['checkpoints']} checkpoints, {c['evictions']} evictions, "
          f"{c['bytes'] / 2**20:.1f} MiB of {c['max_bytes'] / 2**20:.0f}, {c['cells']} KV cells, "
          f"{c['branches']} sequences")
    print(f"  same state ({same['requests'][0]['tokens']} tokens, {len(same['requests'])} requests): first (miss) "
          f"{same['cached_first_ms']} ms, cached p50 of the rest {same['cached_p50_ms']} ms, plain p50 "
          f"{same['plain_p50_ms']} ms: plain / cached = {same['plain_over_cached']}")
    print(f"  process max RSS {result['max_rss_mb']} MiB (both backbones)")
    sys.stdout.flush()


def run(gguf: Path, cfg: AgentLoopConfig = AgentLoopConfig(), as_json: bool = False) -> int:
    """The `clef-bridge bench --agent-loop` entry point: prints the report (or JSON); 0 when it ran."""
    result = agent_loop(gguf, cfg)
    if as_json:
        print(json.dumps(result))
    else:
        print_report(result)
    return 0
