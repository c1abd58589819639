"""Text for people: one renderer per result type (the CLI prints what these return; --json prints to_dict())."""

from __future__ import annotations

from functools import singledispatch
from typing import Any

from ..bridge.config.integrity import CheckReport
from ..bridge.config.memory_plan import GIB, MIB
from ..bridge.demo.builtins import DemoFiles
from ..bridge.gguf.clef_split import JoinResult
from ..bridge.gguf.lora import ConvertedLora
from .bench import BenchResult
from .calibrate import SPLITS, CalibrateResult
from .checks import CheckResult, PairResult
from .drift import CONFIDENT, DriftResult
from .evaluate import EvalReport, markdown
from .fit import FitReport
from .pull import Pulled
from .report import ReportResult
from .split_join import SplitReport


@singledispatch
def text(result: Any) -> str:
    raise TypeError(f"no text renderer for {type(result).__name__}")


def report_lines(report: CheckReport, name: str | None) -> list[str]:
    title = f"model {name}: " if name else ""
    lines = [f"{title}{report.gguf} + {report.head_label}: {'ACCEPTED' if report.accepted else 'REFUSED'}"]
    for f in report.findings:
        lines.append(f"  {f.level.upper():7s} {f.code}: {f.message}")
        if f.fix:
            lines.append(f"          fix: {f.fix}")
    facts = report.facts
    if report.accepted and facts.architecture:
        lines.append(f"  {facts.architecture}, hidden {facts.embedding_length}, {facts.block_count} layers "
                     f"({facts.full_attention_layers} full attention), vocab {facts.vocab_size}")
    if report.accepted and facts.mmproj:
        deepstack = f" with {facts.mmproj_deepstack_layers} deepstack levels" if facts.mmproj_deepstack_layers else ""
        audio = f"; audio encoder {facts.mmproj_audio} in the same file" if facts.mmproj_audio else ""
        lines.append(f"  vision projector {facts.mmproj}: {facts.mmproj_type}{deepstack}, width {facts.mmproj_width}, "
                     f"{(facts.mmproj_weight_bytes or 0) / 2**20:.1f} MiB of weights{audio}")
    elif report.accepted and facts.projector_checked:
        lines.append("  no vision projector: text only (image requests get a 422)")
    if report.accepted and facts.lora:
        lora = facts.lora
        lines.append(f"  LoRA {lora['path']} ({lora['format']}): rank {lora['rank']}, alpha {lora['alpha']:g}, "
                     f"{lora['modules']} modules ({', '.join(lora['targets'])}), base {lora['base'] or 'not named'}")
    return lines


@text.register
def _(result: CheckResult) -> str:
    return "\n".join(line for name, report in result.reports for line in report_lines(report, name))


@text.register
def _(result: PairResult) -> str:
    if not result.ok:
        return "\n".join(report_lines(result.report, None))
    return (f"wrote {result.path}: head sha256 {result.head_sha256[:16]}..., {result.fingerprint_rows} fingerprint "
            f"rows, {result.canary_requests} canary requests")


@text.register
def _(result: FitReport) -> str:
    p, arch = result.plan, result.arch
    gib = lambda n: f"{n / GIB:6.2f} GiB"  # noqa: E731
    types = ", ".join(f"{t} {n / GIB:.2f}" for t, n in sorted(p.weights_by_type.items(), key=lambda x: -x[1]))
    where = f"GPU, CuPy, {result.head_dtype}" if result.head_on_gpu else "on the CPU"
    vram = f"{result.vram_bytes / GIB:.1f} GiB of VRAM" + (f" free on {result.device}" if result.device else "")
    host = "token_embd" + (f" and the experts of blocks 0-{p.n_cpu_moe - 1}" if p.n_cpu_moe else "")
    linear = arch.n_layer - sum(arch.full)
    lines = [
        f"{p.arch}: {p.ctx} tokens of context, {p.parallel} parallel sequence(s), {vram}",
        f"  weights on GPU     {gib(p.weights_bytes)}  ({types}; {host} in host memory: "
        f"{p.cpu_weights_bytes / GIB:.2f} GiB)",
        f"  KV cache           {gib(p.kv_cache_bytes)}  ({sum(arch.full)} full-attention layers of {arch.n_layer}, "
        f"{p.kv_type})",
        *([f"  recurrent state    {gib(p.recurrent_state_bytes)}  ({linear} linear layers x {p.parallel} "
           "sequence(s))"] if linear else []),
        f"  compute buffers    {gib(p.compute_bytes)}  (n_ubatch {p.n_ubatch}"
        + (", with one block's experts copied in for each ubatch" if p.n_cpu_moe else "") + ")",
        f"  head{'s' if result.adapters > 1 else ' '}              {gib(p.head_bytes - result.adapter_bytes)}  "
        f"({max(1, result.adapters)} x {where}: {result.head_bytes_float32 / MIB:.1f} MiB float32, "
        f"from {result.head_source})",
        *([f"  LoRA adapters      {gib(result.adapter_bytes)}  ({result.adapters} at rank {result.lora_rank} on "
           "every clef-finetune target, float32)"] if result.adapters else []),
        f"  vision projector   {gib(result.vision_weight_bytes + result.vision_compute_bytes)}  "
        + (f"({result.vision_weight_bytes / MIB:.1f} MiB weights + {result.vision_compute_bytes / MIB:.1f} MiB "
           f"compute for the largest image, from {result.vision_source})" if result.vision_source
           else "(none: text only)"),
        *([f"  audio tower        {gib(result.audio_weight_bytes)}  (float32, on the GPU with the head)"]
          if result.audio_weight_bytes else []),
        f"  margin             {gib(p.margin_bytes)}",
        f"  total              {gib(p.total_bytes)}  -> {'FITS' if p.fits else 'does NOT fit'}",
        f"  host memory        {gib(p.host_bytes)}  (weights not on the GPU"
        + (", llama.cpp's logits buffer" if arch.every_token_output else "") + ")",
        "  largest context with every layer on the GPU"
        + (" (experts in host memory as needed)" if arch.n_expert else "") + f": {p.max_ctx}",
    ]
    if arch.n_expert and p.fits:
        lines.append(f"  models.toml: n_cpu_moe = {p.n_cpu_moe} (or \"auto\"), n_ctx = {p.ctx}")
    if not p.fits:
        lines.append(f"  at {p.ctx} tokens use n_gpu_layers = {p.n_gpu_layers} (the rest runs on the CPU)"
                     + (f" with n_cpu_moe = {p.n_cpu_moe}" if arch.n_expert else ""))
    return "\n".join(lines)


@text.register
def _(result: EvalReport) -> str:
    return markdown(result).rstrip("\n")


@text.register
def _(result: CalibrateResult) -> str:
    lines = []
    for c in result.calibrations:
        verdict = "accepted" if c.accepted else f"declined: {c.reason}"
        lines += [f"{c.kind}: {c.n} decisions; T = {c.fitted:.3f} (IQR {c.iqr[0]:.3f}-{c.iqr[1]:.3f}, {SPLITS} random "
                  f"halves), now {c.current:g}: {verdict}",
                  f"    held-out NLL {c.heldout_nll_current:.4f} -> {c.heldout_nll_fitted:.4f}",
                  f"    ECE {c.before['ece']:.4f} -> {c.after['ece']:.4f}, Brier {c.before['brier']:.4f} -> "
                  f"{c.after['brier']:.4f}, NLL {c.before['nll']:.4f} -> {c.after['nll']:.4f}"]
    if result.written:
        lines.append(f"wrote temperature = {result.temperatures} to [models.{result.model}] in {result.written}")
    return "\n".join(lines)


@text.register
def _(result: DriftResult) -> str:
    lines = [f"{result.a} vs {result.b}, {result.requests} requests ({result.source})"]
    for kind, s in result.by_type.items():
        lines.append(f"  {kind:7s} {s['decisions']:5d} decisions: max |dp| {s['max_abs_dp']:.4f}, mean |dp| "
                     f"{s['mean_abs_dp']:.5f}, argmax flips {s['argmax_flips']}, flips among decisions above "
                     f"{CONFIDENT}: {s[f'flips_above_{CONFIDENT}']} of {s[f'decisions_above_{CONFIDENT}']}")
    return "\n".join(lines)


@text.register
def _(result: BenchResult) -> str:
    r = result.result
    lines = [f"clef-bridge bench against {r['url']}"]
    for run in r["runs"]:
        lines.append(f"  concurrency {run['concurrency']:3d}: {run['requests']} requests, {run['errors']} errors, "
                     f"p50 {run['p50_ms']:.1f} ms, p95 {run['p95_ms']:.1f} ms, p99 {run['p99_ms']:.1f} ms, "
                     f"{run['throughput_rps']:.2f} req/s ({run['input_tokens']} tokens each)")
        split = ", ".join(f"{k[:-3]} {v:.1f}" for k, v in run["server_split_ms"].items())
        lines.append(f"                   server split (median ms): {split}")
        lines.extend(f"                   {n} failed: {cause}" for cause, n in run["error_causes"].items())
    if "bare_prefill_ms" in r:
        lines.append(f"  bare llama.cpp prefill of the same tokens: {r['bare_prefill_ms']:.1f} ms, alternated with "
                     f"single requests (p50 {r['alternated_http_p50_ms']:.1f} ms): "
                     f"HTTP p50 / bare = {r['http_over_bare_prefill']:.3f}")
    for dtype in ("float32", "bfloat16"):
        if f"reference_{dtype}_ms" in r:
            lines.append(f"  Cloudflare's reference in-process ({dtype}): {r[f'reference_{dtype}_ms']:.1f} ms; "
                         f"HTTP p50 / reference = {r[f'http_over_reference_{dtype}']:.3f}")
    return "\n".join(lines + list(result.notes))


@text.register
def _(result: ConvertedLora) -> str:
    lora = result.lora
    return (f"wrote {result.path} ({result.bytes / 2**20:.2f} MiB, float32): rank {lora.rank}, alpha {lora.alpha:g}, "
            f"{lora.modules} modules, base {lora.base or 'not named'}")


@text.register
def _(result: SplitReport) -> str:
    s = result.split
    lines = [f"wrote {s.backbone} (qwen35 backbone, tensors copied byte for byte)",
             f"wrote {s.head} ({s.head_dtype}) and {s.config}",
             f"  {s.bytes / 1e9:.2f} GB in {s.seconds:.1f} s"]
    if s.temperatures:
        lines.append(f"  the GGUF carried temperatures {s.temperatures}: put them in models.toml as "
                     "temperature = {...} to keep them")
    return "\n".join(lines + [text(result.pair)])


@text.register
def _(result: JoinResult) -> str:
    lines = [f"wrote {result.path}: a clef GGUF with head matrices in {result.head_type} "
             f"({result.bytes / 1e9:.2f} GB in {result.seconds:.1f} s); llama-server loads it as it is"]
    if result.dropped:
        lines.append(f"  left out (MTP/nextn, which llama-server's clef loader refuses): {', '.join(result.dropped)}")
    return "\n".join(lines)


@text.register
def _(result: DemoFiles) -> str:
    omni = result.omni
    also = (f"; the Clef-omni demo in {omni.folder.name}/: {omni.gguf.name}, {omni.mmproj.name} (vision and audio), "
            f"{omni.head.name}" if omni else "")
    return (f"wrote the demo model to {result.folder}: {result.gguf.name}, {result.mmproj.name} (its vision "
            f"projector), {result.head.name}, joint_head_config.json, {result.models_toml.name}{also} (random weights, "
            f"meaningless answers)\nserve it with: clef-bridge serve --models {result.models_toml}")


@text.register
def _(result: Pulled) -> str:
    lines = [f"added [models.{result.name}] to {result.models_toml}", f"  gguf {result.gguf}",
             f"  head {result.head or '(embedded in the clef GGUF)'}", f"  pair {result.pair}"]
    if result.mmproj:
        lines.append(f"  vision projector downloaded: {result.mmproj}")
    return "\n".join(lines)


def _pct(share: float) -> str:
    return "-" if share != share else f"{100 * share:.1f}%"


def _f(value: float | None, digits: int = 4) -> str:
    return "-" if value is None or value != value else f"{value:.{digits}f}"


SHOWN_BUCKETS = 8  # per question in the text; --json lists every one


@text.register
def _(result: ReportResult) -> str:
    files = ", ".join(f.rsplit("/", 1)[-1] for f in result.files)
    if not result.decisions:
        return (f"no decisions in the decision log {result.log} (read {files}"
                + (f"; {result.skipped} JSON lines held no question the report can read" if result.skipped else "")
                + ")")
    lines = [f"decision log {result.log}: {result.decisions:,} decisions in {len(result.files)} file(s) ({files}), "
             f"{result.first} to {result.last}",
             "  models: " + ", ".join(f"{m} {n:,}" for m, n in result.models.items())
             + ("; shadows: " + ", ".join(f"{m} {n:,}" for m, n in result.shadow_models.items())
                if result.shadow_models else "; no shadows logged")]
    if result.skipped or result.untimed:
        lines.append(f"  {result.skipped} JSON lines held no question the report can read; {result.untimed} "
                     "decisions without a readable time (left out of the drift)")
    if result.agreement:
        lines += ["", "agreement of primary and shadow (the same top answer; |dp| over the options)"]
    for pair in result.agreement:
        o = pair.overall
        went = ", ".join(f"{outcome} {n:,}" for outcome, n in pair.outcomes.items())
        lines.append(f"  {pair.model} vs {pair.shadow}: {pair.lines:,} line(s) ({went}), {o.n:,} decisions, agree "
                     f"{_pct(o.share)}, mean |dp| {_f(o.mean_abs_dp)}, max |dp| {_f(o.max_abs_dp)}"
                     + (f"; {pair.missing} questions the shadow did not answer" if pair.missing else "")
                     + (f"; {pair.mismatched} with other options (not compared)" if pair.mismatched else ""))
        lines.append(f"    {'question':20s} {'type':7s} {'n':>7s} {'agree':>7s} {'mean|dp|':>9s} {'max|dp|':>8s}")
        lines += [f"    {q.question:20s} {q.type:7s} {q.n:7,d} {_pct(q.share):>7s} {_f(q.mean_abs_dp):>9s} "
                  f"{_f(q.max_abs_dp):>8s}" for q in pair.questions]
    if result.drift:
        lines += ["", f"answers per {result.bucket_hours:g} h bucket (UTC): the share of each top answer; the "
                      "largest change from the first bucket to the last"]
    for d in result.drift:
        change = "one bucket" if d.top_change is None else (
            f"top answer {d.top_change.option!r} {_pct(d.top_change.first)} -> {_pct(d.top_change.last)} "
            f"({100 * d.top_change.delta:+.1f} points), mean p of {d.p_change.option!r} {_f(d.p_change.first)} -> "
            f"{_f(d.p_change.last)} ({d.p_change.delta:+.4f})")
        lines.append(f"  {d.model} / {d.question} ({d.type}), {d.n:,} decisions in {len(d.buckets)} buckets: {change}")
        shown = list(d.buckets)
        if len(shown) > SHOWN_BUCKETS:
            half = SHOWN_BUCKETS // 2
            shown = shown[:half] + [None] + shown[-half:]
        for b in shown:
            lines.append(f"    ... {len(d.buckets) - SHOWN_BUCKETS} more buckets (--json lists them)" if b is None
                         else f"    {b.start:%Y-%m-%d %H:%M}  n {b.n:6,d}  "
                         + "  ".join(f"{o} {_pct(v)}" for o, v in b.top_share.items()))
    if result.labels is not None:
        j = result.labels
        left = [f"{n:,} {what}" for n, what in ((j.unmatched, "without a decision"), (j.ambiguous, "ambiguous "
                "(several states of a batch: add state_sha256)"), (j.invalid, "not an option")) if n]
        lines += ["", f"labels {j.path}: {j.rows:,} rows, {j.joined:,} joined" + "".join(f", {x}" for x in left)]
        lines += [f"  {p}" for p in j.problems]
    if result.quality:
        lines += ["", "against the labels (ECE over 15 bins)",
                  f"  {'model':20s} {'type':7s} {'n':>7s} {'accuracy':>9s} {'Brier':>7s} {'ECE':>7s} {'NLL':>7s}"]
        lines += [f"  {q.model:20s} {q.type:7s} {q.n:7,d} {_f(q.accuracy):>9s} {_f(q.brier):>7s} {_f(q.ece):>7s} "
                  f"{_f(q.nll):>7s}" for q in result.quality]
        lines += ["", "temperatures calibrate would fit, on the logs of the logged probabilities: a factor on the "
                      "temperature the answers were made at (the model's; 1 where none is configured)"]
        for q in result.quality:
            c = q.calibration
            if c is None:
                continue
            verdict = "accepted" if c.accepted else f"declined: {c.reason}"
            lines.append(f"  {q.model} {c.kind}: {c.n} decisions, T x {c.fitted:.3f} (IQR {c.iqr[0]:.3f}-"
                         f"{c.iqr[1]:.3f}, {SPLITS} random halves): {verdict}; ECE {_f(c.before['ece'])} -> "
                         f"{_f(c.after['ece'])}, Brier {_f(c.before['brier'])} -> {_f(c.after['brier'])}")
    elif result.labels is None:
        lines += ["", "no labels (--labels FILE): no accuracy, Brier, ECE nor temperatures"]
    return "\n".join(lines)
