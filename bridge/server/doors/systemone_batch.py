"""laya-serve's batch route (POST /v1/systemone/batch; clausal-decide's laya_serve backend posts to it): one set of
questions over many states, the answers in `results` in the states' order. Each state is its own System One request
to the one decision service, all of them submitted at once, so the model's worker batches them into shared prefills
and the prefix cache shares what their prompts share."""

from __future__ import annotations

import asyncio
import time
from dataclasses import replace
from functools import cache
from typing import Any, Callable

from aiohttp import web

from ....head.declaration import Bound, Node, check, check_field, json_schema, node
from ....head.errors import ContextLengthExceeded, Problem, RequestInvalid
from ....head.schema import (
    MEDIA_FIELDS,
    STATE,
    DecisionRequest,
    Limits,
    check_depth,
    checked_state,
    is_unicode,
    parse_questions,
    questions_declaration,
    unpaired_surrogates,
)
from ...config.registry import ServerSpec
from ...media.request import UnsupportedMediaType
from ...service.decision import Decision, DecisionInput
from ..appstate import REGISTRY
from ..context import INFO, JEV_ERROR, Door, jev_error, json_response
from ..routes import BATCH_SHAPE, PATHS
from .decisions import decide, extensions, read_body
from .systemone import no_model_warning, systemone_body

# laya's controls that change its answers and that Clef has nothing like: refused by name rather than ignored
REFUSED = {
    "max_len": "Clef reads the whole state or refuses it (max_length in models.toml)",
    "head_max_len": "Clef's head reads every option's tokens",
    "lang": "Clef reads any language; there is no language checkpoint to pick",
    "lang_guess": "Clef reads any language; there is no language checkpoint to pick",
    "task": "Clef has one checkpoint per served model; name it in `model`",
    "min_confidence": "Clef flags no answer; compare each answer's confidence yourself",
}
# laya's controls that only shape its forward passes: the worker batches by its own token budget, answers unchanged
PASSES = ("batch_size", "sort_by_length")


@cache
def declaration(limits: Limits, max_states: int) -> Node:
    """The batch's body declared once: what parse_batch checks and /openapi.json publishes (each state is declared as
    System One's state, checked by checked_state; the questions are System One's)."""
    state = replace(STATE, description=f"at most {limits.max_state_bytes} bytes rendered (max_state_bytes)")
    return node("object", msg="the body must be a JSON object with states and questions",
                required=("states", "questions"), fields={
                    "model": node("string", "null", msg="model must be a non-empty string", nonblank=True),
                    "states": node("array", msg="states must be a non-empty array of states (strings, objects or "
                                   "arrays)", null_missing=True, nonempty=True, items=state, bound=Bound(
                                       max_states, "at most {most} states per batch (max_queue_per_key: a batch's "
                                       "states are queued one each), got {got}; split the batch", "too_many_states"),
                                   description="at most max_queue_per_key states; each is asked every question"),
                    "questions": replace(questions_declaration(limits),
                                         description="System One's questions, asked of every state"),
                    **{key: node("null", msg=f"the batch route takes no {key}: {why}",
                                 type_error="control_not_supported", description=f"refused: {why}")
                       for key, why in REFUSED.items()},
                    **{key: node(description="accepted; changes nothing (the worker batches by its own token "
                                             "budget)") for key in PASSES}})


def batch_problems(data: Any, max_states: int, limits: Limits = Limits()) -> list[Problem]:
    """What the batch body itself gets wrong (its shape, laya's refused controls, media)."""
    declared, problems = declaration(limits, max_states), []
    if not check(declared, data, ("body",), problems, deep=False):
        return problems
    check_field(declared, data, "states", ("body",), problems, deep=False)  # each state: checked_state
    for key in REFUSED:
        check_field(declared, data, key, ("body",), problems)
    problems += [Problem(("body", field), "the batch route takes text states only: send media to POST /v1/systemone",
                         error_type) for field, error_type in MEDIA_FIELDS.items() if data.get(field)]
    return problems


def parse_batch(data: Any, model: str, limits: Limits, max_states: int) -> list[DecisionRequest]:
    """The batch as one typed request per state, its questions validated once; every problem of the body (each
    state's at states[i]) in one RequestInvalid."""
    declared = declaration(limits, max_states)
    problems = batch_problems(data, max_states, limits)
    if problems:
        raise RequestInvalid(problems)
    check_depth(data, limits)
    states = data["states"]
    problems = unpaired_surrogates([(data["questions"], ("body", "questions"))] if "questions" in data else [])
    problems += unpaired_surrogates([(state, ("body", "states", i)) for i, state in enumerate(states)])
    named = declared.fields["model"]  # the handler has put the default in place of a null
    if check(named, model, ("body", "model"), problems) and (model is None or not is_unicode(model)):
        problems.append(Problem(("body", "model"), named.msg, "type_error"))
    texts = [checked_state(state, limits, problems, ("body", "states", i)) for i, state in enumerate(states)]
    questions = parse_questions(data.get("questions"), limits, problems)
    if problems:
        raise RequestInvalid(problems)
    return [DecisionRequest(model, state, questions, ("body", "states", i), text)
            for i, (state, text) in enumerate(zip(states, texts))]


def located(exc: BaseException, i: int) -> BaseException:
    """State i's refusal naming it where the model refused it (a prompt over max_length)."""
    if isinstance(exc, ContextLengthExceeded):
        return ContextLengthExceeded(exc.n_tokens, exc.limit, f"{exc.detail} (states[{i}])", exc.at_least)
    return exc


async def decide_each(request: web.Request, calls: list[DecisionInput]) -> list[Decision]:
    """Every call's Decision, decided together; on a refusal the others are withdrawn and the first state's refusal
    (in the states' order) answers the batch."""
    tasks = [asyncio.ensure_future(decide(request, call)) for call in calls]
    try:
        return list(await asyncio.gather(*tasks))
    except Exception:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        failed = [(i, task.exception()) for i, task in enumerate(tasks) if not task.cancelled() and task.exception()]
        if not failed:
            raise
        i, exc = failed[0]
        raise located(exc, i) from None


def result(decision: Decision) -> dict[str, Any]:
    """One state's System One answer with its own timings and its own warnings (a state's embedded media, say)."""
    timings = {**{f"{stage}_ms": round(s * 1e3, 3) for stage, s in decision.timings.items()},
               "reused_tokens": decision.reused_tokens}
    if decision.shared:
        timings[decision.shared] = 1
    warnings = {"x_warnings": list(decision.warnings)} if decision.warnings else {}
    return {**systemone_body(decision), "x_timings": timings, **warnings}


async def batch_handler(request: web.Request) -> web.Response:
    start = time.perf_counter()
    body = await read_body(request, kinds=())  # text only: its body is capped at max_body_bytes
    if body.parts is not None:
        raise UnsupportedMediaType("POST /v1/systemone/batch takes application/json: text states only")
    registry = request.app[REGISTRY]
    data, warnings = body.data, []
    model = data.get("model") if isinstance(data, dict) else None
    if model is None:  # as POST /v1/systemone: the default model, and a warning that says so
        model = registry.default
        warnings.append(no_model_warning(model))
    parsed = parse_batch(data, model, registry.server.limits, registry.server.tenant_queue)
    decisions = await decide_each(request, [DecisionInput(each, model) for each in parsed])
    info = request[INFO]  # each decide() wrote its own: the batch's are the sums, and each stage's longest
    info.input_tokens = sum(d.input_tokens for d in decisions)
    info.batch_size = max(d.batch_size for d in decisions)
    info.timings = {f"{stage}_ms": round(max(d.timings.get(stage, 0.0) for d in decisions) * 1e3, 3)
                    for stage in decisions[0].timings}
    info.timings["reused_tokens"] = sum(d.reused_tokens for d in decisions)
    results = [result(d) for d in decisions]
    batch = {"model": decisions[0].requested, "results": results,  # the name the body used, as each result says
             "total_usage": {"input_tokens": info.input_tokens, "output_tokens": 0}}
    # the batch's own warnings at the top (no model named, the demo's weights); each state's are in its result
    extra, headers = extensions(request, replace(decisions[0], warnings=()), start, warnings)
    return json_response({**batch, **extra}, headers=headers)


def openapi_paths(security: list[dict[str, Any]], errors: Callable[..., dict[str, Any]], server: ServerSpec
                  ) -> dict[str, Any]:
    """POST /v1/systemone/batch in /openapi.json: System One's questions over an array of states."""
    request = json_schema(declaration(server.limits, server.tenant_queue), {})
    ok = {"description": "each state's System One answer, in the states' order", "content": {"application/json": {
        "schema": {"type": "object", "required": ["model", "results", "total_usage"], "properties": {
            "model": {"type": "string"},
            "results": {"type": "array", "items": {"$ref": "#/components/schemas/SystemOneResponse"}},
            "total_usage": {"type": "object"}}}}}}
    return {PATHS["systemone_batch"]: {"post": {
        "operationId": "systemone_batch", "security": security,
        "requestBody": {"required": True, "content": {"application/json": {"schema": request}}},
        "responses": {"200": ok, **errors(400, 401, 404, 413, 415, 422, 429, 503)}}}}


DOOR = Door(BATCH_SHAPE, {"systemone_batch": batch_handler}, jev_error, JEV_ERROR, openapi_paths)
