"""Shadow models (issue 53 item 2): `shadow = [...]` on a served model has each named model score every answered
request after its answer is sent, at the lowest priority, dropped first under load; the decision log holds both
answers per question with their agreement and |dp|, /metrics the agreement per model pair. Here the shadow is a
head-only fine-tune over the same GGUF (the tiny model with another head), scored from the request's own hidden
states (one head pass, no prefill); an adapter fine-tune (LoRA) shadow prefills the request itself."""

from __future__ import annotations

import json
import time
from collections import deque
from types import SimpleNamespace

import numpy as np
import pytest
from clef_bridge.bridge.config.registry import RegistryError, load_registry
from clef_bridge.bridge.model.clef_model import CachedRows, HiddenStates
from clef_bridge.bridge.model.worker import FairQueue, Handoff, RequestOptions
from clef_bridge.bridge.server.appstate import DECISION_LOG, SERVED
from clef_bridge.bridge.server.decision_log import read_log
from clef_bridge.head.answer import ChoiceAnswer, NoulAnswer, agreement, softmax64

from . import fixturegen_lora
from .serverkit import RunningServer, wait_until

QUESTIONS = {"refund": {"type": "noul", "instructions": "Does the customer ask for a refund?"},
             "team": {"type": "choice", "instructions": "Which team?", "criteria": {"billing": "money", "tech": "bugs"}},
             "anger": {"type": "score", "instructions": "How angry?", "criteria": ["calm", "cross", "furious"]}}


def job(tenant: str = "", shadow: bool = False) -> SimpleNamespace:
    return SimpleNamespace(options=RequestOptions(tenant=tenant, shadow=shadow))


@pytest.mark.unit
def test_shadow_jobs_are_taken_only_when_nothing_else_waits_and_never_beside_a_request():
    lane = FairQueue()
    first, second, primary = job(shadow=True), job(shadow=True), job("alice")
    for j in (first, second, primary):
        lane.append(j)
    assert len(lane) == 1 and list(lane.shadows) == [first, second]  # admission counts the requests alone
    assert lane.take(4) == [primary]
    assert lane.take(1) == [first] and lane.take(4) == [second] and lane.take(4) == []
    lane.append(third := job(shadow=True))
    lane.remove(third)
    assert not lane.shadows and lane.clear() == []


@pytest.mark.unit
def test_agreement_compares_the_top_answers_and_the_largest_probability_gap():
    assert agreement(NoulAnswer("q", 0.7), NoulAnswer("q", 0.55)) == (True, 0.15)
    assert agreement(NoulAnswer("q", 0.7), NoulAnswer("q", 0.4)) == (False, 0.3)
    a = ChoiceAnswer("c", "x", 0.6, (("x", 0.6), ("y", 0.4)))
    b = ChoiceAnswer("c", "y", 0.9, (("x", 0.1), ("y", 0.9)))
    assert agreement(a, b) == (False, 0.5)


@pytest.mark.unit
def test_a_head_only_shadows_inputs_hold_every_row_once_and_ride_along_uncompared():
    memory, hidden = np.zeros((3, 2), np.float32), np.ones((3, 5), np.float32)
    assert CachedRows(memory, hidden).nbytes == memory.nbytes + hidden.nbytes  # what the cache's max_mb counts
    pieces = (np.full((2, 4), 1.0, np.float32), np.full((3, 4), 2.0, np.float32))
    whole = HiddenStates(None, pieces).prefilled()
    assert whole.hidden.shape == (5, 4) and whole.reused == 0 and not whole.prefix_memory and whole.ticket == 0
    np.testing.assert_array_equal(whole.hidden[:, 0], [1, 1, 2, 2, 2])
    assert RequestOptions(handoff=Handoff()) == RequestOptions() and Handoff().states is None


def _registry(tmp_path, lfx, shadow: str, extra: str = "") -> object:
    base = lfx.base
    toml = tmp_path / "models.toml"
    toml.write_text(f"""default = "tiny"
[server]
decision_log = "{tmp_path / 'decisions.jsonl'}"
request_timeout_s = 600
[models.tiny]
gguf = "{base.gguf_f32}"
head = "{base.head}"
n_ctx = 4096
max_length = 4096
shadow = [{shadow}]
[models.plain]
gguf = "{base.gguf_f32}"
head = "{base.head}"
n_ctx = 4096
max_length = 4096
[models.claims-head]
gguf = "{base.gguf_f32}"
head = "{lfx.head('claims')}"
n_ctx = 4096
max_length = 4096
{extra}""")
    return load_registry(toml)


@pytest.mark.unit
def test_a_shadow_names_another_served_model(tmp_path):
    toml = tmp_path / "models.toml"
    toml.write_text('[models.a]\ngguf = "a.gguf"\nshadow = ["a", "nope"]\n[models.b]\ngguf = "b.gguf"\n')
    with pytest.raises(RegistryError) as refused:
        load_registry(toml)
    assert "models.a.shadow: a is the model itself" in str(refused.value)
    assert "models.a.shadow: nope is not one of the models" in str(refused.value) and ": b" in str(refused.value)


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    lfx = fixturegen_lora.build()
    folder = tmp_path_factory.mktemp("shadows")
    with RunningServer(_registry(folder, lfx, '"claims-head"')) as srv:
        yield srv, folder / "decisions.jsonl"


@pytest.fixture
def entries(server, monkeypatch) -> list:
    """Each decision-log entry as decide() hands it over: the Decisions whole, their unrounded logits included."""
    writer, seen = server[0].app[DECISION_LOG], []
    submit = writer.submit
    monkeypatch.setattr(writer, "submit", lambda entry: (seen.append(entry), submit(entry)))
    return seen


def _lines(path, n: int, timeout: float = 120) -> list[dict]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        lines = list(read_log(path)) if path.exists() else []
        if len(lines) >= n:
            return lines
        time.sleep(0.1)
    raise AssertionError(f"{len(lines)} of {n} decision-log lines after {timeout} s")


@pytest.mark.integration
def test_a_head_shadows_logged_answers_are_the_fine_tunes_own_and_the_primary_is_untouched(server):
    srv, log_path = server
    states = [f"Ticket {i}: I was charged twice for invoice {1000 + i}, please refund one." for i in range(3)]
    primary = []
    for i, state in enumerate(states):  # one at a time: a shadow gives way to any request waiting, even the next one
        reply = srv.post({"model": "tiny", "state": state, "questions": QUESTIONS})
        assert reply.status == 200, reply.body[:300]
        primary.append(reply.json())
        _lines(log_path, i + 1)  # its line is written once its shadow has answered
    lines = [line for line in _lines(log_path, 3) if line["model"] == "tiny"]
    assert len(lines) == 3 and all(line["shadows"][0]["outcome"] == "answered" for line in lines)
    for state, answered, line in zip(states, primary, lines):
        direct = srv.post({"model": "claims-head", "state": state, "questions": QUESTIONS}).json()["answers"]
        plain = srv.post({"model": "plain", "state": state, "questions": QUESTIONS}).json()["answers"]
        assert answered["answers"] == plain  # the same model without a shadow answers the same
        [shadow] = line["shadows"]
        assert shadow["model"] == "claims-head"
        for question in shadow["questions"]:
            want = {k: v for k, v in direct[question["id"]].items() if k not in ("type", "legend")}
            assert question["answer"] == want  # the fine-tune served directly, to the 4 decimals answers carry
            mine = answered["answers"][question["id"]]
            gap = abs(mine["noul"] - want["noul"]) if "noul" in want else max(
                abs(mine["probabilities"][k] - p) for k, p in want["probabilities"].items())
            assert question["max_abs_dp"] == pytest.approx(gap, abs=2e-4)
    assert srv.metric("clef_shadow_questions_total", model="tiny", shadow="claims-head") == 3 * len(QUESTIONS)
    agreed = sum(q["agrees"] for line in lines for q in line["shadows"][0]["questions"])
    assert srv.metric("clef_shadow_questions_total", model="tiny", shadow="claims-head", agree="yes") == agreed
    assert srv.metric("clef_shadow_scorings_total", model="tiny", shadow="claims-head", outcome="answered") == 3


@pytest.mark.integration
def test_shadows_are_dropped_first_under_load(server):
    """A burst larger than a take: the shadow scorings that would wait behind requests are dropped and counted, and
    every request is answered."""
    import concurrent.futures

    srv, log_path = server
    before = len(list(read_log(log_path)))
    bodies = [{"model": "tiny", "state": f"burst {i}: " + "my parcel is late " * 40, "questions": QUESTIONS}
              for i in range(12)]
    with concurrent.futures.ThreadPoolExecutor(12) as pool:
        statuses = [r.status for r in pool.map(srv.post, bodies)]
    assert statuses == [200] * 12
    lines = _lines(log_path, before + 12)[before:]
    outcomes = deque(s["outcome"] for line in lines if line["model"] == "tiny" for s in line["shadows"])
    assert len(outcomes) == 12 and "dropped" in outcomes, outcomes
    assert srv.metric("clef_shadow_scorings_total", model="tiny", outcome="dropped") == outcomes.count("dropped")
    assert json.dumps(lines)  # every line whole


@pytest.mark.integration
def test_the_shadow_benchmark_serves_the_same_model_with_and_without_a_shadow(tmp_path):
    from benchmarks.__main__ import build_parser
    from benchmarks.shadows import _registry

    registry = _registry(tmp_path)
    assert registry.models["shadowed"].shadow == ("candidate",) and registry.models["plain"].shadow == ()
    assert registry.models["shadowed"].head_path == registry.models["plain"].head_path != \
        registry.models["candidate"].head_path
    args = build_parser().parse_args(["shadows", "--concurrency", "4", "--json"])
    assert (args.concurrency, args.requests, args.rounds, args.json) == (4, 24, 3, True)


def _probabilities(decision) -> list[np.ndarray]:
    return [softmax64(z) for _, z in decision.logits]


def _decide_one(srv, entries: list, model: str, state: str) -> tuple[dict, object]:
    """One request's answer and its decision-log entry (its shadows' scorings done: the entry comes after them)."""
    before = len(entries)
    reply = srv.post({"model": model, "state": state, "questions": QUESTIONS})
    assert reply.status == 200, reply.body[:300]
    wait_until(lambda: len(entries) > before, f"{model}'s decision-log entry", timeout=120)
    [entry] = entries[before:]
    return reply.json(), entry


@pytest.mark.integration
def test_a_head_only_shadow_reads_the_requests_own_hidden_states_cached_prefix_included_and_prefills_nothing(
        server, entries):
    """A miss, the same state again and the state grown at its end (both restore a prefix from the cache, whose
    payloads carry the hidden states): the shadow's answers are the fine-tune's served directly (1e-5), the backbone
    decodes the primary's new tokens only, and the primary answers as the same model without a shadow."""
    srv, log_path = server
    base = "My parcel was due on Monday and never came; the courier swears it was delivered to my door. " * 10
    states = [base, base, base + "I want my money back today."]
    assert srv.app[SERVED]["tiny"].head_shadows == {"claims-head"} and not srv.app[SERVED]["plain"].head_shadows
    cache = srv.app[SERVED]["tiny"].worker.model.backbone.prefix_cache  # one cache: the backbone is shared
    runs, decoded = srv.metric("clef_backbone_runs_total", model="claims-head"), cache.stats().tokens_prefilled
    primary = [_decide_one(srv, entries, "tiny", state) for state in states]
    reused = [answered["x_timings"]["reused_tokens"] for answered, _ in primary]
    assert reused[0] == 0 and min(reused[1:]) > 0, reused
    assert cache.stats().tokens_prefilled - decoded == sum(
        answered["usage"]["input_tokens"] - answered["x_timings"]["reused_tokens"] for answered, _ in primary)
    assert srv.metric("clef_backbone_runs_total", model="claims-head") == runs  # no llama_decode of its own
    lines = {line["request_id"]: line for line in read_log(log_path)}
    for state, (answered, entry) in zip(states, primary):
        [shadow] = entry.shadows
        assert shadow.model == "claims-head" and shadow.outcome == "answered"
        direct_answers, direct = _decide_one(srv, entries, "claims-head", state)
        for got, want in zip(_probabilities(shadow.decision), _probabilities(direct.decision), strict=True):
            np.testing.assert_allclose(got, want, rtol=0, atol=1e-5)
        [logged] = lines[entry.request_id]["shadows"]
        for question in logged["questions"]:  # the line holds them as answers carry them, to 4 decimals
            want = direct_answers["answers"][question["id"]]
            got = question["answer"]
            pairs = [(got["noul"], want["noul"])] if "noul" in want else [
                (got["probabilities"][k], p) for k, p in want["probabilities"].items()]
            assert max(abs(a - b) for a, b in pairs) <= 1e-4 + 1e-9, (got, want)
        plain, _ = _decide_one(srv, entries, "plain", state)  # the same sequence of states: the same cache hits
        assert answered["answers"] == plain["answers"]  # the primary's answers are the model's without a shadow


@pytest.mark.integration
def test_an_adapter_shadow_prefills_the_request_itself_and_a_head_only_one_does_not(tmp_path):
    """A model with both kinds of shadow: the head-only one answers from the request's hidden states, the LoRA one
    (another adapter: other hidden states) with its own prefill at the lowest priority; the line keeps their order."""
    lfx = fixturegen_lora.build()
    lora = (f'[models.claims-lora]\ngguf = "{lfx.base.gguf_f32}"\nhead = "{lfx.head("claims")}"\n'
            f'lora = "{lfx.adapter("claims")}"\nn_ctx = 4096\nmax_length = 4096\n')
    with RunningServer(_registry(tmp_path, lfx, '"claims-lora", "claims-head"', lora)) as srv:
        assert srv.app[SERVED]["tiny"].head_shadows == {"claims-head"}
        reply = srv.post({"model": "tiny", "state": "Refund my second charge, please.", "questions": QUESTIONS})
        assert reply.status == 200, reply.body[:300]
        [line] = _lines(tmp_path / "decisions.jsonl", 1)
        assert [(s["model"], s["outcome"]) for s in line["shadows"]] == [("claims-lora", "answered"),
                                                                         ("claims-head", "answered")]
        assert srv.metric("clef_backbone_runs_total", model="claims-lora") == 1
        assert srv.metric("clef_backbone_runs_total", model="claims-head") == 0
        direct = srv.post({"model": "claims-lora", "state": "Refund my second charge, please.",
                           "questions": QUESTIONS}).json()["answers"]
        for question in line["shadows"][0]["questions"]:
            want = {k: v for k, v in direct[question["id"]].items() if k not in ("type", "legend")}
            assert question["answer"] == want  # the same adapter and head served directly, the same prefill


@pytest.mark.integration
def test_a_device_heads_cache_keeps_the_hidden_states_on_the_host_and_they_rebuild_the_whole_prompt(fx):
    """The GPU path on the CuPy stand-in: a hit's kept hidden states are host arrays (the cache's budget is host
    memory), the prefix's are the first decode's own rows, and a head pass over the whole prompt rebuilt from them
    answers as the cached path does."""
    from .deciding import prepare
    from .test_gpu_path import open_on_device

    model, xp = open_on_device(fx)  # the prefix cache on, as by default
    try:
        model.keep_hidden_states()
        body = {"model": "tiny", "state": "The courier left my parcel in the rain and it is ruined. " * 12,
                "questions": QUESTIONS}
        [first] = model.prefill_batch([prepare(model, body)])
        model.head_input(first)  # its checkpoints get their payloads: memory rows and hidden states
        [second] = model.prefill_batch([prepare(model, body)])
        assert second.reused > 0 and all(type(h) is np.ndarray for h in second.prefix_hidden)
        whole = model.hidden_states(second).prefilled()
        np.testing.assert_array_equal(whole.hidden[:second.reused], first.hidden[:second.reused])
        np.testing.assert_array_equal(whole.hidden[second.reused:], second.hidden)
        [cached] = model.score([model.head_input(second)])
        [rebuilt] = model.score([model.head_input(whole)])
        for (_, got), (_, want) in zip(rebuilt.logits, cached.logits, strict=True):
            np.testing.assert_allclose(got, want, rtol=0, atol=1e-5)
    finally:
        model.close()
