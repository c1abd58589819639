"""Text for the benchmarks' results, registered with the package's renderer (clef_bridge.tools.render.text)."""

from __future__ import annotations

import statistics

from clef_bridge.tools.render import text

from .agent_loop import AgentLoopResult
from .architecture import SYSTEMONE_KEYS, Architecture
from .bench_head import LOGIT_TOLERANCE, HeadBench
from .demo_start import DemoStart
from .fuzz import FuzzReport
from .gpu_check import GpuCheck
from .gpu_models import GpuModels
from .llama_server import SideBySide
from .lora import LoraBench
from .omni import OmniBench
from .parsers import OWN, SERVER, ParsersBench
from .shadows import ShadowBench
from .soak import SoakVerdict
from .workloads import WorkloadsBench, prefill_group


@text.register
def _(result: AgentLoopResult) -> str:
    cfg = result.config
    lines = [f"python -m benchmarks bench --agent-loop on {result.gguf}: cache on and off, end to end in this process",
             f"  conversation: {cfg.turns} turns, {cfg.questions} single-question requests a turn"]
    for t in result.turns:
        plain = f", uncached p50 {t['plain_p50_ms']:.1f} ms" if t["plain_p50_ms"] else ""
        lines.append(f"    turn {t['turn']:2d}: {t['tokens']:5d} tokens, cached p50 {t['cached_p50_ms']:8.1f} ms"
                     f"{plain}, tokens reused {t['reused']}")
    cached, plain = result.last_turns
    lines.append(f"  last {cfg.baseline_turns} turns: cached p50 {cached} ms, uncached p50 {plain} ms: "
                 f"uncached / cached = {result.speedup}")
    lines.append("  cached conversation, where the time went (ms): "
                 + ", ".join(f"{k} {v:.0f}" for k, v in result.split_ms.items()))
    c = result.cache
    lines.append(f"  cache: {c['hits']} hits, {c['misses']} misses, {c['tokens_reused']} tokens reused, "
                 f"{c['tokens_prefilled']} prefilled, {c['checkpoints']} checkpoints, {c['evictions']} evictions, "
                 f"{c['bytes'] / 2**20:.1f} MiB of {c['max_bytes'] / 2**20:.0f} MiB")
    same = result.same_state
    lines.append(f"  same state, {len(same)} requests: cached {[r['cached_ms'] for r in same]} ms (the first a miss), "
                 f"uncached {[r.get('plain_ms') for r in same]} ms")
    lines.append(f"  process max RSS {result.max_rss_mb} MiB (both models)")
    return "\n".join(lines)


@text.register
def _(result: SoakVerdict) -> str:
    lines = [f"  {key:24s} {value}" for key, value in result.summary.items()]
    return "\n".join(lines + [f"soak: {result.verdict}"])


@text.register
def _(result: HeadBench) -> str:
    lines = [f"joint head at Clef-flash shape, {result.tokens} tokens, {result.questions} questions / {result.options} "
             f"options, {result.weights} weights, {result.torch_threads} torch threads, runs in turns"]
    for label, ts in result.times_ms.items():
        lines.append(f"  {label:14s} median {statistics.median(ts):8.1f} ms  (range {min(ts):.1f} to {max(ts):.1f})")
    lines.append(f"  ratio numpy/torch {result.ratio:.3f}   max |logit diff| {result.max_logit_diff:.2e} "
                 f"(tolerance {LOGIT_TOLERANCE:g}; torch is Cloudflare's reference in float32)")
    if result.half:
        d = result.half
        lines.append(f"  {d['dtype']} matrices vs float32: max |logit diff| {d['max_abs_logit_diff_vs_float32']:.2e}, "
                     f"max |probability diff| {d['max_abs_prob_diff_vs_float32']:.2e}")
    return "\n".join(lines)


@text.register
def _(result: GpuCheck) -> str:
    lines = [f"gpu-check{' --smoke' if result.smoke else ''}: {'PASS' if result.ok else 'FAIL'}"]
    for step in result.steps:
        verdict = "skipped" if step.ok is None else "ok" if step.ok else "FAILED"
        lines.append(f"  {step.name:14s} {verdict:8s} {step.seconds:6.1f} s")
        for key, value in step.detail.items():
            if key != "traceback":
                lines.append(f"      {key}: {value}")
    return "\n".join(lines)


@text.register
def _(result: GpuModels) -> str:
    files = ", ".join(f"{k} {p.name}" for k, p in result.ggufs.items())
    return (f"gpu-check models ({result.shape.name}) in {result.folder}: {files}, {result.head.name}; "
            f"{result.bytes / 1e9:.2f} GB" + (f", written in {result.seconds:.1f} s" if result.seconds else ""))


@text.register
def _(result: OmniBench) -> str:
    lines = [f"python -m benchmarks omni: tiny Clef-omni (vocabulary 151,936, hidden 64), llama.cpp on "
             f"{result.threads} thread(s)"]
    lines.append("  lm_head on every token (ms per 1k tokens, best run; buffers as llama.cpp reports them):")
    for r in result.lm_head:
        lines.append(f"    chunk {r['chunk']:4d}: body only {r['body_ms_per_1k']:7.1f}, every token an output + stop "
                     f"{r['skip_ms_per_1k']:7.1f}, lm_head running {r['run_ms_per_1k']:7.1f}; host logits buffer "
                     f"{r['host_logits_mib']:.1f} MiB, compute buffer "
                     f"{r.get('compute_buffer_mib', 0):.1f} MiB")
    lines.append("  projector split (the vision half into the cache):")
    for r in result.split:
        lines.append(f"    {r['source']}: {r['source_bytes'] / 1e6:.1f} MB -> {r['written_bytes'] / 1e6:.1f} MB in "
                     f"{r['seconds'] * 1e3:.0f} ms ({r['mb_per_s']:.0f} MB/s); reused in "
                     f"{r['reuse_seconds'] * 1e3:.1f} ms")
    lines.append("  numpy audio tower (features + tower):")
    for r in result.audio:
        lines.append(f"    {r['tower']}: {r['seconds_of_audio']:g} s -> {r['tokens']} tokens in {r['ms']:.0f} ms "
                     f"({r['cpu_s_per_audio_s']:.3f} s per second of audio)")
    lines.append("  latency, one request, prefix cache off (best run and its stages; median):")
    for r in result.latency:
        lines.append(f"    {r['request']}: {r['input_tokens']} tokens, {r['best_ms']:.0f} ms (median "
                     f"{r['median_ms']:.0f}; backbone "
                     f"{r['backbone_ms']:.0f}, head {r['head_ms']:.0f}, vision {r['vision_ms']:.0f}, audio "
                     f"{r['audio_ms']:.0f})")
    lines.append("  video, per second of clip (H.264 + AAC; tower and prefill at Qwen3-Omni's shape, counted):")
    for r in result.video:
        lines.append(f"    {r['clip']}: decode {r['decode_ms_per_s']:.0f} ms, resize {r['resize_ms_per_s']:.0f} ms, "
                     f"frames {r['frame']}, {r['tokens_per_s']:.0f} tokens, vision tower "
                     f"{r['tower_gflop_per_s']} GFLOP, prefill {r['prefill_gflop_per_s']} GFLOP")
    if result.vision:
        v = result.vision
        lines.append(f"    vision tower of Qwen3-Omni's shape: a {v['frames']} ({v['patches']} patches, {v['tokens']} "
                     f"tokens, {v['gflop']} GFLOP) in {v['seconds']:.2f} s: per second of video at 2 fps")
    lines += [f"  {n}" for n in result.notes]
    return "\n".join(lines)


@text.register
def _(result: DemoStart) -> str:
    lines = [f"built-in demos (the demo and the Clef-omni demo): written in {result.write_s:.3f} s "
             f"({result.write_mb} MB), median of the writes into empty folders",
             f"clef-bridge serve without models.toml on a fresh cache, medians of {result.runs} starts "
             f"(load average {result.load:.1f}):"]
    lines += [f"  {step}: {seconds:.2f} s" for step, seconds in result.steps.items()]
    lines.append("  statuses: " + ", ".join(f"{k} {v}" for k, v in result.statuses.items()))
    return "\n".join(lines)


@text.register
def _(result: LoraBench) -> str:
    m, flash = result.memory, result.memory["clef_flash_q8_0_gib"]
    mib = lambda n: f"{n / 2**20:.2f} MiB"  # noqa: E731
    return "\n".join([
        f"python -m benchmarks lora on {result.gguf}: {result.batch} x {result.tokens} tokens per prefill",
        f"  prefill p50: base {result.base_ms} ms, base + adapter {result.adapter_ms} ms, merged GGUF "
        f"{result.merged_ms} ms (adapter / merged = {result.adapter_ms / result.merged_ms:.2f})",
        f"  adapter vs merged hidden states: max relative difference {result.merged_rel_diff:.1e}",
        f"  two adapters, mixed traffic: {result.alternating_ms} ms per batch switching every batch "
        f"({result.switches[0]} switches), {result.grouped_ms} ms grouped ({result.switches[1]}): "
        f"{result.switch_ms} ms per switch",
        f"  memory, these files: base {mib(m['base_bytes'])}, adapter {mib(m['adapter_bytes'])}, merged "
        f"{mib(m['merged_bytes'])}; base + 3 adapters {mib(m['base_plus_3_adapters_bytes'])} vs 3 merged "
        f"{mib(m['three_merged_bytes'])}",
        f"  memory, Clef-flash Q8_0 weights: base + 3 adapters {flash['base_plus_3_r64']} GiB at rank 64, "
        f"{flash['base_plus_3_r256']} GiB at rank 256, vs 3 merged {flash['three_merged']} GiB",
    ])


@text.register
def _(result: SideBySide) -> str:
    built = f", built in {result.build_seconds / 60:.0f} min" if result.build_seconds else ""
    lines = [f"python -m benchmarks llama-server: {result.llama_server}{built}",
             f"  model: {result.gguf} (upstream's converter), {result.prompt_tokens}-token requests, "
             f"{result.threads} threads each"]
    for name in result.single_ms:
        refused = f", {len(result.refused[name])} refused" if result.refused[name] else ""
        lines.append(f"  {name:12s} single p50 {result.single_ms[name]:8.1f} ms, {result.requests_per_s[name]:6.2f} "
                     f"req/s at concurrency, worst |p - reference| {result.worst_diff[name]:.1e} over "
                     f"{result.compared[name]} requests{refused}")
    lines.append(f"  single: llama-server / clef-bridge = {result.single_ratio:.2f}; "
                 f"throughput: clef-bridge / llama-server = {result.throughput_ratio:.2f}")
    lines += [f"  {name} refused: {why}" for name, whys in result.refused.items() for why in whys]
    return "\n".join(lines)


@text.register
def _(result: FuzzReport) -> str:
    f = result.figures
    lines = [f"python -m benchmarks fuzz: {f['seconds']:g} s against `clef-bridge serve` under RLIMIT_AS "
             f"{f['memory_cap_gib']:g} GiB",
             f"  requests: {f['requests']} ({f['schemathesis_requests']} from schemathesis over every door, "
             f"{f['media_requests']} of byte-mutated media)",
             "  statuses: " + ", ".join(f"{status}: {n}" for status, n in f["statuses"].items()),
             f"  5xx: {f['server_errors']}" + "".join(f"\n    {case}" for case in f["server_error_cases"]),
             f"  slowest refusal: {f['slowest_refusal_ms']} ms ({f['slowest_refusal']})",
             f"  /health: worst {f['health_worst_ms']} ms, {f['health_failures']} failed",
             f"  server RSS: {f['rss_mib_before']} MiB before, {f['rss_mib_after']} MiB after"
             f"{'' if f['server_alive'] else ', and it DIED'}"]
    return "\n".join(lines + [f"fuzz: {f['verdict']}"])


def _short_loc(loc: str) -> str:
    """pydantic names each union branch in its loc (`dict[str,nullable[union[...]]]`): one word is enough here."""
    return ".".join("<branch>" if "[" in part and part != "[key]" else part for part in loc.split("."))


@text.register
def _(result: ParsersBench) -> str:
    names = list(result.small)
    width = 19
    head = f"  {'':44s}" + "".join(f"{n:>{width}s}" for n in names)

    def cells(values: dict[str, float], unit: str = "ms") -> str:
        base = values.get(OWN) or 0  # own code's ready_ms is 0: nothing to declare
        out = []
        for n in names:
            v = values.get(n)
            ratio = f" {v / base:5.2f}x" if v is not None and base and n != OWN else ""
            out.append(f"{'-' if v is None else f'{v:.1f} {unit}'}{ratio}".rjust(width))
        return "".join(out)

    s = result.setup
    lines = [f"python -m benchmarks parsers: System One bodies from bytes to a checked DecisionRequest (Python "
             f"{s['python']}, {s['cpus']} CPUs, load {s['load']}; ratios against {OWN})",
             "  " + "; ".join(f"{n}: {result.versions[n]}" for n in names) + "; own = + head.schema.parse_request",
             head]
    small = f"{result.bodies['small bodies']:,} small bodies (mean {result.bodies['small mean bytes']} B), total"
    timed = [(f"{label} ({result.bodies[label] / 1e6:.2f} MB)", per, s["repeats"]) for label, per in result.big.items()]
    for label, per, runs in timed + [(small, result.small, s["rounds"])]:
        lines.append(f"  {label:44s}" + cells({n: v["request_ms"] for n, v in per.items()}))
        lines.append(f"  {'  validated only (own: the same step)':44s}"
                     + cells({n: v["validated_ms"] for n, v in per.items()}))
        lines.append(f"  {f'  its JSON reader alone; medians of {runs}':44s}"
                     + cells({n: v["json_ms"] for n, v in per.items()}))
    bad = result.bad
    lines.append(f"  {'planted problems found, of ' + str(len(result.planted)):44s}"
                 + "".join(f"{bad[n]['found']:>{width}d}" for n in names))
    lines.append(f"  {'errors reported / with a full location':44s}"
                 + "".join(f"{str(bad[n]['errors']) + ' / ' + str(bad[n]['located']):>{width}s}" for n in names))
    imports = result.imports
    lines.append(f"  {'import (fresh interpreter, median of 5)':44s}"
                 + cells({n: v["import_ms"] for n, v in imports.items()}))
    lines.append(f"  {'import + declare, over own code loaded':44s}"
                 + cells({n: v["ready_ms"] for n, v in imports.items()}))
    lines.append(f"  {'JSON Schema from the declaration':44s}"
                 + "".join((f"yes, {result.schema[n]['bytes']:,} B" if result.schema[n]["emits"] else "no")
                           .rjust(width) for n in names))
    lines.append("  planted problems, one body, and where each parser puts them (the server's path as own code):")
    for row in result.planted:
        found = " | ".join(f"{'own' if n == OWN else n}: "
                           f"{', '.join(map(_short_loc, row['found'][n])) or 'NOT REPORTED'}"
                           for n in names if n != SERVER)  # the server's path reports as own code does
        lines.append(f"    {row['problem']}: {found}")
    for n in names:
        for err in bad[n]["unplaced"]:
            lines.append(f"    {n}: an error placed at no planted problem: {_short_loc(err)}")
    lines.append("  strict JSON (own server path's reader refuses each):")
    for row in result.strict:
        lines.append(f"    {row['case']:24s} " + " | ".join(f"{n}: {row['verdict'][n]}" for n in names))
    a = result.agreement
    lines.append(f"  agreement on the {a['bodies']:,} small bodies ({a['valid_by_generator']:,} valid as generated): "
                 f"{a['agree']:,} the same (accepted into equal DecisionRequests or refused by all); accepted: "
                 + ", ".join(f"{n} {v:,}" for n, v in a["accepted"].items()))
    for what, count in a["disagreeing"].items():
        lines.append(f"    disagree: {what}: {count}")
    for ex in a["examples"]:
        lines.append(f"      e.g. {ex['defect']}: own {ex['own']}, {ex['differ']}: {ex['body'][:100]}")
    for n, sch in result.schema.items():
        if sch["emits"]:
            lines.append(f"  {n}'s JSON Schema: discriminator {'yes' if sch['discriminator'] else 'no'}, limit "
                         f"keywords {', '.join(sch['keywords']) or 'none'}")
    lines += [f"  {why}" for why in result.missing.values()]
    return "\n".join(lines)


@text.register
def _(result: Architecture) -> str:
    lines = ["python -m benchmarks architecture: what a change touches and what a request runs through"]
    for c in result.changes:
        lines.append(f"  {c.what}: its first commit {c.commit} touched {c.files} files ({c.product_modules} product "
                     f"modules); its {c.commits} commits together {c.files_all} ({c.product_modules_all})")
    lines.append(f"  a new question type: {len(result.question_type_files)} product modules name one as a string: "
                 + ", ".join(result.question_type_files))
    lines.append(f"  modules raising request problems (a Problem or an INVALID error): {len(result.problem_modules)} "
                 f"in {len({m.rsplit('/', 1)[0] for m in result.problem_modules})} folders: "
                 + ", ".join(result.problem_modules))
    lines.append(f"  modules writing System One's keys ({', '.join(SYSTEMONE_KEYS)}): "
                 + ", ".join(result.systemone_shape_modules))
    for t in result.traces:
        lines.append(f"  {t.request}: {t.functions} project functions ran ({t.entered} entered from another module, "
                     f"{t.calls} calls) in {t.modules} modules, {t.threads} threads, {t.hand_offs} thread hand-offs")
        lines.append("    times each step ran: " + ", ".join(f"{step} {n}" for step, n in t.once.items()))
    return "\n".join(lines)


@text.register
def _(result: WorkloadsBench) -> str:
    built = f", built in {result.build_seconds:.0f} s" if result.build_seconds else ""
    lines = [f"python -m benchmarks workloads: llama-server ({result.llama_server}{built}) and clef-bridge on "
             f"{result.gguf}, {result.threads} threads each, alternated",
             f"  {'workload':10} {'c':>3}  {'server':12} {'decisions/s':>11} {'req/s':>7} {'p50 ms':>8} {'p95 ms':>8}"]
    for r in result.rows:
        lines.append(f"  {r.workload:10} {r.concurrency:>3}  {r.server:12} {r.decisions_per_s:11.2f} "
                     f"{r.requests_per_s:7.2f} {r.p50_ms:8.0f} {r.p95_ms:8.0f}")
    lines.append("  clef-bridge / llama-server, decisions per second (goal: 1.5 at c=8) and single p50 (goal: <= 1):")
    for workload in dict.fromkeys(r.workload for r in result.rows):
        rates = "  ".join(f"c={c} {result.rate(workload, c, 'clef-bridge') / result.rate(workload, c, 'llama-server'):.2f}"
                          for c in result.concurrency)
        p50 = (f", p50 {result.p50(workload, 'clef-bridge') / result.p50(workload, 'llama-server'):.2f}"
               if 1 in result.concurrency else "")
        limit = result.limit.get(workload)
        c8 = prefill_group(tuple(result.concurrency))
        share = (f"; bare prefill {limit:.2f} decisions/s, clef-bridge at c={c8} reaches "
                 f"{result.rate(workload, c8, 'clef-bridge') / limit:.2f} of it" if limit else "")
        lines.append(f"    {workload:10} {rates}{p50}{share}")
    b = result.batch
    lines.append(f"  clef-bridge /v1/systemone/batch, triage, {b['states']} states in batches of {b['batch_states']}: "
                 f"{b['decisions_per_s']:.2f} decisions/s")
    for workload, fid in result.fidelity.items():
        parts = [f"{name} worst |dp| {fid['worst'][name]:.1e}, {fid['token_mismatches'][name]}/{fid['compared'][name]} "
                 f"prompts' token counts differ (by up to {fid['worst_token_gap'][name]})" for name in fid["worst"]]
        lines.append(f"  vs the reference, {workload}: " + "; ".join(parts))
    lines.append(f"  chart: {result.chart}")
    return "\n".join(lines)


@text.register
def _(result: ShadowBench) -> str:
    return "\n".join([
        f"python -m benchmarks shadows: the tiny model with and without a head-only shadow, {result.rounds} rounds of "
        f"{result.requests} requests each at concurrency {result.concurrency}, alternated",
        *(f"  {model:9} p50 {result.p50_ms[model]:8.1f} ms, p95 {result.p95_ms[model]:8.1f} ms" for model in result.p50_ms),
        f"  shadowed / plain p50: {result.ratio_p50:.2f}",
        "  shadow scorings: " + ", ".join(f"{k} {v:.0f}" for k, v in result.scorings.items()),
        f"  the shadow's own llama_decode calls: {result.shadow_backbone_runs:.0f} (0: it scored from the requests' "
        "own hidden states)"])
