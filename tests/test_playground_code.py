"""The playground's code views (bridge/server/playground/playground-code.js) run in Node, outside a browser, with
hostile names and texts: the shell quoting round-trips every value through `sh`, the curl commands pass `sh -n`
and, run against a stub `curl` on PATH, send each body exactly (no name runs anything), the Python is valid and
names each model exactly, and every view is printable text (no bidi control or separator reorders what it shows).
Names with these characters are refused by models.toml (registry_names); the quoting must not rely on that."""

from __future__ import annotations

import ast
import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.integration

CODE_JS = Path(__file__).resolve().parent.parent / "bridge" / "server" / "playground" / "playground-code.js"
ORIGIN = "http://127.0.0.1:8792"
HOSTILE = ["it's", "$(touch PWNED)", "`touch PWNED`", "a\nb; touch PWNED", "a'\\''b", '"$HOME"', "\\", "*", "",
           "x\u202e\u2066evil", "line\u2028sep", "nul\x00x", "del\x7f", "tag\U000e0041", "\nJSON\ntouch PWNED\n",
           "'; touch PWNED; echo '", "\u041c\u043e\u0434\u0435\u043b\u044c"]
RUN_JS = """
globalThis.location = { origin: %(origin)s };
const code = await import(%(module)s);
const names = JSON.parse(require('fs').readFileSync(0, 'utf8'));
const bodies = names.map((model) => ({ model, state: model, questions: { [model || 'q']: { type: 'noul' } } }));
console.log(JSON.stringify({
  quoted: names.map(code.shellQuote),
  curl: code.curlTexts(bodies, { shorten: true }),
  python: code.pythonText(bodies[0], names, []),
  json: code.bodyJSON(bodies[1], true),
}));
"""
STUB_CURL = """#!%s
import json, sys
print(json.dumps({"argv": sys.argv[1:], "stdin": sys.stdin.read()}))
"""


def run_with_stub_curl(text: str, folder: Path) -> list[dict]:
    """Shell text run by sh in folder with a stub `curl` first on PATH: each call's argv and stdin."""
    stubs = folder / "bin"
    stubs.mkdir()
    (stubs / "curl").write_text(STUB_CURL % sys.executable)
    (stubs / "curl").chmod(0o755)
    run = subprocess.run(["sh"], input=text, capture_output=True, text=True, cwd=folder, timeout=30,
                         env={"PATH": f"{stubs}:/usr/bin:/bin"})
    assert run.returncode == 0, run.stderr
    return [json.loads(line) for line in run.stdout.splitlines()]


@pytest.fixture(scope="module")
def views(tmp_path_factory) -> dict:
    node = shutil.which("node")
    assert node, "these tests run the playground's JavaScript in Node: install nodejs (apt-get install nodejs)"
    folder = tmp_path_factory.mktemp("playground-code")
    module = folder / "playground-code.mjs"  # .mjs: Node reads it as the ES module the browser loads
    module.write_text(CODE_JS.read_text())
    script = "const { createRequire } = await import('node:module'); const require = createRequire(import.meta.url);" \
        + RUN_JS % {"origin": json.dumps(ORIGIN), "module": json.dumps(module.as_uri())}
    run = subprocess.run([node, "--input-type=module", "-e", script], input=json.dumps(HOSTILE), capture_output=True,
                         text=True, timeout=60, cwd=folder)
    assert run.returncode == 0, run.stderr
    return json.loads(run.stdout)


@pytest.mark.parametrize("shell", ["sh", "bash"])
def test_each_quoted_word_is_the_value_itself_to_a_shell(views, tmp_path, shell):
    for name, quoted in zip(HOSTILE, views["quoted"]):
        if "\x00" in name:
            continue  # no shell word can hold NUL: it cannot reach argv, so only its quoting's shape is checked
        run = subprocess.run([shell, "-c", f"printf '%s' {quoted}"], capture_output=True, text=True, cwd=tmp_path,
                             timeout=10)
        assert run.returncode == 0 and run.stdout == name, (name, quoted, run.stdout)
    assert not (tmp_path / "PWNED").exists()
    assert views["quoted"][0] == "'it'\\''s'" and views["quoted"][HOSTILE.index("")] == "''"


def test_the_curl_commands_parse_and_send_each_body_exactly_to_a_stub(views, tmp_path):
    text = views["curl"]
    assert subprocess.run(["sh", "-n"], input=text, text=True, timeout=10).returncode == 0
    assert all(line.isprintable() for line in text.split("\n"))  # what is shown is what runs: nothing hidden
    calls = run_with_stub_curl(text, tmp_path)
    assert len(calls) == len(HOSTILE)  # one command per model, as compare mode shows them
    for name, sent in zip(HOSTILE, calls):
        assert sent["argv"] == ["-sS", "--fail-with-body", f"{ORIGIN}/v1/systemone", "-H",
                                "Content-Type: application/json", "--data-binary", "@-"]
        body = json.loads(sent["stdin"])
        assert body["model"] == body["state"] == name and list(body["questions"]) == [name or "q"]
    assert not (tmp_path / "PWNED").exists()


def test_the_python_names_each_model_exactly_in_printable_source(views):
    source = views["python"]
    assert all(line.isprintable() for line in source.split("\n"))
    calls = [node for node in ast.walk(ast.parse(source)) if isinstance(node, ast.Call)
             and getattr(node.func, "attr", "") == "system_one"]
    assert [next(k.value.value for k in call.keywords if k.arg == "model") for call in calls] == HOSTILE


def test_the_json_view_is_printable_and_reads_back_the_same(views):
    assert all(line.isprintable() for line in views["json"].split("\n"))
    assert json.loads(views["json"])["model"] == HOSTILE[1]
