"""A newcomer's first hour, from the outside: every command run as a user runs it (a subprocess), each
failure a message with a fix that works as printed, the demo's answers marked as random, and nothing
but the server's own lines in its output."""

from __future__ import annotations

import json
import os
import re
import shlex
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from email.message import Message
from pathlib import Path

import pytest
from clef_bridge.bridge.demo.builtins import make_demo

from benchmarks.bench_head import OPTIONS, schema_layout

from .randomhead import schema_tokens
from .test_server_clients import _free_port

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parent.parent
CLI = [sys.executable, "-m", "clef_bridge.tools.cli"]


def cli(*argv: str, cwd: Path, env: dict[str, str] | None = None, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run([*CLI, *argv], cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)


def benchmarks(*argv: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "benchmarks", *argv], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=120)


@pytest.mark.parametrize("prepare", [False, True])
def test_gpu_check_without_a_gpu_refuses_before_writing_anything(tmp_path, prepare):
    """Without a CUDA device the full check would write ~16 GB of random models and time the CPU for hours."""
    env = dict(os.environ, CUDA_VISIBLE_DEVICES="")  # no GPU, even on a machine that has one
    done = benchmarks("gpu-check", "--vocab", str(tmp_path / "vocab.gguf"), "--folder", str(tmp_path / "models"),
                      *(["--prepare"] if prepare else []), env=env)
    assert done.returncode == 2, done.stderr
    assert "CUDA" in done.stderr and "gpu-check --smoke" in done.stderr and "Traceback" not in done.stderr
    assert not (tmp_path / "models").exists()


def test_bench_head_with_too_few_tokens_says_how_many_it_needs():
    need = schema_tokens(OPTIONS)
    done = benchmarks("bench-head", "--tokens", str(need - 1), "--repeats", "1")
    assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr
    assert f"--tokens {need - 1} cannot hold the router schema" in done.stderr and f"--tokens {need} or more" in \
        done.stderr
    assert schema_layout(need, None)[1] == need  # the fix works: that many tokens hold it


def test_a_reader_that_goes_away_ends_the_command_quietly(tmp_path):
    """`clef-bridge ... | head`: the pipe closes before the command prints."""
    proc = subprocess.Popen([*CLI, "fit", "--arch", "clef-flash", "--vram", "16GiB"], cwd=tmp_path,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    proc.stdout.close()
    err = proc.stderr.read()
    assert proc.wait(60) == 141 and err == ""  # as a command stopped by SIGPIPE, with nothing on stderr


@pytest.fixture(scope="module")
def files(tmp_path_factory) -> Path:
    """The demo's files, a clef GGUF joined from them, and a headless copy of its backbone."""
    folder = tmp_path_factory.mktemp("first-hour")
    make_demo(folder / "demo")
    done = cli("join", "demo/demo.gguf", "demo/joint_head.safetensors", "-o", "demo.clef.gguf", cwd=folder)
    assert done.returncode == 0, done.stderr
    (folder / "headless").mkdir()
    (folder / "headless" / "backbone.gguf").write_bytes((folder / "demo" / "demo.gguf").read_bytes())
    return folder


def test_the_pairing_hint_runs_from_anywhere(files, tmp_path):
    """check's pair.no_record fix, pasted as printed into a shell that stands somewhere else, writes the record."""
    done = cli("check", "demo/demo.gguf", cwd=files)
    assert done.returncode == 0, done.stdout + done.stderr
    [hint] = re.findall(r"`(clef-bridge pair [^`]+)`", done.stdout)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    paired = cli(*shlex.split(hint)[1:], cwd=elsewhere)
    assert paired.returncode == 0, (hint, paired.stderr)
    assert (files / "demo" / "demo.pair.json").is_file()
    (files / "demo" / "demo.pair.json").unlink()  # the other tests see the files as they were


def test_a_clef_ggufs_head_reads_embedded(files):
    done = cli("check", "demo.clef.gguf", cwd=files)
    first = done.stdout.splitlines()[0]
    assert done.returncode == 0 and first.endswith("demo.clef.gguf + (embedded head): ACCEPTED"), done.stdout
    assert first.count("demo.clef.gguf") == 1  # not "demo.clef.gguf + demo.clef.gguf"


def test_the_headless_hint_names_what_each_command_takes(files):
    (files / "headless" / "models.toml").write_text('[models.h]\ngguf = "backbone.gguf"\n')
    served = cli("serve", "--models", "headless/models.toml", "--port", str(_free_port()), cwd=files)
    assert served.returncode == 1 and "pair.headless" in served.stderr, served.stderr
    assert 'head = "PATH"' in served.stderr and "pass --head" not in served.stderr  # serve has no --head
    checked = cli("check", "headless/backbone.gguf", cwd=files)
    assert checked.returncode == 1 and "--head PATH" in checked.stdout, checked.stdout


def test_a_misspelt_key_gets_a_near_miss_and_the_list(files):
    (files / "typo.toml").write_text('defualt = "demo"\n[models.demo]\nbuiltin = "demo"\nmax_lenght = 4096\n')
    done = cli("check", "--models", "typo.toml", cwd=files)
    assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr
    assert "models.demo.max_lenght: unknown key; did you mean max_length? known keys: " in done.stderr
    assert "n_ctx" in done.stderr  # the valid keys are still listed
    assert "defualt: unknown top-level key; did you mean default?" in done.stderr


def test_serve_flags_for_ray_alone_are_refused_without_it(files):
    done = cli("serve", "--ray-dashboard", cwd=files)
    assert done.returncode == 2 and "--ray" in done.stderr, done.stderr
    done = cli("serve", "--ray", "--ray-dashboard", "--ray-address", "192.0.2.1:6379", cwd=files)
    assert done.returncode == 2 and "its dashboard" in done.stderr and "Traceback" not in done.stderr, done.stderr


@pytest.fixture(scope="module")
def server(files, tmp_path_factory):
    """`serve` on the built-in demo, written on first use (after the server's logging is set up), and on the
    clef GGUF; the output so far and the port."""
    work = tmp_path_factory.mktemp("served")
    (work / "models.toml").write_text(f'default = "demo"\n[models.demo]\nbuiltin = "demo"\n'
                                      f'[models.c]\ngguf = "{files / "demo.clef.gguf"}"\n')
    port = _free_port()
    log = work / "serve.log"
    env = dict(os.environ, CLEF_BRIDGE_CACHE=str(work / "cache"))  # a fresh cache: the demo is written in serve
    with log.open("w") as out:
        proc = subprocess.Popen([*CLI, "serve", "--port", str(port)], cwd=work, env=env, stdout=out,
                                stderr=subprocess.STDOUT)
    try:
        deadline = time.time() + 180
        while "clef-bridge serving on" not in log.read_text():
            assert proc.poll() is None and time.time() < deadline, log.read_text()
            time.sleep(0.5)
        yield port, log
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(60)


def post(port: int, path: str, body: dict) -> tuple[int, Message, dict]:
    """Status, headers (looked up in any case) and JSON body of a POST."""
    call = urllib.request.Request(f"http://127.0.0.1:{port}{path}", data=json.dumps(body).encode(),
                                  headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(call, timeout=120) as reply:
            return reply.status, reply.headers, json.load(reply)
    except urllib.error.HTTPError as exc:
        return exc.code, exc.headers, json.load(exc)


def test_serve_prints_only_its_own_lines(server):
    _, log = server
    text = log.read_text()
    assert "DEMO MODEL: RANDOM weights" in text
    assert "Little Endian" not in text and "Writing the following files" not in text, text  # gguf-py's own
    assert "beside the GGUF" not in text and "head  embedded in the GGUF" in text, text  # model c's head


def ask(model: str) -> dict:
    return {"model": model, "state": "I was charged twice.", "questions": {"q": {"type": "noul"}}}


@pytest.mark.parametrize("model", ["clef-flash", "clef", "jev-latest", "demo"])
@pytest.mark.parametrize("route", ["systemone", "workers_ai"])
def test_every_demo_answer_says_it_is_random(server, model, route):
    port, _ = server
    path = "/v1/systemone" if route == "systemone" else f"/accounts/a/ai/run/@cf/cloudflare/{model}"
    status, headers, body = post(port, path, ask(model))
    response = body if route == "systemone" else body["result"]
    assert status == 200 and response["answers"]["q"]["type"] == "noul"
    assert headers.get("X-Clef-Demo") == "random-weights"
    assert [w for w in response["x_warnings"] if "RANDOM weights" in w], response


def test_a_real_models_answer_carries_no_demo_mark(server):
    status, headers, body = post(server[0], "/v1/systemone", ask("c"))
    assert status == 200 and "X-Clef-Demo" not in headers and "x_warnings" not in body


def test_a_misspelt_model_name_gets_a_near_miss_and_the_list(server):
    status, _, body = post(server[0], "/v1/systemone", ask("clef-flsh"))
    message = body["detail"]["message"]
    assert status == 404 and "did you mean clef-flash?" in message and "served: demo, " in message, body
