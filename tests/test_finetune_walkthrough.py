"""docs/fine-tunes.md's "Try it on the demo", run as the page writes it: its blocks (tagged `demo-lora-*`) are
taken from the markdown, so page and test cannot drift. In a scratch folder: `make-demo`, the adapter snippet,
`check` / `pair --lora`, the page's models.toml, `serve` (on a free port instead of 8792), the curls; then the
outputs the page shows (check's lines, the banner, the answers, /v1/models) are compared with the live ones."""

from __future__ import annotations

import json
import os
import re
import shlex
import signal
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

from .test_readme import page_blocks
from .test_server_clients import _free_port, _wait_ready

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parent.parent
PAGE = ROOT / "docs" / "fine-tunes.md"
PORT_IN_PAGE = "127.0.0.1:8792"
TOLERANCE = 0.005  # the page's probabilities are rounded to 4 places; llama.cpp's sums differ by thread count


def block(tag: str) -> tuple[str, str]:
    """(language, body) of the page's one block tagged `tag`."""
    found = [(lang, body) for lang, tags, body in page_blocks(PAGE) if tag in tags]
    assert len(found) == 1, f"docs/fine-tunes.md has {len(found)} blocks tagged {tag}"
    return found[0]


def json_values(text: str) -> list:
    """The JSON documents of a text, one after the other (lines of curl output, or a block's wrapped objects)."""
    decoder, out, i = json.JSONDecoder(), [], 0
    while True:
        while i < len(text) and text[i].isspace():
            i += 1
        if i == len(text):
            return out
        value, i = decoder.raw_decode(text, i)
        out.append(value)


def shown_lines_in(shown: str, output: str, port: int | None = None) -> None:
    """Every line of a block of shown output appears in the real output, in order; `...` stands for anything."""
    lines = [line.strip() for line in output.splitlines()]
    at = 0
    for want in filter(None, (line.strip() for line in shown.splitlines())):
        if port is not None:
            want = want.replace(PORT_IN_PAGE, f"127.0.0.1:{port}")
        pattern = re.compile(".*".join(re.escape(part) for part in want.split("...")))
        hits = [i for i in range(at, len(lines)) if pattern.fullmatch(lines[i])]
        assert hits, f"the page shows {want!r}, the output has no such line (after line {at}):\n{output}"
        at = hits[0] + 1


def close_to(shown, live, where: str = "") -> None:
    """live has every key and value shown: strings and booleans equal, numbers within TOLERANCE."""
    if isinstance(shown, dict):
        assert isinstance(live, dict), where
        for key, value in shown.items():
            assert key in live, f"{where}.{key} is missing: {live}"
            close_to(value, live[key], f"{where}.{key}")
    elif isinstance(shown, list):
        assert isinstance(live, list) and len(live) == len(shown), (where, live)
        for i, (a, b) in enumerate(zip(shown, live)):
            close_to(a, b, f"{where}[{i}]")
    elif isinstance(shown, float):
        assert isinstance(live, (int, float)) and abs(live - shown) <= TOLERANCE, (where, shown, live)
    else:
        assert live == shown, (where, shown, live)


@dataclass
class Walk:
    folder: Path
    port: int
    env: dict[str, str]
    check: str  # what the check block printed
    ask: str  # what the curls printed
    listed: str  # /v1/models
    log: Path  # the server's stdout and stderr

    def run_sh(self, tag: str) -> str:
        return run_block(tag, self.folder, self.env, self.port)


def run_block(tag: str, folder: Path, env: dict[str, str], port: int | None = None) -> str:
    """Run a sh or python block in folder as a reader would (sh under bash -euo pipefail); its stdout."""
    lang, body = block(tag)
    if port is not None:
        body = body.replace(PORT_IN_PAGE, f"127.0.0.1:{port}")
    command = ["bash", "-euo", "pipefail", "-c", body] if lang == "sh" else [sys.executable, "-c", body]
    assert lang in ("sh", "python"), (tag, lang)
    done = subprocess.run(command, cwd=folder, env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, f"block {tag} failed:\n{body}\n--- stdout\n{done.stdout}\n--- stderr\n{done.stderr}"
    return done.stdout


@pytest.fixture(scope="module")
def walk(tmp_path_factory):
    work = tmp_path_factory.mktemp("finetune-walk")
    folder = work / "walk"
    folder.mkdir()
    venv_bin = str(Path(sys.executable).parent)  # where `clef-bridge` is, as after `pip install .`
    env = dict(os.environ, CLEF_BRIDGE_CACHE=str(work / "cache"), TMPDIR=str(work),
               PATH=venv_bin + os.pathsep + os.environ.get("PATH", ""))
    run_block("demo-lora-files", folder, env)
    run_block("demo-lora-adapter", folder, env)
    check = run_block("demo-lora-check", folder, env)
    lang, toml = block("demo-lora-models")
    assert lang == "toml"
    (folder / "models.toml").write_text(toml)

    lang, serve = block("demo-lora-serve")
    command = shlex.split(serve, comments=True)
    assert lang == "sh" and command[:2] == ["clef-bridge", "serve"] and "--port" not in command, serve
    port = _free_port()
    log = work / "serve.log"
    with log.open("w") as out:
        proc = subprocess.Popen([*command, "--port", str(port)], cwd=folder, env=env, stdout=out,
                                stderr=subprocess.STDOUT)
    try:
        _wait_ready(port, proc)
        ask = run_block("demo-lora-ask", folder, env, port)
        listed = run_block("demo-lora-list", folder, env, port)
        yield Walk(folder, port, env, check, ask, listed, log)
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(60)


def test_every_curl_of_the_walk_fails_on_an_http_error():
    """So that a 4xx or 5xx answer fails its block (curl exits 0 on one otherwise): each model answered 200."""
    curls = [line for tag in ("demo-lora-ask", "demo-lora-list") for line in block(tag)[1].splitlines()
             if line.lstrip().startswith("curl ")]
    assert len(curls) == 2 and all("--fail-with-body" in line for line in curls), curls


def test_the_snippet_writes_a_peft_adapter_in_clef_finetunes_layout(walk):
    from clef_bridge.bridge.gguf.lora import QWEN35_TARGETS, read_peft

    checkpoint = walk.folder / "demo-lora"
    assert sorted(p.name for p in checkpoint.iterdir()) == ["adapter", "joint_head.safetensors",
                                                           "joint_head_config.json"]
    assert sorted(p.name for p in (checkpoint / "adapter").iterdir()) == ["adapter_config.json",
                                                                          "adapter_model.safetensors"]
    for name in ("joint_head.safetensors", "joint_head_config.json"):  # the demo's head, so the adapter alone differs
        assert (checkpoint / name).read_bytes() == (walk.folder / "demo" / name).read_bytes()
    peft = read_peft(checkpoint / "adapter")
    assert (peft.r, peft.alpha, peft.base, peft.skipped) == (8, 16.0, "demo", ())
    assert len(peft.matrices) == 31 and set(peft.targets) == set(QWEN35_TARGETS)  # every module of every layer
    assert all(abs(a).max() > 0 and abs(b).max() > 0 for a, b in peft.matrices.values())


def test_peft_reads_the_snippets_config(walk):
    """The config is PEFT's own: LoraConfig loads it with the snippet's rank, alpha and targets."""
    peft = pytest.importorskip("peft")
    config = peft.LoraConfig.from_pretrained(str(walk.folder / "demo-lora" / "adapter"))
    assert (config.r, config.lora_alpha, len(config.target_modules), config.base_model_name_or_path) == \
        (8, 16, 31, "demo")


def test_check_prints_what_the_page_shows_and_pair_writes_both_records(walk):
    shown_lines_in(block("demo-lora-check-output")[1], walk.check)
    record = json.loads((walk.folder / "demo-lora.pair.json").read_text())
    from clef_bridge.bridge.gguf.lora import lora_digest

    assert record["lora_sha256"] == lora_digest(walk.folder / "demo-lora")
    assert "lora_sha256" not in json.loads((walk.folder / "demo" / "demo.pair.json").read_text())


def test_the_banner_says_the_backbone_is_shared_and_names_the_adapter(walk):
    output = walk.log.read_text()
    shown_lines_in(block("demo-lora-banner")[1], output, walk.port)
    assert "pair.no_record" not in output  # both entries loaded with their pairing records


def test_both_models_answer_and_the_adapter_moves_the_answers(walk):
    live = json_values(walk.ask)
    assert [a["model"] for a in live] == ["demo", "demo-lora"], walk.ask
    base, tuned = (a["answers"] for a in live)
    moved = max([abs(base["refund"]["noul"] - tuned["refund"]["noul"])]
                + [abs(p - tuned["team"]["probabilities"][k]) for k, p in base["team"]["probabilities"].items()])
    assert moved > 0.02, (base, tuned)  # the same GGUF and head: the adapter alone moved the hidden states
    shown = json_values(block("demo-lora-answers")[1])
    assert len(shown) == len(live)
    for s, a in zip(shown, live):
        close_to(s, a, s["model"])


def test_v1_models_shows_the_sharing_and_the_adapter(walk):
    live = {m["name"]: m for m in json.loads(walk.listed)["models"]}
    shown = json_values(block("demo-lora-listed")[1])[0]["models"]
    assert [m["name"] for m in shown] == list(live)
    for model in shown:
        close_to(model, live[model["name"]], model["name"])
        for key in ("x_lora", "x_backbone_shared_with"):  # what the page leaves out, the server leaves out
            assert (key in model) == (key in live[model["name"]]), (model["name"], key)
