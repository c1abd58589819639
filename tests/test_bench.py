"""`clef-bridge bench` against a real server: the floor is the same token ids, alternated with requests."""

from __future__ import annotations

import json
import socket

import pytest
from clef_bridge.tools import bench
from clef_bridge.tools.cli import main

from .conftest import tiny_spec
from .deciding import prepare
from .serverkit import RunningServer, registry_for

pytestmark = pytest.mark.integration


def test_bench_measures_the_floor_on_the_same_tokens(fx, tmp_path, tiny_model):
    with RunningServer(registry_for(tiny_spec(fx), tmp_path / "m.toml")) as srv:
        outcome = bench.run(srv.url, [1, 2], 4, None, gguf=fx.gguf_f32, model="tiny")
    result = outcome.to_dict()
    assert outcome.ok
    assert [r["errors"] for r in result["runs"]] == [0, 0]
    ids = prepare(tiny_model, bench.router_request("tiny")).encoded.input_ids
    assert result["runs"][0]["input_tokens"] == len(ids) > 600  # the bare prefill's ids are these
    assert result["alternated_http_p50_ms"] > 0 and result["bare_prefill_ms"] > 0 and "http_over_bare_prefill" in result


def test_bench_fails_and_reports_no_floor_when_requests_fail(fx, tmp_path, capsys):
    with RunningServer(registry_for(tiny_spec(fx), tmp_path / "m.toml")) as srv:
        code = main(["bench", "--url", srv.url, "--concurrency", "1", "--requests", "2", "--gguf", str(fx.gguf_f32),
                     "--model", "nope", "--json"])
    result = json.loads(capsys.readouterr().out)
    assert code == 1
    assert result["runs"][0]["errors"] == 2
    [(cause, count)] = result["runs"][0]["error_causes"].items()
    assert count == 2 and cause.startswith("HTTP 404: model 'nope' is not served here")
    assert "http_over_bare_prefill" not in result


def test_bench_without_a_server_names_the_cause_and_the_url(capsys):
    with socket.socket() as s:  # a port nothing listens on once closed
        s.bind(("127.0.0.1", 0))
        url = f"http://127.0.0.1:{s.getsockname()[1]}"
    code = main(["bench", "--url", url, "--concurrency", "1", "--requests", "2"])
    printed = capsys.readouterr()
    assert code == 2 and printed.out == ""
    assert f"cannot connect to {url}: connection refused" in printed.err and "fix: start the server" in printed.err
