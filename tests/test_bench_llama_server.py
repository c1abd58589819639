"""The pieces of `python -m benchmarks llama-server` that run without llama-server: its requests, the reading
of llama-server's answer shape, the report, its command line."""

from __future__ import annotations

import pytest

from benchmarks import render  # noqa: F401 - registers the text renderers
from benchmarks.__main__ import build_parser, main
from benchmarks.llama_server import CMAKE_FLAGS, SideBySide, answer_probabilities, distinct_request
from clef_bridge.tools.bench import router_request
from clef_bridge.tools.render import text

pytestmark = pytest.mark.unit


def test_requests_are_distinct_from_their_first_state_field_on():
    a, b = distinct_request(1, "bench"), distinct_request(2, "bench")
    assert a["questions"] == b["questions"] == router_request()["questions"]
    # the state renders with sorted keys: channel comes first, so two requests part right after "STATE:\n{"
    assert sorted(a["state"]) == ["channel", "message", "ticket"]
    assert a["state"]["channel"] != b["state"]["channel"] and a["state"]["message"] != b["state"]["message"]
    assert len(a["state"]["message"]) == len(router_request()["state"]["message"]) + len("Case 1. ")


def test_answers_of_llama_servers_shape_read_in_the_references_option_order():
    request = {"model": "m", "state": "s", "questions": {
        "q": {"type": "noul", "instructions": "?"},
        "c": {"type": "choice", "instructions": "?", "criteria": {"b": "B", "a": None}},
        "s": {"type": "score", "instructions": "?", "criteria": ["low", "mid", "high"]}}}
    # as server-decision.cpp writes them: noul p(true), choice and score probabilities by key (score: "0", "1", ...)
    answers = {"q": {"type": "noul", "noul": 0.25},
               "c": {"type": "choice", "choice": "a", "probabilities": {"a": 0.7, "b": 0.3}},
               "s": {"type": "score", "score": 1.1, "probabilities": {"0": 0.2, "1": 0.5, "2": 0.3}}}
    # the reference's prompt lists a choice's options sorted by key
    assert answer_probabilities(request, answers) == [[0.25, 0.75], [0.7, 0.3], [0.2, 0.5, 0.3]]


def test_the_report_names_both_servers_and_the_ratios():
    result = SideBySide("/x/llama-server", 0.0, "m.gguf", 744, 2, {"llama-server": 4000.0, "clef-bridge": 3200.0},
                        1.25, {"llama-server": 0.25, "clef-bridge": 0.5}, 2.0,
                        {"llama-server": 4e-3, "clef-bridge": 5e-5}, {"llama-server": 9, "clef-bridge": 10},
                        {"llama-server": ["400: instructions must be provided"], "clef-bridge": []})
    out = text(result)
    assert "llama-server / clef-bridge = 1.25" in out and "clef-bridge / llama-server = 2.00" in out
    assert "over 9 requests, 1 refused" in out and "llama-server refused: 400" in out
    assert result.to_dict()["requests_per_s"] == {"llama-server": 0.25, "clef-bridge": 0.5}


def test_the_command_line(tmp_path, capsys):
    args = build_parser().parse_args(["llama-server", "--llama-server", str(tmp_path / "bin"), "--pairs", "3"])
    assert args.binary == tmp_path / "bin" and args.pairs == 3 and args.concurrency == 8 and args.requests == 16
    assert main(["llama-server", "--llama-server", str(tmp_path / "missing")]) != 0
    assert "no such file" in capsys.readouterr().err
    assert "-DLLAMA_BUILD_SERVER=ON" in CMAKE_FLAGS and "-DCMAKE_BUILD_TYPE=Release" in CMAKE_FLAGS


def test_throughput_rounds_alternate_the_order_and_report_medians(monkeypatch):
    import benchmarks.llama_server as bench

    calls = []

    def fake(server, requests, concurrency, model, first):
        calls.append((server.name, first))
        return {"a": [1.0, 5.0, 2.0], "b": [3.0, 3.0, 9.0]}[server.name][sum(1 for n, _ in calls if n == server.name) - 1]

    monkeypatch.setattr(bench, "throughput", fake)
    servers = [bench.Server("a", "", None, None), bench.Server("b", "", None, None)]
    assert bench.alternated_throughput(servers, 3, 16, 8, "m") == {"a": 2.0, "b": 3.0}
    assert [n for n, _ in calls] == ["b", "a", "a", "b", "b", "a"]
    assert len({first for _, first in calls}) == 6  # every run's requests distinct from the others'
