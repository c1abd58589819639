"""Every command in README.md runs: the set-up commands keep their shape, and each block marked
`runnable` is executed against the demo server the first set-up command starts."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from .test_server_clients import _free_port, _wait_ready

ROOT = Path(__file__).resolve().parent.parent
FENCE = re.compile(r"^(?P<indent> *)```(?P<info>[^\n`]*)\n(?P<body>.*?)^(?P=indent)```", re.MULTILINE | re.DOTALL)


def blocks() -> list[tuple[str, set[str], str]]:
    out = []
    for m in FENCE.finditer((ROOT / "README.md").read_text(encoding="utf-8")):
        words = m.group("info").split()
        body = "\n".join(line[len(m.group("indent")):] for line in m.group("body").splitlines())
        out.append((words[0] if words else "", set(words[1:]), body))
    return out


def test_exactly_two_setup_commands():
    serve = [b for _, tags, b in blocks() if "setup-serve" in tags]
    tests = [b for _, tags, b in blocks() if "setup-test" in tags]
    assert len(serve) == 1 and len(tests) == 1
    assert serve[0].strip().endswith("&& clef-bridge serve") and "pip install ." in serve[0]
    assert tests[0].strip() == "sh tests/run.sh"
    ci = (ROOT / ".ci" / "run").read_text()
    assert "tests/run.sh" in ci


@pytest.fixture(scope="module")
def demo_server(tmp_path_factory):
    """The first set-up command's `clef-bridge serve`, run where there is no models.toml."""
    work = tmp_path_factory.mktemp("readme")
    port = _free_port()
    env = dict(os.environ, CLEF_BRIDGE_CACHE=str(work / "cache"))
    proc = subprocess.Popen([sys.executable, "-m", "clef_bridge.tools.cli", "serve", "--port", str(port)], cwd=work,
                            env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        _wait_ready(port, proc)
        yield work, port, env
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(60)


RUNNABLE = [(lang, body) for lang, tags, body in blocks() if "runnable" in tags]


def test_there_are_runnable_blocks():
    assert len(RUNNABLE) >= 5


def test_every_curl_in_a_runnable_block_fails_on_an_http_error():
    """curl exits 0 on a 4xx/5xx unless told otherwise; then the block would pass on an error answer."""
    curls = [line for _, body in RUNNABLE for line in body.splitlines() if line.lstrip().startswith("curl ")]
    assert curls and all("--fail-with-body" in line or " -f" in line for line in curls), curls


@pytest.mark.parametrize("index", range(len(RUNNABLE)))
def test_runnable_block(demo_server, index):
    work, port, env = demo_server
    lang, body = RUNNABLE[index]
    body = body.replace("127.0.0.1:8792", f"127.0.0.1:{port}")
    venv_bin = str(Path(sys.executable).parent)
    env = dict(env, PATH=venv_bin + os.pathsep + env.get("PATH", ""))
    command = ["bash", "-euo", "pipefail", "-c", body] if lang == "sh" else [sys.executable, "-c", body]
    # the blocks run in README order in one folder, as a reader would: later ones use files (router.json)
    done = subprocess.run(command, cwd=work, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, f"README block failed:\n{body}\n--- stdout\n{done.stdout}\n--- stderr\n{done.stderr}"


def shape(value):
    """A JSON value's shape: object keys with their shapes, list shapes, and number/string/bool/null."""
    if isinstance(value, dict):
        return {k: shape(v) for k, v in value.items()}
    if isinstance(value, list):
        return [shape(v) for v in value]
    return "bool" if isinstance(value, bool) else "number" if isinstance(value, (int, float)) else \
        type(value).__name__


def test_the_sample_response_has_the_live_answers_shape(demo_server):
    """The README's sample response for router.json is what the server really answers, numbers aside."""
    import json
    import urllib.request

    work, port, _ = demo_server
    [sample] = [json.loads(body) for lang, tags, body in blocks() if lang == "json" and "response" in tags]
    router = next(body for _, tags, body in blocks() if "runnable" in tags and "cat > router.json" in body)
    request = router.split("<<'EOF'\n", 1)[1].split("\nEOF", 1)[0]
    call = urllib.request.Request(f"http://127.0.0.1:{port}/v1/systemone", data=request.encode(),
                                  headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(call, timeout=120) as reply:
        live = json.load(reply)
    assert shape(live) == shape(sample)
    assert {q: a["type"] for q, a in live["answers"].items()} == {"needs_tools": "noul", "model": "choice",
                                                                 "difficulty": "score", "domain": "choice"}
