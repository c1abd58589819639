"""The decision log (issue 53 item 1), through the real server over a real socket: 40 concurrent requests on two
keys are 40 lines, each request once, by the key's name and never the key, the state by its sha256 and its text only
with decision_log_states; the batch route writes one line per state; a full disk (/dev/full) or a path that cannot be
a file costs a metric and one warning while every request is answered; rotation keeps decision_log_keep whole files;
a line a crash tore is never read back, and the next open cuts it off; a full queue drops lines, counted; media are
logged by digest and size only; two processes share one log and its rotation."""

from __future__ import annotations

import asyncio
import base64
import errno
import hashlib
import io
import logging
import os
import subprocess
import sys
from pathlib import Path

import aiohttp
import orjson
import pytest
from clef_bridge.bridge.config.registry import DECISION_LOG_NAME, DecisionLogSpec, RegistryError, parse_registry
from clef_bridge.bridge.media.request import extract
from clef_bridge.bridge.server import decision_log
from clef_bridge.bridge.server.app import banner
from clef_bridge.bridge.server.decision_log import DecisionLog, Entry, LogFile, log_files, read_log
from clef_bridge.bridge.server.prometheus import create_metrics
from clef_bridge.bridge.service.decision import Decision, media_digests
from clef_bridge.head.answer import NoulAnswer
from clef_bridge.head.schema import render
from PIL import Image

from .conftest import tiny_spec
from .serverkit import RunningServer, registry_for, wait_until

pytestmark = pytest.mark.integration

ALICE, BOB, PROM = "key-alice-0123456789", "key-bob-9876543210", "key-prometheus-55"
QUESTIONS = {"urgent": {"type": "noul", "instructions": "Is it urgent?"},
             "team": {"type": "choice", "instructions": "Which team?", "criteria": {"tech": "", "billing": ""}},
             "mood": {"type": "score", "instructions": "How upset?", "criteria": ["calm", "annoyed", "angry"]}}


def sha256(state) -> str:
    return hashlib.sha256(render(state).encode()).hexdigest()


def lines_of(path: Path) -> list[dict]:
    return [record for f in log_files(path) for record in read_log(f)]


def auth(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


def warnings_of(server: RunningServer) -> list[logging.LogRecord]:
    return [r for r in list(server.tap.records)
            if r.name == "clef_bridge.decision_log" and r.levelno >= logging.WARNING]


@pytest.fixture(scope="module")
def logged(fx, tmp_path_factory):
    """A server with two tenants and a decision log in a folder, its states left out (the default)."""
    folder = tmp_path_factory.mktemp("decision-log")
    (folder / "keys.txt").write_text(f"{ALICE} name=alice\n{BOB} name=bob\n{PROM} name=prometheus scope=metrics\n")
    (folder / "logs").mkdir()
    # 40 requests at once on 2 busy cores: batched (4 prompts of about 290 tokens a decode), and never timed out
    registry = registry_for(tiny_spec(fx, n_seq_max=4, n_ubatch=2048), folder / "models.toml",
                            api_keys_file=folder / "keys.txt", request_timeout_s=600,
                            decision_log=DecisionLogSpec(folder / "logs"))
    with RunningServer(registry, api_key=PROM) as srv:
        yield srv


@pytest.fixture
def log_path(logged) -> Path:
    """The logged server's file: decisions.jsonl in the folder its models.toml names."""
    return logged.registry.server.decision_log.path / DECISION_LOG_NAME


async def burst(server: RunningServer, asks: list[tuple[str, str]]) -> list[tuple[str, dict]]:
    """Every (key, state) posted at once: each answer's request id and body."""
    async with aiohttp.ClientSession() as session:
        async def one(key: str, state: str) -> tuple[str, dict]:
            body = {"model": "tiny", "state": state, "questions": QUESTIONS}
            async with session.post(server.url + "/v1/systemone", json=body, headers=auth(key)) as r:
                assert r.status == 200, await r.text()
                return r.headers["x-request-id"], await r.json()
        return await asyncio.gather(*(one(k, s) for k, s in asks))


def test_every_answered_request_is_logged_once_by_its_tenants_name(logged, log_path):
    asks = [(ALICE if i % 2 else BOB, f"ticket {i}: the printer on floor {i} is jammed again") for i in range(40)]
    answers = asyncio.run(burst(logged, asks))
    ids = [rid for rid, _ in answers]
    assert len(set(ids)) == 40
    wait_until(lambda: len([r for r in lines_of(log_path) if r["request_id"] in ids]) >= 40, "40 lines")
    wait_until(lambda: logged.metric("clef_decision_log_lines_total") == len(lines_of(log_path)),
               "every line counted")
    records = {r["request_id"]: r for r in lines_of(log_path) if r["request_id"] in ids}
    assert len([r for r in lines_of(log_path) if r["request_id"] in ids]) == 40  # each request once
    text = log_path.read_text()
    assert ALICE not in text and BOB not in text and PROM not in text  # names, never keys
    for (key, state), (rid, answer) in zip(asks, answers):
        record = records[rid]
        assert record["tenant"] == ("alice" if key == ALICE else "bob")
        assert record["route"] == "/v1/systemone" and record["model"] == "tiny" and record["requested"] == "tiny"
        assert record["state_sha256"] == sha256(state) and record["state_bytes"] == len(state.encode())
        assert "state" not in record and state not in text  # the state's text only with decision_log_states
        assert record["media"] == [] and record["input_tokens"] == answer["usage"]["input_tokens"]
        assert {"queue", "tokenize", "backbone", "head"} <= set(record["timings_ms"])
        by_id = {q["id"]: q for q in record["questions"]}
        assert [q["id"] for q in record["questions"]] == list(QUESTIONS)
        assert by_id["urgent"]["type"] == "noul" and by_id["urgent"]["options"] == ["true", "false"]
        assert by_id["team"]["options"] == ["tech", "billing"] and by_id["mood"]["options"] == ["0", "1", "2"]
        for qid, got in answer["answers"].items():
            assert by_id[qid]["answer"] == {k: v for k, v in got.items() if k not in ("type", "legend")}
    assert logged.metric("clef_decision_log_errors_total") == 0
    assert logged.metric("clef_decision_log_dropped_total") == 0
    assert not warnings_of(logged)
    assert oct(log_path.stat().st_mode & 0o777) == "0o600"  # the tenants' decisions: private


def test_the_batch_route_writes_one_line_per_state(logged, log_path):
    states = ["the first state", {"ticket": 2, "text": "the second"}, ["a", "third"]]
    reply = logged.request("POST", "/v1/systemone/batch", {"model": "tiny", "states": states, "questions": QUESTIONS},
                           headers=auth(ALICE))
    assert reply.status == 200, reply.body[:300]
    rid = reply.headers["x-request-id"]
    wait_until(lambda: len([r for r in lines_of(log_path) if r["request_id"] == rid]) == 3, "3 lines")
    records = [r for r in lines_of(log_path) if r["request_id"] == rid]
    assert sorted(r["state_sha256"] for r in records) == sorted(sha256(s) for s in states)
    assert {r["route"] for r in records} == {"/v1/systemone/batch"} and {r["tenant"] for r in records} == {"alice"}


@pytest.mark.parametrize("where, reason", [("/dev/full", "ENOSPC"), ("under-a-file", "ENOTDIR")])
def test_a_log_that_cannot_be_written_costs_a_metric_and_one_warning_never_a_request(fx, tmp_path, where, reason):
    if where == "/dev/full" and not os.path.exists("/dev/full"):
        pytest.skip("no /dev/full here")
    if where == "/dev/full":
        path = Path("/dev/full")  # every write fails with ENOSPC, as on a full disk
    else:
        (tmp_path / "plain").write_text("a file, not a folder")
        path = tmp_path / "plain" / DECISION_LOG_NAME
    registry = registry_for(tiny_spec(fx), tmp_path / "models.toml", decision_log=DecisionLogSpec(path))
    with RunningServer(registry) as server:
        for i in range(5):
            reply = server.post({"model": "tiny", "state": f"state {i}", "questions": QUESTIONS})
            assert reply.status == 200, reply.body[:300]
        wait_until(lambda: server.metric("clef_decision_log_errors_total", reason=reason) == 5, f"5 {reason}")
        assert server.metric("clef_decision_log_lines_total") == 0
        warned = warnings_of(server)
        assert len(warned) == 1 and reason in warned[0].getMessage() and "serving goes on" in warned[0].getMessage()
        assert not server.tracebacks()
    if where == "/dev/full":  # a device is never rotated
        assert Path("/dev/full").is_char_device() and not Path("/dev/full.1").exists()


def test_rotation_keeps_n_whole_files_and_the_switch_logs_states(fx, tmp_path):
    path = tmp_path / "decisions.jsonl"
    registry = registry_for(tiny_spec(fx), tmp_path / "models.toml",
                            decision_log=DecisionLogSpec(path, max_mb=3000 / 2**20, keep=2, states=True))
    states = [f"state number {i} " + "padding " * 40 for i in range(24)]
    with RunningServer(registry) as server:
        for state in states:
            assert server.post({"model": "tiny", "state": state, "questions": QUESTIONS}).status == 200
        wait_until(lambda: server.metric("clef_decision_log_lines_total") == len(states), "every line written")
    files = log_files(path)
    assert files == [tmp_path / "decisions.jsonl.2", tmp_path / "decisions.jsonl.1", path]  # .3 never kept
    for f in files:
        raw = f.read_bytes()
        assert raw.endswith(b"\n") and len(raw) <= 3000
        assert all(orjson.loads(line) for line in raw.splitlines())  # every line whole
    records = lines_of(path)
    assert [r["state"] for r in records] == states[-len(records):]  # the newest ones, in order, none lost between
    assert all(r["state_sha256"] == sha256(r["state"]) for r in records)


def entry(i: int, state: str = "a state") -> Entry:
    decision = Decision("tiny", "tiny", (NoulAnswer("q", 0.25),), 10, {"queue": 0.001}, 0, 1, state=state)
    return Entry(1.7e9 + i, f"req-{i}", "/v1/systemone", "alice", decision)


def written(path: Path, entries: list[Entry], **spec) -> DecisionLog:
    writer = DecisionLog(DecisionLogSpec(path, **spec), path, create_metrics())
    writer.start()
    for e in entries:
        writer.submit(e)
    writer.close()
    return writer


def test_a_line_torn_by_a_crash_is_never_read_back_and_is_cut_off_on_reopening(tmp_path, caplog):
    path = tmp_path / "decisions.jsonl"
    written(path, [entry(i) for i in range(3)])
    whole = path.read_bytes()
    torn = orjson.dumps(decision_log.record(entry(3), False))[:57]  # the writer killed 57 bytes into a line
    path.write_bytes(whole + torn)
    assert [r["request_id"] for r in read_log(path)] == ["req-0", "req-1", "req-2"]
    with caplog.at_level(logging.WARNING, "clef_bridge.decision_log"):
        written(path, [entry(4)])
    assert path.read_bytes() == whole + orjson.dumps(decision_log.record(entry(4), False)) + b"\n"
    assert [r["request_id"] for r in read_log(path)] == ["req-0", "req-1", "req-2", "req-4"]
    assert any("torn last line (57 bytes)" in r.getMessage() for r in caplog.records)


def test_a_write_the_disk_fills_midway_leaves_no_partial_line(tmp_path, monkeypatch):
    path = tmp_path / "decisions.jsonl"
    written(path, [entry(0)])
    real_write, calls = os.write, []

    def half_then_full(fd: int, data) -> int:
        calls.append(len(data))
        if len(calls) == 1:
            return real_write(fd, bytes(data[:len(data) // 2]))
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(decision_log.os, "write", half_then_full)
    log_file = LogFile(DecisionLogSpec(path), path)
    with pytest.raises(OSError):
        log_file.append(orjson.dumps(decision_log.record(entry(1), False)) + b"\n")
    monkeypatch.undo()
    log_file.append(orjson.dumps(decision_log.record(entry(2), False)) + b"\n")
    log_file.close()
    raw = path.read_bytes()
    assert [orjson.loads(line)["request_id"] for line in raw.splitlines()] == ["req-0", "req-2"] and len(calls) == 2


def test_a_full_queue_drops_lines_counted_and_warned_once(tmp_path, caplog):
    metrics = create_metrics()
    writer = DecisionLog(DecisionLogSpec(tmp_path / "x.jsonl"), tmp_path / "x.jsonl", metrics, queue_lines=2)
    with caplog.at_level(logging.WARNING, "clef_bridge.decision_log"):
        for i in range(5):  # the thread not started: nothing drains the queue
            writer.submit(entry(i))
    assert metrics.log_dropped._value.get() == 3
    assert len([r for r in caplog.records if "dropped" in r.getMessage()]) == 1
    writer.start()
    writer.close()
    assert [r["request_id"] for r in read_log(tmp_path / "x.jsonl")] == ["req-0", "req-1"]


def test_models_toml_keys(tmp_path):
    models = {"demo": {"builtin": "demo"}}
    server = parse_registry({"models": models, "server": {"decision_log": "logs/", "decision_log_max_mb": 0.5,
                                                          "decision_log_keep": 0, "decision_log_states": True}},
                            tmp_path / "models.toml").server.decision_log
    assert server == DecisionLogSpec(tmp_path / "logs" / DECISION_LOG_NAME, 0.5, 0, True)
    assert parse_registry({"models": models, "server": {"decision_log": "d.jsonl"}},
                          tmp_path / "models.toml").server.decision_log.path == tmp_path / "d.jsonl"
    with pytest.raises(RegistryError, match="decision_log_max_mb: must be above 0"):
        parse_registry({"models": models, "server": {"decision_log": "x", "decision_log_max_mb": 0}},
                       tmp_path / "models.toml")


def test_media_are_logged_by_digest_and_size_never_themselves():
    image = io.BytesIO()
    Image.new("RGB", (8, 8), (200, 10, 10)).save(image, "PNG")
    png = image.getvalue()
    found = extract({"state": "look: [image 1]", "questions": QUESTIONS, "images": [base64.b64encode(png).decode()]})
    digests = media_digests(found.media)
    assert digests == (("image", hashlib.sha256(png).hexdigest(), len(png)),)
    decision = Decision("tiny", "tiny", (NoulAnswer("q", 0.5),), 10, {}, 0, 1, state=found.body["state"],
                        media=digests)
    line = orjson.dumps(decision_log.record(Entry(1.7e9, "r", "/v1/systemone", "alice", decision), True))
    assert orjson.loads(line)["media"] == [{"kind": "image", "sha256": hashlib.sha256(png).hexdigest(),
                                             "bytes": len(png)}]
    assert base64.b64encode(png) not in line and png not in line


WRITER = """
import sys
import time
from pathlib import Path
from clef_bridge.bridge.config.registry import DecisionLogSpec
from clef_bridge.bridge.server.decision_log import DecisionLog, Entry
from clef_bridge.bridge.server.prometheus import create_metrics
from clef_bridge.bridge.service.decision import Decision
from clef_bridge.head.answer import NoulAnswer

path, name, n = Path(sys.argv[1]), sys.argv[2], int(sys.argv[3])
writer = DecisionLog(DecisionLogSpec(path, max_mb=16 / 1024, keep=1000), path, create_metrics(), queue_lines=n)
writer.start()
(path.parent / f"ready-{name}").touch()
while not (path.parent / "go").exists():  # both at once: the test is their contention
    time.sleep(0.001)
for i in range(n):
    decision = Decision("tiny", "tiny", (NoulAnswer("q", 0.25),), 10, {}, 0, 1, state=f"{name} {i} " + "x" * 200)
    writer.submit(Entry(1.7e9, f"{name}-{i}", "/v1/systemone", name, decision))
writer.close(60)
"""


def test_two_processes_share_one_log_and_its_rotation(tmp_path):
    """Two writer processes (Ray replicas on one machine) on one path, rotating every 16 KB: each line is whole and
    there once (no rotation twice over, no line torn between them)."""
    path, n = tmp_path / "decisions.jsonl", 1000
    procs = [subprocess.Popen([sys.executable, "-c", WRITER, str(path), name, str(n)]) for name in ("a", "b")]
    wait_until(lambda: all((tmp_path / f"ready-{name}").exists() for name in "ab"), "both writers", timeout=120)
    (tmp_path / "go").touch()
    assert [p.wait(120) for p in procs] == [0, 0]
    files = log_files(path)
    assert len(files) > 20  # it rotated, many times
    raw = b"".join(f.read_bytes() for f in files)
    ids = [orjson.loads(line)["request_id"] for line in raw.splitlines()]  # every line parses: none torn
    assert sorted(ids) == sorted(f"{name}-{i}" for name in "ab" for i in range(n))
    assert any(x[0] != y[0] for x, y in zip(ids, ids[1:]))  # they wrote at once (they took 47 turns here)
    assert all(f.stat().st_size <= 16 * 1024 for f in files)


def test_the_banner_says_where_decisions_go(logged, log_path):
    lines = banner(logged.app, logged.url)
    assert f"  decision log {log_path.parent} (rotated at 64 MB, 5 kept; states by sha256 only)" in lines
