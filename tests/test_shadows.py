"""Shadow models (issue 53 item 2): `shadow = [...]` on a served model has each named model score every answered
request after its answer is sent, at the lowest priority, dropped first under load; the decision log holds both
answers per question with their agreement and |dp|, /metrics the agreement per model pair. Here the shadow is a
head-only fine-tune over the same GGUF (the tiny model with another head)."""

from __future__ import annotations

import json
import time
from collections import deque
from types import SimpleNamespace

import pytest
from clef_bridge.bridge.config.registry import RegistryError, load_registry
from clef_bridge.bridge.model.worker import FairQueue, RequestOptions
from clef_bridge.bridge.server.decision_log import read_log
from clef_bridge.head.answer import ChoiceAnswer, NoulAnswer, agreement

from . import fixturegen_lora
from .serverkit import RunningServer

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


def _registry(tmp_path, lfx, shadow: str) -> object:
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
""")
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
