"""What the decision routes share: reading a body (JSON or multipart, capped), handing it to the decision
service with the request's context, and the answer's x_ extensions, timings and metrics (each door renders its
own shape of the Decision's answers)."""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import replace
from typing import Any, Collection

from aiohttp import hdrs, web

from ....head.answer import agreement
from ....head.errors import ClefError
from ...catalogue.releases import REAL_RELEASES, RELEASES
from ...media.request import KINDS
from ...model.clef_model import HiddenStates, Scored
from ...model.worker import Handoff, RequestOptions, ShadowDropped
from ...service.decision import INLINE_BYTES, Decision, DecisionInput
from ...service.systemone import Contract, parse_systemone
from ..appstate import DECISION_LOG, METRICS, REGISTRY, SERVED, SERVICE, SHADOW_TASKS
from ..assets import body_limit
from ..body import (
    TEXT_CAP,
    BodyTooLarge,
    check_content_type,
    decode,
    header,
    json_containers,
    media_type,
    parse_json,
    read_capped,
)
from ..auth import TENANT
from ..context import INFO, BodyTimeout
from ..decision_log import Entry, Shadow
from ..multipart import RequestBody, is_form, parse_body

log = logging.getLogger("clef_bridge.server")

# every answer of the built-in demo says what the banner says: its weights are random
DEMO_HEADER, DEMO_HEADER_VALUE = "X-Clef-Demo", "random-weights"
def demo_warning(builtin: str) -> str:
    """What every answer of a built-in demo, and its /v1/models entry, says (builtin: models.toml's value)."""
    return ("demo: the built-in demo model has RANDOM weights, its answers are meaningless; serve a real model "
            f"(`{RELEASES[REAL_RELEASES[builtin]].pull_command}` writes its models.toml entry)")


async def read_body(request: web.Request, cap: int | None = None, kinds: Collection[str] = KINDS) -> RequestBody:
    """The body: JSON, or multipart/form-data (a `request` part and media parts), capped for text and the media of
    `kinds` (the door's) that a served model takes, raw and decoded alike; cap: a route's own lower ceiling
    (Workers AI's 13 MiB)."""
    server = request.app[REGISTRY].server
    served = {kind for s in request.app[SERVED].values() for kind in s.worker.model.media} & set(kinds)
    limit = body_limit(server, served)
    why = TEXT_CAP if not served else (f"max_body_bytes {server.max_body_bytes} in models.toml [server], plus "
                                       f"{limit - server.max_body_bytes} for the {', '.join(sorted(served))} a request "
                                       "may carry, base64-inflated: max_image_bytes and the like")
    capped = cap is not None and cap < limit
    content_type = media_type(request) if request.body_exists else ""
    form = (header(request, hdrs.CONTENT_TYPE) or "") if is_form(content_type) else ""
    if not form:
        check_content_type(content_type)
    try:
        return await _read(request, cap if capped else limit, form, why)
    except BodyTooLarge:
        if not capped:
            raise
        raise BodyTooLarge(f"the request body exceeds {cap} bytes, the most Workers AI takes; POST /v1/systemone "
                           f"takes up to {limit} bytes here") from None


async def _read(request: web.Request, limit: int, form: str, why: str) -> RequestBody:
    server = request.app[REGISTRY].server
    try:  # a client trickling its body is cut off; it never reaches a worker
        raw = await asyncio.wait_for(read_capped(request, limit, why), server.body_timeout_s)
    except asyncio.TimeoutError:
        raise BodyTimeout(f"the request body did not arrive within {server.body_timeout_s:g} s "
                          "(body_timeout_s)") from None
    encoding = header(request, hdrs.CONTENT_ENCODING) or ""
    containers = json_containers(server.limits)
    if not form and len(raw) <= INLINE_BYTES and encoding in ("", "identity"):
        return RequestBody(parse_json(raw, containers), None, len(raw))
    return await asyncio.get_running_loop().run_in_executor(
        None, lambda: parse_body(decode(raw, encoding, limit, containers, why), form, containers))


async def systemone_input(request: web.Request, body: RequestBody, data: Any, model: Any,
                          options: RequestOptions = RequestOptions(), contract: Contract | None = None
                          ) -> DecisionInput:
    """A read body in System One's shape (its JSON replaced by data: a door's translation) parsed into the typed
    request the service takes."""
    parsed = await parse_systemone(data, model, request.app[REGISTRY].server, body.parts, body.json_bytes, contract)
    return DecisionInput(parsed.request, model, parsed.media, options)


def tenant_options(request: web.Request, options: RequestOptions) -> RequestOptions:
    """A request's options with its tenant: its queue, and unless share_caches_across_keys, its own partition of the
    prefix cache, the answer cache and coalescing, inside which a prompt_cache_key partitions further."""
    tenant = request[TENANT]
    shared = request.app[REGISTRY].server.share_caches_across_keys
    return replace(options, tenant=tenant.name,
                   partition=options.partition if shared else ("tenant", tenant.name, *options.partition))


async def decide(request: web.Request, call: DecisionInput) -> Decision:
    """The service's Decision, its model, tokens and timings in the request's context and metrics, its line queued
    for the decision log; the request's tenant decides with whom it shares caches and queues (tenant_options); its
    Handoff brings back its hidden states where its model's head-only shadows score from them."""
    call = replace(call, options=replace(tenant_options(request, call.options), handoff=Handoff()))
    info = request[INFO]

    def resolved(name: str) -> None:
        info.model = name

    decision = await request.app[SERVICE].decide(call, resolved)
    info.input_tokens, info.batch_size = decision.input_tokens, decision.batch_size
    info.timings = {f"{stage}_ms": round(seconds * 1e3, 3) for stage, seconds in decision.timings.items()}
    info.timings["reused_tokens"] = decision.reused_tokens  # prompt tokens restored from the prefix cache
    if decision.shared:  # cache_hit or coalesced: 1, the answer of an identical earlier or concurrent request
        info.timings[decision.shared] = 1
    metrics = request.app[METRICS]
    for stage, seconds in decision.timings.items():
        metrics.latency.labels(decision.model, stage).observe(seconds)
    metrics.tokens.labels(decision.model).inc(decision.input_tokens)
    entry = Entry(time.time(), info.id, info.route, request[TENANT].name, decision)
    spec = request.app[REGISTRY].models.get(decision.model)
    if spec is not None and spec.shadow:  # scored after this answer is sent; the line is written with them
        task = asyncio.get_running_loop().create_task(shadow(request.app, call, entry, spec.shadow))
        request.app[SHADOW_TASKS].add(task)
        task.add_done_callback(request.app[SHADOW_TASKS].discard)
    else:
        log_decision(request.app, entry)
    return decision


def log_decision(app: web.Application, entry: Entry) -> None:
    """Queued for the log's thread, where models.toml names a decision log: nothing here waits for the disk or fails
    with it."""
    writer = app.get(DECISION_LOG)
    if writer is not None:
        writer.submit(entry)


async def shadow(app: web.Application, call: DecisionInput, entry: Entry, names: tuple[str, ...]) -> None:
    """Each shadow model's scoring of an answered request, at the lowest priority (dropped while the server has
    requests under way), all of them in the request's decision-log line. A head-only fine-tune of the model
    (Served.head_shadows) scores from the request's own hidden states where its worker left them (the Handoff: not
    when the answer was another request's), one head pass; any other shadow prefills the request itself."""
    heads, handoff = app[SERVED][entry.decision.model].head_shadows, call.options.handoff
    states = handoff.states if handoff is not None else None
    call = replace(call, options=replace(call.options, shadow=True, reject_if_busy=False, handoff=None))
    done = {}
    for name in (n for n in names if n in heads and states is not None):
        done[name] = await _shadow(app, call, entry.decision, name, states)
    if handoff is not None:  # let go before any shadow's prefill, which may take long: they are the whole prompt's
        handoff.states = states = None
    for name in (n for n in names if n not in done):
        done[name] = await _shadow(app, call, entry.decision, name, None)
    log_decision(app, replace(entry, shadows=tuple(done[n] for n in names)))


async def _shadow(app: web.Application, call: DecisionInput, primary: Decision, name: str,
                  states: HiddenStates | None) -> Shadow:
    """One shadow's scoring (from states, the primary's hidden states, or with its own prefill: states None), its
    outcome counted and each question's agreement with the primary's answer on /metrics."""
    metrics = app[METRICS]
    try:
        if states is None:
            decision = await app[SERVICE].decide(replace(call, model=name))
        else:
            scored = await app[SERVICE].workers[name].score_hidden(states, call.options)
            decision = _head_decision(name, scored, primary)
    except ShadowDropped:
        result = Shadow(name, "dropped")
    except ClefError as exc:  # its own refusal (a prompt over its max_length, say): the primary's answer stands
        result = Shadow(name, f"failed: {exc.error_type}")
    except Exception:  # noqa: BLE001 - a bug of ours: logged, never raised into a task nobody awaits
        log.exception("shadow model %s failed on a request answered by %s", name, primary.model)
        result = Shadow(name, "failed: internal_error")
    else:
        mine = {a.id: a for a in primary.answers}
        compared = {a.id: agreement(mine[a.id], a) for a in decision.answers}
        result = Shadow(name, "answered", decision, compared)
        for agrees, _ in compared.values():
            metrics.shadow_questions.labels(primary.model, name, "yes" if agrees else "no").inc()
    metrics.shadows.labels(primary.model, name, result.outcome.split(":")[0]).inc()
    return result


def _head_decision(name: str, scored: Scored, primary: Decision) -> Decision:
    """A head-only shadow's answers as a Decision: the primary's input (its state, media and tokens, none of them
    prefilled again), the shadow's answers and head time."""
    return Decision(model=name, requested=name, answers=scored.answers, input_tokens=scored.input_tokens,
                    timings={"head": scored.timings.head}, reused_tokens=0, batch_size=scored.timings.batch_size,
                    logits=scored.logits, warnings=scored.warnings, state=primary.state, media=primary.media)


def extensions(request: web.Request, decision: Decision, start: float, warnings: list[str]
               ) -> tuple[dict[str, Any], dict[str, str]]:
    """The x_ extensions every door's answer carries (latency, timings, warnings), and its extra headers."""
    info = request[INFO]
    total_ms = round((time.perf_counter() - start) * 1e3, 3)
    info.timings["total_ms"] = total_ms
    request.app[METRICS].latency.labels(decision.model, "total").observe(total_ms / 1e3)
    out: dict[str, Any] = {"x_latency_ms": total_ms, "x_timings": dict(info.timings)}
    headers = {}
    warnings = [*decision.warnings, *warnings]
    builtin = request.app[SERVED][decision.model].spec.builtin
    if builtin:
        warnings = warnings + [demo_warning(builtin)]
        headers[DEMO_HEADER] = DEMO_HEADER_VALUE
    if warnings:
        out["x_warnings"] = warnings
    return out, headers
