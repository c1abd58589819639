"""`python -m benchmarks workloads`: the three workloads of the one published local Clef benchmark, served by upstream's
llama-server and by clef-bridge side by side on one clef GGUF, in one run.

The workloads are generated here, deterministically, with the published shapes: email triage (300 support tickets
of 20-400 words, three decisions each: the queue, the priority, whether a human must read it), an AI model router
(150 prompts of 20-400 words, one choice among cheap / mid-tier / frontier / human approval, each described) and
BANKING77 (320 short customer messages, one choice among sixteen close card intents). A decision is one question
answered. The model is the benchmark backbone (Qwen3.5, width 1024, 8 layers, F32, a Clef-width head) converted to
one clef GGUF by upstream's converter (benchmarks/llama_server.py); llama-server is that module's build.

Measured, the servers' order flipping at every step (a shared machine's load drifts): decisions and requests per
second at each concurrency with each request's latency (p50, p95), on distinct requests of the workload; on a sample
of each workload, each server's worst |p - reference| against Cloudflare's code and how many prompts' token counts
differ from the reference encoder's; clef-bridge's batch route on triage tickets in batches of 16; and the bare
batched llama.cpp prefill of clef-bridge's own token ids for the requests of concurrency 8, in this process with the
servers stopped: the CPU's limit for that work.
"""

from __future__ import annotations

import concurrent.futures
import json
import math
import os
import random
import statistics
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from .llama_server import (
    BenchError,
    Server,
    answer_probabilities,
    llama_server_binary,
    oracle,
    start_clef_bridge,
    start_llama_server,
    upstream_clef_gguf,
)

MODEL = "bench"  # the models.toml name start_clef_bridge serves; llama-server takes any
SIZES = {"triage": 300, "router": 150, "banking77": 320}
BATCH_STATES = 16

QUEUES = {"billing": "charges, invoices, refunds, payment methods and plan prices",
          "technical": "errors, outages, slow pages, failed jobs, integrations and the API",
          "account": "logins, passwords, two-factor codes, users, roles and account settings",
          "shipping": "deliveries, parcels, addresses, returns and lost or damaged goods",
          "sales": "quotes, upgrades, new seats, contracts and renewals"}
PRIORITIES = ["low", "normal", "high", "urgent"]
TRIAGE_QUESTIONS = {
    "queue": {"type": "choice", "instructions": "Which team's queue should this ticket go to?", "criteria": QUEUES},
    "priority": {"type": "score", "instructions": "How soon must someone act on this ticket?",
                 "criteria": PRIORITIES},
    "human": {"type": "noul", "instructions": "Must a person read this ticket before any automated reply is sent?"},
}
ROUTES = {"cheap": "a small fast model: lookups, short rewrites, classification and simple extraction",
          "mid-tier": "a capable general model: summaries, drafting, moderate code and multi-step instructions",
          "frontier": "the strongest model: hard reasoning, long code changes, research and subtle judgement",
          "human approval": "a person must approve first: money, legal or medical stakes, or irreversible actions"}
ROUTER_QUESTIONS = {"route": {"type": "choice", "instructions": "Which model tier should answer this prompt?",
                              "criteria": ROUTES}}
INTENTS = {  # sixteen of BANKING77's card intents: close neighbours on purpose
    "activate_my_card": "the customer wants to activate a new card",
    "card_arrival": "a card that was sent has not arrived yet",
    "card_delivery_estimate": "how long a card takes to be delivered",
    "card_not_working": "a card is declined or does not work",
    "card_about_to_expire": "a card expires soon and needs replacing",
    "card_linking": "linking an existing card to the app",
    "card_payment_fee_charged": "a fee was charged on a card payment",
    "card_payment_not_recognised": "a card payment the customer does not recognise",
    "card_payment_wrong_exchange_rate": "a card payment used a wrong exchange rate",
    "card_swallowed": "an ATM kept the card",
    "compromised_card": "the card details may have been stolen",
    "lost_or_stolen_card": "the card was lost or stolen",
    "order_physical_card": "ordering a physical card",
    "get_physical_card": "receiving a physical card after a virtual one",
    "virtual_card_not_working": "a virtual card does not work",
    "disposable_card_limits": "limits of disposable virtual cards",
}
BANKING_QUESTIONS = {"intent": {"type": "choice", "instructions": "What does the customer want?",
                                "criteria": INTENTS}}

TICKET_LINES = {
    "billing": ["I was charged twice for the March invoice and need one of the payments refunded.",
                "The card on file expired and now the renewal failed, can I pay by bank transfer?",
                "Our plan price went up without notice and the invoice total does not match the quote."],
    "technical": ["The nightly export job failed three times this week and the dashboard shows stale numbers.",
                  "Every request to the API returns a 502 since this morning, our integration is down.",
                  "Pages take more than twenty seconds to load for everyone in the Berlin office."],
    "account": ["I cannot log in because the two-factor code never arrives on my new phone.",
                "Please remove a former employee's user and move her reports to me.",
                "The password reset link says it has expired as soon as I open it."],
    "shipping": ["The parcel tracking has said out for delivery for six days and nothing came.",
                 "The box arrived crushed and two of the glasses inside are broken.",
                 "I moved last week, can you change the delivery address of my open order?"],
    "sales": ["We want twenty more seats before the next quarter, can you send a quote?",
              "Our contract renews in May and we would like to discuss a two-year term.",
              "Is there a discount for non-profits on the business plan?"],
}
FILLER = ["I have attached screenshots of what I see.", "This is the second time I am writing about this.",
          "Our finance team needs an answer before Friday.", "Thanks in advance for looking into it.",
          "Nothing on the status page mentions it.", "I tried again from another browser with the same result.",
          "We have been customers for four years and this never happened before.",
          "Please call me back if that is easier.", "The order number is in the subject line.",
          "My manager is copied on this message."]
PROMPTS = {
    "cheap": ["What is the capital of Portugal?", "Rewrite this sentence in a friendlier tone.",
              "Classify these five emails as spam or not spam."],
    "mid-tier": ["Summarise this meeting transcript into action items with owners.",
                 "Draft a project update email for the steering committee from these notes.",
                 "Write a Python function that deduplicates customer records by email."],
    "frontier": ["Prove that this scheduling algorithm never starves a task, or find a counterexample.",
                 "Refactor this 3,000-line module into a plugin architecture without changing behaviour.",
                 "Compare these three research papers and design an experiment that separates their claims."],
    "human approval": ["Wire 48,000 euros to the supplier account in the attached invoice today.",
                       "Delete every customer record older than five years from the production database.",
                       "Send the termination letter to the employee named in this file."],
}
CONTEXT = ["The data is in the attached spreadsheet.", "Keep the answer under two hundred words.",
           "The audience is the board of directors.", "Use British spelling.",
           "The deadline is tomorrow morning.", "Earlier attempts by a junior analyst were rejected.",
           "Cite the sources you rely on.", "Assume the reader has no technical background."]
BANKING_LINES = {
    "activate_my_card": ["how do I activate my new card", "my card came, how do I turn it on"],
    "card_arrival": ["my card still hasn't arrived", "it's been two weeks and no card in the post"],
    "card_delivery_estimate": ["how long until my card gets here", "when will the new card be delivered"],
    "card_not_working": ["my card keeps getting declined at the shop", "the card doesn't work anywhere"],
    "card_about_to_expire": ["my card expires next month what do I do", "do you send a new card before expiry"],
    "card_linking": ["how do I add my card to the app", "I want to link the card I already have"],
    "card_payment_fee_charged": ["why was I charged a fee for paying by card", "extra fee on my card payment"],
    "card_payment_not_recognised": ["there's a card payment I didn't make", "I don't recognise this payment"],
    "card_payment_wrong_exchange_rate": ["the exchange rate on my card payment is wrong",
                                         "you used a bad rate for my payment abroad"],
    "card_swallowed": ["the cash machine ate my card", "ATM kept my card and didn't give it back"],
    "compromised_card": ["I think someone copied my card details", "my card info was in a data leak"],
    "lost_or_stolen_card": ["I lost my card last night", "my wallet with the card was stolen"],
    "order_physical_card": ["can I order a plastic card", "I want a physical card sent to me"],
    "get_physical_card": ["I have the virtual card, how do I get a real one", "when do I get the physical one"],
    "virtual_card_not_working": ["the virtual card is rejected online", "my virtual card won't go through"],
    "disposable_card_limits": ["how many disposable cards can I make", "is there a limit on disposable cards"],
}
OPENERS = ["hi", "hello", "hey there", "good morning", "", "please help", "urgent"]


def _text(rng: random.Random, first: str, pool: list[str], low: int, high: int) -> str:
    """first, then lines of pool until a length drawn log-uniformly from [low, high] words, cut there."""
    target = round(math.exp(rng.uniform(math.log(low), math.log(high))))
    words = first.split()
    while len(words) < target:
        words += rng.choice(pool).split()
    return " ".join(words[:target])


def triage(rng: random.Random, n: int) -> list[dict[str, Any]]:
    """Support tickets of 20-400 words, three decisions each."""
    out = []
    for i in range(n):
        queue = rng.choice(list(TICKET_LINES))
        lines = TICKET_LINES[queue]
        message = _text(rng, rng.choice(lines), lines + FILLER * 2, 20, 400)
        state = {"ticket": 10_000 + i, "customer": f"customer-{rng.randrange(10**6):06d}", "subject":
                 rng.choice(lines)[:60], "message": message}
        out.append({"model": MODEL, "state": state, "questions": TRIAGE_QUESTIONS})
    return out


def router(rng: random.Random, n: int) -> list[dict[str, Any]]:
    """Prompts of 20-400 words, one choice among four described tiers."""
    out = []
    for i in range(n):
        lines = PROMPTS[rng.choice(list(PROMPTS))]
        prompt = _text(rng, rng.choice(lines), lines + CONTEXT * 2, 20, 400)
        out.append({"model": MODEL, "state": f"Request {i} from team {rng.randrange(40)}: {prompt}",
                    "questions": ROUTER_QUESTIONS})
    return out


def banking(rng: random.Random, n: int) -> list[dict[str, Any]]:
    """Short customer messages, one choice among sixteen close intents."""
    out = []
    for _ in range(n):
        line = rng.choice(BANKING_LINES[rng.choice(list(BANKING_LINES))])
        opener = rng.choice(OPENERS)
        out.append({"model": MODEL, "state": f"{opener} {line}".strip() + rng.choice(["", "?", "!", " asap"]),
                    "questions": BANKING_QUESTIONS})
    return out


GENERATORS: dict[str, Callable[[random.Random, int], list[dict[str, Any]]]] = {
    "triage": triage, "router": router, "banking77": banking}


def workloads(seed: int = 0) -> dict[str, list[dict[str, Any]]]:
    """The three workloads, each with its own seeded generator (one's size does not move another's requests)."""
    return {name: GENERATORS[name](random.Random(f"{seed}:{name}"), size) for name, size in SIZES.items()}


def decisions(body: dict[str, Any]) -> int:
    return len(body["questions"]) * len(body.get("states") or [None])


@dataclass(frozen=True)
class Row:
    workload: str
    concurrency: int
    server: str
    requests: int
    decisions_per_s: float
    requests_per_s: float
    p50_ms: float
    p95_ms: float


def _percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, math.ceil(q * len(ordered)) - 1))]


def measure(server: Server, workload: str, bodies: list[dict[str, Any]], concurrency: int, path: str = "/v1/systemone",
            tick: Callable[[int], None] = lambda n: None) -> Row:
    """The bodies posted with `concurrency` in flight: decisions and requests per second, latency percentiles."""
    def one(body: dict[str, Any]) -> float:
        ms, status, answer = server.post(body, path)
        if status != 200:
            raise BenchError(f"{server.name} answered {status} on {workload}: {json.dumps(answer)[:300]}")
        tick(1)
        return ms

    t0 = time.perf_counter()
    with concurrent.futures.ThreadPoolExecutor(concurrency) as pool:
        latencies = list(pool.map(one, bodies))
    seconds = time.perf_counter() - t0
    return Row(workload, concurrency, server.name, len(bodies), sum(map(decisions, bodies)) / seconds,
               len(bodies) / seconds, statistics.median(latencies), _percentile(latencies, 0.95))


def distinct_slices(load: dict[str, list[dict[str, Any]]], requests: int, concurrency: tuple[int, ...]
                    ) -> dict[tuple[str, int], list[dict[str, Any]]]:
    """The bodies of each (workload, concurrency) measurement: `requests` (at least the concurrency) taken in turn
    from the workload, so that no answer is cached or joined while the workload lasts."""
    slices, at = {}, {name: 0 for name in load}
    for name, bodies in load.items():
        for c in concurrency:
            n = max(requests, c)
            slices[name, c] = [bodies[(at[name] + i) % len(bodies)] for i in range(n)]
            at[name] += n
    return slices


def measure_alternated(servers: list[Server], slices: dict[tuple[str, int], list[dict[str, Any]]],
                       warm_up: dict[str, Any], tick: Callable[[int], None] = lambda n: None) -> list[Row]:
    """Each measurement on every server, their order flipping at every step (a shared machine's load drifts); each
    server answers warm_up first (the first request pays for allocations)."""
    for server in servers:
        server.post({**warm_up, "state": "warm-up"})
    rows = []
    for step, ((name, c), bodies) in enumerate(slices.items()):
        if c == 1:  # single requests: turn by turn, so both servers' latencies sample the same moments
            rows += measure_interleaved(servers, name, bodies, tick)
            continue
        for server in servers if step % 2 else servers[::-1]:
            rows.append(measure(server, name, bodies, c, tick=tick))
    return rows


def measure_interleaved(servers: list[Server], workload: str, bodies: list[dict[str, Any]],
                        tick: Callable[[int], None] = lambda n: None) -> list[Row]:
    """Concurrency 1, each body posted to every server in turn (the order flipping at each body): a block of one
    server's requests after the other's would give each the machine's load of a different half minute (measured: a
    1.03 p50 ratio in blocks where turn by turn gave 0.93 and 0.96). Requests per second: over each server's own
    request times, what it answers back to back."""
    times: dict[str, list[float]] = {s.name: [] for s in servers}
    for i, body in enumerate(bodies):
        for server in servers if i % 2 else servers[::-1]:
            ms, status, answer = server.post(body)
            if status != 200:
                raise BenchError(f"{server.name} answered {status} on {workload}: {json.dumps(answer)[:300]}")
            times[server.name].append(ms)
            tick(1)
    rows = []
    for server in servers:
        seconds = sum(times[server.name]) / 1e3
        rows.append(Row(workload, 1, server.name, len(bodies), sum(map(decisions, bodies)) / seconds,
                        len(bodies) / seconds, statistics.median(times[server.name]),
                        _percentile(times[server.name], 0.95)))
    return rows


def prefill_group(concurrency: tuple[int, ...]) -> int:
    """The bare prefill's sequences per decode: concurrency 8's, where it was measured."""
    return 8 if 8 in concurrency else max(concurrency)


@dataclass
class Fidelity:
    worst: dict[str, float] = field(default_factory=dict)  # server -> worst |p - reference|
    compared: dict[str, int] = field(default_factory=dict)
    token_mismatches: dict[str, int] = field(default_factory=dict)  # prompts whose token count is not the reference's
    worst_token_gap: dict[str, int] = field(default_factory=dict)


def fidelity(servers: list[Server], hf: Path, head: Path, sample: dict[str, list[dict[str, Any]]]
             ) -> dict[str, Fidelity]:
    """Per workload: each server against Cloudflare's reference (same weights, float32, torch) on the sample."""
    import numpy as np

    reference = oracle(hf, head)
    out = {}
    for workload, requests in sample.items():
        fid = Fidelity({s.name: 0.0 for s in servers}, {s.name: 0 for s in servers},
                       {s.name: 0 for s in servers}, {s.name: 0 for s in servers})
        for request in requests:
            encoded, expected = reference.answer(request)
            for server in servers:
                _, status, body = server.post(request)
                if status != 200:
                    raise BenchError(f"{server.name} answered {status}: {json.dumps(body)[:300]}")
                got = answer_probabilities(request, body["answers"])
                diff = max(float(np.abs(np.asarray(g) - e).max()) for g, e in zip(got, expected, strict=True))
                fid.worst[server.name] = max(fid.worst[server.name], diff)
                fid.compared[server.name] += 1
                gap = abs(int(body.get("usage", {}).get("input_tokens", -1)) - len(encoded.input_ids))
                fid.token_mismatches[server.name] += gap > 0
                fid.worst_token_gap[server.name] = max(fid.worst_token_gap[server.name], gap)
        out[workload] = fid
    return out


def bare_prefill(gguf: Path, bodies: dict[str, list[dict[str, Any]]], group: int, threads: int,
                 head: Path | None = None, **keys: Any) -> dict[str, float]:
    """Decisions per second of llama.cpp's batched prefill alone (clef-bridge's token ids, `group` sequences a decode,
    no prefix cache, no head): per workload. head: a backbone GGUF's head (a clef GGUF holds its own); keys: more
    models.toml keys (gpu-check's n_gpu_layers)."""
    from clef_bridge.bridge.config.registry import model_spec
    from clef_bridge.bridge.model.loading import load_checked
    from clef_bridge.head.schema import parse_request

    spec = model_spec(MODEL, gguf, head, n_ctx=8192, n_seq_max=group, max_length=2048, n_threads=threads,
                      prefix_cache_mb=0, **keys)
    loaded = load_checked(spec)
    model = loaded.model
    out = {}
    try:
        for workload, requests in bodies.items():
            tokens = [model.prepare(parse_request(b)).encoded.input_ids for b in requests]
            t0 = time.perf_counter()
            for i in range(0, len(tokens), group):
                model.backbone.prefill_many(tokens[i:i + group])
            out[workload] = sum(map(decisions, requests)) / (time.perf_counter() - t0)
    finally:
        model.close()
    return out


@dataclass(frozen=True)
class WorkloadsBench:
    llama_server: str
    build_seconds: float
    gguf: str
    threads: int
    concurrency: list[int]
    rows: list[Row]
    batch: dict[str, float]  # clef-bridge's /v1/systemone/batch on triage: decisions/s, states
    limit: dict[str, float]  # bare prefill decisions/s per workload, `group` sequences a decode
    fidelity: dict[str, dict[str, Any]]
    chart: str  # what became of the PNG

    def rate(self, workload: str, concurrency: int, server: str) -> float:
        return next(r.decisions_per_s for r in self.rows if (r.workload, r.concurrency, r.server) ==
                    (workload, concurrency, server))

    def p50(self, workload: str, server: str) -> float:
        return next(r.p50_ms for r in self.rows if (r.workload, r.concurrency, r.server) == (workload, 1, server))

    def to_dict(self) -> dict[str, Any]:
        out = {k: v for k, v in vars(self).items() if k != "rows"}
        out["rows"] = [vars(r) for r in self.rows]
        return out


def chart(result_rows: list[Row], limit: dict[str, float], path: Path) -> str:
    """Decisions per second per workload and concurrency, both servers, the bare prefill's limit at its group."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return f"matplotlib is not installed (pip install '.[plots]'): skipped {path.name}"
    names = list(dict.fromkeys(r.workload for r in result_rows))
    fig, axes = plt.subplots(1, len(names), figsize=(4.5 * len(names), 4), squeeze=False)
    for ax, workload in zip(axes[0], names):
        rows = [r for r in result_rows if r.workload == workload]
        levels = sorted({r.concurrency for r in rows})
        for k, server in enumerate(("llama-server", "clef-bridge")):
            values = [next(r.decisions_per_s for r in rows if r.server == server and r.concurrency == c)
                      for c in levels]
            ax.bar([i + (k - 0.5) * 0.4 for i in range(len(levels))], values, width=0.4, label=server)
        if workload in limit:
            ax.axhline(limit[workload], color="black", ls=":", label="bare prefill (8 a decode)")
        ax.set(title=workload, xticks=range(len(levels)), xticklabels=[f"c={c}" for c in levels],
               ylabel="decisions / s")
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return f"wrote {path}"


def run(binary: Path | None, requests: int = 16, concurrency: tuple[int, ...] = (1, 8, 32), sample: int = 30,
        batches: int = 3, threads: int = 0, seed: int = 0, png: Path | None = Path("workloads.png"),
        log: Callable[[str], None] = print) -> WorkloadsBench:
    """The whole benchmark (see the module's docstring); requests: per workload and concurrency (at least the
    concurrency), each request distinct; sample: requests per workload compared with the reference."""
    from clef_bridge.bridge.host.progress import Progress

    binary, build_seconds = llama_server_binary(binary, log)
    threads = threads or os.cpu_count() or 1
    gguf, hf, head = upstream_clef_gguf()
    load = workloads(seed)
    slices = distinct_slices(load, requests, concurrency)
    compared = {name: bodies[-sample:] for name, bodies in load.items()} if sample else {}
    triage_states = [b["state"] for b in load["triage"][:batches * BATCH_STATES]]
    folder = Path(tempfile.mkdtemp(prefix="clef-bridge-workloads-"))
    parallel = max(concurrency)
    total = 2 * sum(len(s) for s in slices.values()) + len(triage_states)
    progress = Progress("workloads", total, unit="requests")
    servers: list[Server] = []
    try:
        servers.append(start_llama_server(binary, gguf, folder, parallel, threads))
        servers.append(start_clef_bridge(gguf, folder, parallel, threads))
        rows = measure_alternated(servers, slices, load["triage"][0], progress.update)
        t0 = time.perf_counter()
        for i in range(0, len(triage_states), BATCH_STATES):
            body = {"model": MODEL, "states": triage_states[i:i + BATCH_STATES], "questions": TRIAGE_QUESTIONS}
            _, status, answer = servers[1].post(body, "/v1/systemone/batch")
            if status != 200:
                raise BenchError(f"clef-bridge's batch route answered {status}: {json.dumps(answer)[:300]}")
            progress.update(len(body["states"]))
        batch_s = time.perf_counter() - t0
        progress.close()
        fid = fidelity(servers, hf, head, compared) if compared else {}
    finally:
        progress.close()
        for server in servers:
            server.stop()
    group = prefill_group(concurrency)
    limit = bare_prefill(gguf, {name: slices[name, group] for name in load}, group, threads)
    batch = {"decisions_per_s": len(triage_states) * len(TRIAGE_QUESTIONS) / batch_s, "states": len(triage_states),
             "batch_states": BATCH_STATES}
    drawn = chart(rows, limit, png) if png is not None else "no chart (--png none)"
    return WorkloadsBench(str(binary), build_seconds, str(gguf), threads, list(concurrency), rows, batch, limit,
                          {name: vars(f) for name, f in fid.items()}, drawn)
