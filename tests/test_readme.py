"""Every command in README.md and the docs/ pages runs: the set-up commands keep their shape, each block
marked `runnable` is executed against the demo server the first set-up command starts, and every
repository path the pages name exists."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from .test_server_clients import _free_port, _wait_ready

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
# README.md first, then the docs pages by name: the order a reader (and the runnable blocks) goes in
PAGES = [README] + sorted((ROOT / "docs").glob("*.md"))
FENCE = re.compile(r"^(?P<indent> *)```(?P<info>[^\n`]*)\n(?P<body>.*?)^(?P=indent)```", re.MULTILINE | re.DOTALL)


def page_blocks(page: Path) -> list[tuple[str, set[str], str]]:
    """One page's fenced blocks: (language, tags, body) with the fence's indentation removed."""
    out = []
    for m in FENCE.finditer(page.read_text(encoding="utf-8")):
        words = m.group("info").split()
        body = "\n".join(line[len(m.group("indent")):] for line in m.group("body").splitlines())
        out.append((words[0] if words else "", set(words[1:]), body))
    return out


def blocks(pages: list[Path] | None = None) -> list[tuple[str, set[str], str]]:
    """The fenced blocks of the pages (default: README.md and every docs page), in reading order."""
    return [block for page in (PAGES if pages is None else pages) for block in page_blocks(page)]


def test_exactly_two_setup_commands():
    serve = [b for _, tags, b in blocks([README]) if "setup-serve" in tags]
    tests = [b for _, tags, b in blocks([README]) if "setup-test" in tags]
    elsewhere = [p.name for p in PAGES[1:] for _, tags, _ in page_blocks(p) if tags & {"setup-serve", "setup-test"}]
    assert len(serve) == 1 and len(tests) == 1 and not elsewhere, elsewhere
    assert serve[0].strip().endswith("&& clef-bridge serve") and "pip install ." in serve[0]
    assert tests[0].strip() == "sh tests/run.sh"
    ci = (ROOT / ".ci" / "run").read_text()
    assert "tests/run.sh" in ci


@pytest.fixture(scope="module")
def demo_server(tmp_path_factory):
    """The first set-up command's `clef-bridge serve`, run as a newcomer runs it: in the checkout, which reads the
    checkout's models.toml; the demos' files and the blocks' own temporary folder ($TMPDIR) are this run's."""
    work = tmp_path_factory.mktemp("readme")
    port = _free_port()
    (work / "tmp").mkdir()
    env = dict(os.environ, CLEF_BRIDGE_CACHE=str(work / "cache"), TMPDIR=str(work / "tmp"))
    proc = subprocess.Popen([sys.executable, "-m", "clef_bridge.tools.cli", "serve", "--port", str(port)], cwd=ROOT,
                            env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        _wait_ready(port, proc)
        yield work, port, env
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(60)


RUNNABLE = [(page, lang, body) for page in PAGES for lang, tags, body in page_blocks(page) if "runnable" in tags]


def test_there_are_runnable_blocks():
    assert len(RUNNABLE) >= 5
    assert any(page == README and "curl " in body for page, _, body in RUNNABLE)  # the front page's one request


def test_every_curl_in_a_runnable_block_fails_on_an_http_error():
    """curl exits 0 on a 4xx/5xx unless told otherwise; then the block would pass on an error answer."""
    curls = [line for _, _, body in RUNNABLE for line in body.splitlines() if line.lstrip().startswith("curl ")]
    assert curls and all("--fail-with-body" in line or " -f" in line for line in curls), curls


@pytest.fixture(scope="module")
def checkout(demo_server) -> Path:
    """Where a reader runs the blocks from: a stand-in for the checkout, with its models.toml."""
    folder = demo_server[0] / "checkout"
    folder.mkdir()
    (folder / "models.toml").write_bytes((ROOT / "models.toml").read_bytes())
    return folder


@pytest.mark.parametrize("index", range(len(RUNNABLE)),
                         ids=[f"{page.relative_to(ROOT)}-{i}" for i, (page, _, _) in enumerate(RUNNABLE)])
def test_runnable_block(demo_server, checkout, index):
    work, port, env = demo_server
    page, lang, body = RUNNABLE[index]
    body = body.replace("127.0.0.1:8792", f"127.0.0.1:{port}")
    venv_bin = str(Path(sys.executable).parent)
    env = dict(env, PATH=venv_bin + os.pathsep + env.get("PATH", ""))
    command = ["bash", "-euo", "pipefail", "-c", body] if lang == "sh" else [sys.executable, "-c", body]
    # the blocks run in reading order (README.md, then docs/ by name), as a reader would: later ones use files
    # earlier ones wrote (router.json, demo/) in the scratch folder they name, never in the checkout
    done = subprocess.run(command, cwd=checkout, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, \
        f"{page.relative_to(ROOT)} block failed:\n{body}\n--- stdout\n{done.stdout}\n--- stderr\n{done.stderr}"
    assert sorted(p.name for p in checkout.iterdir()) == ["models.toml"], \
        f"{page.relative_to(ROOT)} block wrote into the checkout: {sorted(p.name for p in checkout.iterdir())}"


def shape(value):
    """A JSON value's shape: object keys with their shapes, list shapes, and number/string/bool/null."""
    if isinstance(value, dict):
        return {k: shape(v) for k, v in value.items()}
    if isinstance(value, list):
        return [shape(v) for v in value]
    return "bool" if isinstance(value, bool) else "number" if isinstance(value, (int, float)) else \
        type(value).__name__


def test_the_sample_response_has_the_live_answers_shape(demo_server):
    """The sample response for router.json (in a docs page) is what the server really answers, numbers aside."""
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


def test_a_python_example_says_what_to_install_for_it():
    """What a python block imports is there after the first set-up command, or the page says to pip install it
    before the block."""
    import tomllib

    requirements = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    installed = {"clef_bridge"} | {re.split(r"[^\w-]", r, 1)[0].replace("-", "_").lower() for r in requirements}
    for page in PAGES:
        text = page.read_text(encoding="utf-8")
        for lang, tags, body in page_blocks(page):
            if lang != "python" or "runnable" not in tags:
                continue
            before = text[:text.index(body.splitlines()[0])]
            for module in re.findall(r"^(?:from|import) (\w+)", body, re.MULTILINE):
                if module not in sys.stdlib_module_names and module.lower() not in installed:
                    assert f"pip install {module.replace('_', '-')}" in before, (page.name, module)


# a repository path as the pages write it: `bridge/config/registry.py`, deploy/models.toml, tests/run.sh
PATH_MENTION = re.compile(r"(?<![\w./-])((?:head|bridge|tools|tests|benchmarks|deploy|docs)/[\w./-]*[\w/])")


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_path_and_link_a_page_names_exists(page):
    """Files move (the rooms of bridge/, benchmarks/): a page naming a path that is gone fails here."""
    text = page.read_text(encoding="utf-8")
    named = {m.group(1) for m in PATH_MENTION.finditer(text)}
    missing = sorted(p for p in named if not (ROOT / p).exists())
    links = {m.group(1).split("#")[0] for m in re.finditer(r"\]\(([^)\s]+)\)", text)}
    broken = sorted(link for link in links if link and "://" not in link and not (page.parent / link).exists())
    assert not missing and not broken, f"{page.name} names paths that do not exist: {missing + broken}"
