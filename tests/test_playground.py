"""The playground in a real browser: Debian's Chromium driven by Playwright (the driver only), loading the page
from `clef-bridge serve` itself, building requests as a person would and checking every bar against the JSON.

tests/run.sh installs Chromium when it is missing (`apt-get install chromium`: /usr/bin/chromium; `CHROMIUM`
points elsewhere); Playwright comes with the test extra and never downloads a browser. Two servers run as
processes: one without auth serving the built-in demo (its random projector: it announces images), a second
random demo (seed 1, for side by side; its projector removed: a model without media) and the tiny vision model
(a projector: it announces images); one with an api_keys_file. The screenshot of the
answered page and the timings land in $PLAYGROUND_ARTIFACTS (default .fixtures/artifacts/).
"""

from __future__ import annotations

import base64
import io
import json
import os
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
import wave
from pathlib import Path
from typing import Any, Iterator

import pytest

from . import fixturegen_video, fixturegen_vision
from .fixturegen import FIXTURES
from .fixturegen_vision import encoded, picture
from .test_playground_code import run_with_stub_curl
from .test_readme import blocks
from .test_server_clients import _free_port

pytestmark = pytest.mark.slow

try:
    from playwright import sync_api as playwright_sync
except ImportError:  # the browser fixture fails naming the fix; nothing here is skipped
    playwright_sync = None

ROOT = Path(__file__).resolve().parent.parent
CHROMIUM = os.environ.get("CHROMIUM", "/usr/bin/chromium")
ARTIFACTS = Path(os.environ.get("PLAYGROUND_ARTIFACTS", ROOT / ".fixtures" / "artifacts"))
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update", "--disable-sync"]
API_KEY = "playground-test-key"
STARTUP_S = 300  # a cold demo build and three models' checks on a busy 2-core machine
TIMINGS: dict[str, Any] = {}


# --- the servers ------------------------------------------------------------------------------------

def http(method: str, url: str, body: Any = None, headers: dict[str, str] | None = None) -> tuple[int, Any]:
    data = json.dumps(body).encode() if body is not None else None
    req = urllib.request.Request(url, data=data, method=method,
                                 headers={"Content-Type": "application/json", **(headers or {})})
    try:
        with urllib.request.urlopen(req, timeout=120) as r:
            return r.status, json.loads(r.read() or b"null")
    except urllib.error.HTTPError as e:
        raw = e.read()
        return e.code, json.loads(raw) if raw else None


class ClefServer:
    """`clef-bridge serve` in a folder with this models.toml, its own demo cache, its log in the folder."""

    def __init__(self, folder: Path, models_toml: str):
        self.folder, self.port = folder, _free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        (folder / "models.toml").write_text(models_toml)
        self.log = open(folder / "server.log", "wb")
        env = {**os.environ, "PYTHONUNBUFFERED": "1", "CLEF_BRIDGE_CACHE": str(folder / "cache")}
        self.proc = subprocess.Popen([sys.executable, "-m", "clef_bridge.tools.cli", "serve", "--port",
                                      str(self.port)], cwd=folder, stdout=self.log, stderr=subprocess.STDOUT, env=env)

    def wait_ready(self) -> None:
        deadline = time.monotonic() + STARTUP_S
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"clef-bridge exited with {self.proc.returncode}:\n{self.tail()}")
            try:
                if http("GET", self.url + "/ready")[0] == 200:
                    return
            except OSError:
                pass
            time.sleep(0.3)
        raise RuntimeError(f"clef-bridge not ready within {STARTUP_S} s:\n{self.tail()}")

    def tail(self) -> str:
        self.log.flush()
        return (self.folder / "server.log").read_text(errors="replace")[-4000:]

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(60)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self.log.close()


def three_model_registry(folder: Path) -> str:
    """models.toml: the built-in demo, a second random demo (seed 1) without its projector (a model that takes no
    media) and the tiny model with a vision projector."""
    import tomllib

    seed1 = folder / "seed1"
    subprocess.run([sys.executable, "-m", "clef_bridge.tools.cli", "make-demo", str(seed1), "--seed", "1"],
                   check=True, capture_output=True, timeout=STARTUP_S)
    (seed1 / "demo.mmproj.gguf").unlink()
    entry = tomllib.loads((seed1 / "models.toml").read_text())["models"]["demo"]
    entry.update(gguf=str(seed1 / entry["gguf"]), head=str(seed1 / entry["head"]),
                 description="demo, seed 1: random weights")
    vision = fixturegen_vision.build()
    tables = {"demo": {"builtin": "demo"}, "demo-seed1": entry,
              "tiny-vl": {"gguf": str(vision.gguf_f32), "head": str(vision.head), "mmproj": str(vision.mmproj_f32),
                          "n_ctx": 8192, "max_length": 8192}}
    lines = ['default = "demo"']
    for name, table in tables.items():
        lines += ["", f"[models.{name}]", *(f"{k} = {json.dumps(v)}" for k, v in table.items())]
    return "\n".join(lines) + "\n"


@pytest.fixture(scope="session")
def artifacts() -> Iterator[Path]:
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    yield ARTIFACTS
    TIMINGS["session_total_s"] = round(time.perf_counter() - t0, 2)
    (ARTIFACTS / "timings.json").write_text(json.dumps(TIMINGS, indent=2) + "\n")


def _served(name: str, models_toml) -> Iterator[ClefServer]:
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix=f"clef-playground-{name}-") as tmp:
        srv = ClefServer(Path(tmp), models_toml(Path(tmp)))
        try:
            srv.wait_ready()
            TIMINGS[f"{name}_start_s"] = round(time.perf_counter() - t0, 2)
            yield srv
        finally:
            srv.stop()


@pytest.fixture(scope="module")
def server(artifacts: Path) -> Iterator[ClefServer]:
    yield from _served("server", three_model_registry)


@pytest.fixture(scope="module")
def auth_server(artifacts: Path) -> Iterator[ClefServer]:
    def registry(folder: Path) -> str:
        (folder / "keys.txt").write_text(f"# test key\n{API_KEY}\n")
        return 'default = "demo"\n\n[server]\napi_keys_file = "keys.txt"\n\n[models.demo]\nbuiltin = "demo"\n'
    yield from _served("auth_server", registry)


# the module, not the session: Playwright's sync API keeps an event loop running in this thread until it
# stops, and every later test's asyncio.run() would refuse to start
@pytest.fixture(scope="module")
def browser(artifacts: Path):
    if playwright_sync is None:
        pytest.fail("playwright is not installed: pip install -e '.[test]' (tests/run.sh does; never `playwright "
                    "install`: the tests drive Debian's Chromium)")
    if not os.access(CHROMIUM, os.X_OK):
        pytest.fail(f"no browser at {CHROMIUM}: apt-get update && apt-get install -y chromium (tests/run.sh does), "
                    "or set CHROMIUM")
    playwright_sync.expect.set_options(timeout=30_000)  # answers from a cold model on a busy 2-core machine
    t0 = time.perf_counter()
    with playwright_sync.sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM, headless=True, args=CHROMIUM_ARGS)
        TIMINGS["browser_launch_s"] = round(time.perf_counter() - t0, 2)
        yield b
        b.close()


class Page:
    """A fresh page with console errors collected (a CSP violation is one)."""

    def __init__(self, browser, origin: str, announce: dict[str, list[str]] | None = None):
        self.context = browser.new_context(viewport={"width": 1360, "height": 900}, device_scale_factor=1)
        self.context.grant_permissions(["clipboard-read", "clipboard-write"], origin=origin)
        self.page = self.context.new_page()
        self.page.set_default_timeout(30_000)
        self.errors: list[str] = []
        self.served_media: dict[str, list[str]] = {}
        self.page.on("console", lambda m: m.type == "error" and self.errors.append(m.text))
        self.page.on("pageerror", lambda e: self.errors.append(f"pageerror: {e}"))
        if announce:
            self.page.route("**/v1/models", lambda route: self._announce(route, announce))
        self.page.goto(origin + "/")

    def _announce(self, route, announce: dict[str, list[str]]) -> None:
        """Media a model does not take yet (audio, until Clef-omni), added to the server's real answer."""
        response = route.fetch()
        models = response.json()["models"]
        self.served_media = {m["name"]: m["x_media"] for m in models}
        for m in models:
            m["x_media"] = announce.get(m["name"], m["x_media"])
        route.fulfill(response=response, json={"models": models})

    def __enter__(self) -> "Page":
        return self

    def __exit__(self, *exc) -> None:
        self.context.close()


@pytest.fixture
def timed(request) -> Iterator[None]:
    t0 = time.perf_counter()
    yield
    TIMINGS[request.node.name + "_s"] = round(time.perf_counter() - t0, 2)


# --- helpers ----------------------------------------------------------------------------------------

def fill_request(page) -> None:
    """The request a person would build: a state, then a noul, a choice and a score question."""
    page.get_by_label("State", exact=True).fill("I was charged twice for my March invoice. Please refund one of "
                                                "them, and quickly: this is the third time.")
    page.get_by_role("button", name="Add noul question").click()
    page.get_by_label("Question 1 id").fill("refund")
    page.get_by_label("Question 1 instructions").fill("Does the customer ask for a refund?")

    page.get_by_role("button", name="Add choice question").click()
    page.get_by_label("Question 2 id").fill("team")
    page.get_by_label("Question 2 instructions").fill("Which team should handle it?")
    page.get_by_label("Question 2 option 1 name").fill("billing")
    page.get_by_label("Question 2 option 1 description").fill("invoices, charges, refunds")
    page.get_by_label("Question 2 option 2 name").fill("tech")
    page.get_by_role("button", name="Question 2: add option").click()
    page.get_by_label("Question 2 option 3 name").fill("sales")

    page.get_by_role("button", name="Add score question").click()
    page.get_by_label("Question 3 id").fill("urgency")
    page.get_by_label("Question 3 instructions").fill("How urgent is it?")
    for i, level in enumerate(["none", "low", "medium"]):
        page.get_by_label(f"Question 3 level {i}", exact=True).fill(level)
    page.get_by_role("button", name="Question 3: add level").click()
    page.get_by_label("Question 3 level 3", exact=True).fill("high")


EXPECTED_QUESTIONS = {
    "refund": {"type": "noul", "instructions": "Does the customer ask for a refund?"},
    "team": {"type": "choice", "instructions": "Which team should handle it?",
             "criteria": {"billing": "invoices, charges, refunds", "tech": None, "sales": None}},
    "urgency": {"type": "score", "instructions": "How urgent is it?", "criteria": ["none", "low", "medium", "high"]},
}


def choose_model(page, label: str, name: str) -> None:
    select = page.get_by_label(label, exact=True)
    playwright_sync.expect(select).to_be_enabled()
    select.select_option(name)


def request_body(page) -> dict:
    """The JSON body on screen (the page's own 'JSON body' view; base64 shortened there)."""
    return json.loads(page.locator("#code-json").text_content())


def shortened(data: bytes) -> str:
    """How the page's views write an asset's base64."""
    text = base64.b64encode(data).decode()
    return f"{text[:24]}…({len(text)} base64 characters)"


def expected_rows(answer: dict) -> dict[str, float]:
    """Option -> probability, as the page must draw them."""
    if answer["type"] == "noul":
        return {"true": answer["noul"], "false": 1 - answer["noul"]}
    return dict(answer["probabilities"])


def pct(p: float) -> str:
    return f"{p * 100:.2f}%"


def rendered_meters(page, model: str | None = None) -> dict[tuple[str, str], dict[str, str]]:
    rows = page.eval_on_selector_all("[role=meter]", """els => els.map(e => ({
        q: e.dataset.question, o: e.dataset.option, model: e.dataset.model,
        now: e.getAttribute('aria-valuenow'), text: e.getAttribute('aria-valuetext'),
        shown: e.parentElement.querySelector('.value').textContent,
        width: e.querySelector('.fill').style.width}))""")
    return {(r["q"], r["o"]): r for r in rows if model is None or r["model"] == model}


def check_bars(page, answers: dict, model: str) -> int:
    meters = rendered_meters(page, model)
    count = 0
    for qid, answer in answers.items():
        for option, p in expected_rows(answer).items():
            m = meters[(qid, option)]
            assert float(m["now"]) == pytest.approx(p, abs=1e-12), (qid, option, m)
            assert m["text"] == pct(p) and m["shown"] == pct(p), (qid, option, m)
            assert float(m["width"].rstrip("%")) == pytest.approx(p * 100, abs=1e-9), (qid, option, m)
            count += 1
    assert count == len(meters)
    return count


def tiny_wav() -> bytes:
    """0.1 s of 16 kHz mono silence."""
    out = io.BytesIO()
    with wave.open(out, "wb") as w:
        w.setnchannels(1)
        w.setsampwidth(2)
        w.setframerate(16000)
        w.writeframes(b"\x00\x00" * 1600)
    return out.getvalue()


# --- the tests --------------------------------------------------------------------------------------

def test_decide_bars_match_json_and_curl(browser, server: ClefServer, artifacts: Path, timed):
    with Page(browser, server.url) as p:
        page = p.page
        choose_model(page, "Model", "demo")
        # the demo's random projector: an Images input, no Audio one
        assert page.locator("#images-field").is_visible() and page.locator("#audio-field").is_hidden()
        fill_request(page)
        body = request_body(page)
        assert body == {"model": "demo", "state": body["state"], "questions": EXPECTED_QUESTIONS}

        page.get_by_role("button", name="Decide").click()
        playwright_sync.expect(page.get_by_role("meter")).to_have_count(2 + 3 + 4)
        status, direct = http("POST", server.url + "/v1/systemone", body)
        assert status == 200, direct
        assert list(direct["answers"]) == ["refund", "team", "urgency"]
        assert check_bars(page, direct["answers"], "demo") == 9

        # the summaries: the choice, the expected score and the confidences, as the JSON says
        team = page.locator("article[data-question=team]")
        playwright_sync.expect(team).to_contain_text(direct["answers"]["team"]["choice"])
        playwright_sync.expect(team).to_contain_text(f"confidence {pct(direct['answers']['team']['confidence'])}")
        urgency = direct["answers"]["urgency"]
        playwright_sync.expect(page.locator("article[data-question=urgency]")).to_contain_text(
            f"score {urgency['score']:.2f}")
        meta = page.get_by_role("region", name="Usage and timings")
        playwright_sync.expect(meta).to_contain_text(f"input tokens{direct['usage']['input_tokens']}")
        for stage in ("queue", "tokenize", "backbone", "head", "reused tokens"):
            playwright_sync.expect(meta).to_contain_text(stage)

        page.screenshot(path=str(artifacts / "playground.png"), full_page=True)

        # copy as curl: the clipboard's command, run by a shell, answers the same
        page.get_by_role("button", name="Copy as curl").click()
        playwright_sync.expect(page.get_by_text("Copied the curl command.")).to_be_visible()
        curl = page.evaluate("navigator.clipboard.readText()")
        assert curl.startswith(f"curl -sS --fail-with-body '{server.url}/v1/systemone'")
        run = subprocess.run(["bash", "-c", curl], capture_output=True, text=True, timeout=60)
        assert run.returncode == 0, run.stderr
        by_curl = json.loads(run.stdout)
        assert by_curl["answers"] == direct["answers"] and by_curl["usage"] == direct["usage"]

        # copy as Python: the typesafe-sdk snippet (the test extra installs the SDK) runs and answers the same
        page.get_by_role("button", name="Copy as Python").click()
        code = page.evaluate("navigator.clipboard.readText()")
        assert "from typesafe_sdk import Choice, Noul, Score, TypeSafeClient" in code
        page.get_by_role("tab", name="Python (typesafe-sdk)").click()
        assert page.get_by_role("tabpanel", name="Python (typesafe-sdk)").text_content() == code
        probe = code + "\nimport json as _j\nprint('ANSWERS=' + _j.dumps(result.model_dump(mode='json')['answers']))\n"
        run = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120)
        assert run.returncode == 0, run.stderr
        sdk = json.loads(run.stdout.rsplit("ANSWERS=", 1)[1])
        for qid, want in direct["answers"].items():
            for key in ("noul", "choice", "score", "confidence", "probabilities"):
                if key in want:
                    assert sdk[qid][key] == want[key], (qid, key)
        assert p.errors == [], p.errors


def test_the_demo_is_called_random_at_once_and_the_example_is_the_api_pages(browser, server: ClefServer, timed):
    """Before any answer the page says the demo's weights are random (from /v1/models); "load an example" fills the
    router request docs/api.md walks through, the model aside (the picker's)."""
    [router] = [json.loads(body.split("<<'EOF'\n", 1)[1].split("\nEOF", 1)[0]) for _, tags, body in blocks()
                if "runnable" in tags and "cat > router.json" in body]
    with Page(browser, server.url) as p:
        page = p.page
        choose_model(page, "Model", "demo")
        playwright_sync.expect(page.locator("#models-status")).to_contain_text("demo model has RANDOM weights")
        assert "demo: demo:" not in page.locator("#models-status").inner_text()  # issue 54: the code said twice
        assert page.get_by_role("meter").count() == 0  # nothing asked yet
        page.get_by_role("button", name="load an example").click()
        assert request_body(page) == {**router, "model": "demo"}
        assert p.errors == [], p.errors


def test_side_by_side_shows_differences(browser, server: ClefServer, timed):
    with Page(browser, server.url) as p:
        page = p.page
        page.get_by_role("button", name="load an example").click()
        choose_model(page, "Model", "demo")
        choose_model(page, "Compare with", "demo-seed1")
        # a JSON state: refused in place while it does not parse, sent as an object once it does
        page.get_by_role("radio", name="JSON").check()
        state = page.get_by_label("State", exact=True)
        state.fill('{"prompt": "Write a SQL query that finds duplicate invoices", "history": [')
        playwright_sync.expect(page.locator("#state-error")).to_contain_text("Not valid JSON")
        state.fill('{"prompt": "Write a SQL query that finds duplicate invoices", "history": []}')
        playwright_sync.expect(page.locator("#state-error")).to_be_hidden()
        assert request_body(page)["state"] == {"prompt": "Write a SQL query that finds duplicate invoices",
                                               "history": []}
        page.get_by_role("button", name="Decide").click()
        playwright_sync.expect(page.locator("[role=meter][data-model=demo-seed1]")).to_have_count(2 + 3 + 5 + 3)
        body = request_body(page)
        _, a = http("POST", server.url + "/v1/systemone", body)
        _, b = http("POST", server.url + "/v1/systemone", {**body, "model": "demo-seed1"})
        check_bars(page, a["answers"], "demo")
        check_bars(page, b["answers"], "demo-seed1")
        deltas = page.eval_on_selector_all(".delta", """els => els.map(e => ({
            q: e.closest('article').dataset.question, o: e.closest('.bar-row').dataset.option,
            d: e.dataset.delta, text: e.querySelector('.dvalue').textContent}))""")
        assert len(deltas) == 13
        moved = 0
        for row in deltas:
            want = expected_rows(b["answers"][row["q"]])[row["o"]] - expected_rows(a["answers"][row["q"]])[row["o"]]
            assert float(row["d"]) == pytest.approx(want, abs=1e-12)
            v = f"{abs(want) * 100:.2f}"
            assert row["text"] == ("±0.00 pp" if float(v) == 0 else f"{'+' if want > 0 else '−'}{v} pp"), row
            moved += float(v) != 0
        assert moved > 0, "two random demos should disagree somewhere"
        playwright_sync.expect(page.get_by_role("region", name="Usage and timings of demo-seed1")).to_be_visible()
        assert p.errors == [], p.errors


def test_media_inputs_follow_the_model(browser, server: ClefServer, timed):
    """The vision model's x_media brings an image input, whose image it answers; audio (announced here as
    Clef-omni will) goes as a Jev asset {"type": "audio", "format": "wav" | "mp3", "data_base64"}."""
    with Page(browser, server.url, announce={"tiny-vl": ["image", "audio", "video"]}) as p:
        page = p.page
        choose_model(page, "Model", "tiny-vl")
        assert p.served_media == {"demo": ["image"], "demo-seed1": [], "tiny-vl": ["image"]}  # the server's own
        page.get_by_role("button", name="Decide").click()  # nothing asked yet: said on the page, nothing sent
        playwright_sync.expect(page.locator("#error")).to_contain_text("add at least one question")
        images, audio, videos = page.get_by_label("Images"), page.get_by_label("Audio"), page.get_by_label("Videos")
        playwright_sync.expect(images).to_be_visible()
        playwright_sync.expect(audio).to_be_visible()
        playwright_sync.expect(videos).to_be_visible()
        page.get_by_role("button", name="load an example").click()
        png = encoded(picture(96, 64), "PNG")
        images.set_input_files(files=[{"name": "chart.png", "mimeType": "image/png", "buffer": png}])
        playwright_sync.expect(page.get_by_role("img", name="chart.png")).to_be_visible()
        shown = request_body(page)
        assert shown["assets"] == {"<image1>": {"type": "image", "format": "png", "data_base64": shortened(png)}}
        playwright_sync.expect(page.locator("#code-python")).to_contain_text('"<image1>": Image(Path("chart.png"))')
        page.get_by_role("button", name="Decide").click()
        playwright_sync.expect(page.get_by_role("meter")).to_have_count(2 + 3 + 5 + 3)
        full = {**shown, "assets": {"<image1>": {"type": "image", "format": "png",
                                                 "data_base64": base64.b64encode(png).decode()}}}
        status, direct = http("POST", server.url + "/v1/systemone", full)
        assert status == 200 and "images_ms" in direct["x_timings"], direct
        check_bars(page, direct["answers"], "tiny-vl")

        # audio: WAV and MP3 only, as the Jev asset the audio work accepts; anything else stays on the desk
        audio.set_input_files(files=[{"name": "call.wav", "mimeType": "audio/wav", "buffer": tiny_wav()},
                                     {"name": "call.ogg", "mimeType": "audio/ogg", "buffer": b"OggS" + bytes(60)}])
        playwright_sync.expect(page.locator("#media-error")).to_contain_text("Left out call.ogg")
        playwright_sync.expect(page.locator("#media-error")).to_contain_text("WAV or MP3")
        assert request_body(page)["assets"]["<audio1>"] == {"type": "audio", "format": "wav",
                                                            "data_base64": shortened(tiny_wav())}
        assert len(request_body(page)["assets"]) == 2
        playwright_sync.expect(page.locator("#code-python")).to_contain_text("audio is left out")
        # videos: MP4, WebM or Matroska, as a Jev asset {"type": "video", "format", "data_base64"}
        clip = fixturegen_video.build_clips(FIXTURES / "video")["mp4_silent_small"].read_bytes()
        avi = {"name": "desk.avi", "mimeType": "video/x-msvideo", "buffer": b"RIFF" + bytes(60)}
        videos.set_input_files(files=[{"name": "desk.mp4", "mimeType": "video/mp4", "buffer": clip}, avi])
        playwright_sync.expect(page.locator("#media-error")).to_contain_text("Left out desk.avi")
        playwright_sync.expect(page.locator("#media-error")).to_contain_text("MP4, WebM or Matroska")
        assert request_body(page)["assets"]["<video1>"] == {"type": "video", "format": "mp4",
                                                            "data_base64": shortened(clip)}
        playwright_sync.expect(page.locator("#code-python")).to_contain_text("videos are left out")
        # the tiny model hears no audio: the server's 422 (audio_not_supported) is shown, the answers kept, greyed
        page.get_by_role("button", name="Decide").click()
        alert = page.locator("#error")
        playwright_sync.expect(alert).to_contain_text("HTTP 422")
        playwright_sync.expect(alert).to_contain_text("takes no audio")
        playwright_sync.expect(page.locator("#answers")).to_contain_text("the answers to an earlier request")

        # comparing with a model without media hides the inputs and leaves the files out
        choose_model(page, "Compare with", "demo-seed1")
        playwright_sync.expect(images).to_be_hidden()
        playwright_sync.expect(audio).to_be_hidden()
        playwright_sync.expect(videos).to_be_hidden()
        assert "assets" not in request_body(page)
        assert [e for e in p.errors if "422" not in e] == [], p.errors


def test_api_key_field_appears_on_401(browser, auth_server: ClefServer, timed):
    with Page(browser, auth_server.url) as p:
        page = p.page
        key = page.get_by_label("API key")
        playwright_sync.expect(key).to_be_visible()
        playwright_sync.expect(page.locator("#models-status")).to_contain_text("API key")
        key.fill(API_KEY)
        key.dispatch_event("change")
        choose_model(page, "Model", "demo")
        assert page.evaluate("sessionStorage.getItem('clef-bridge.playground.api-key')") == API_KEY
        assert page.evaluate("localStorage.length") == 0
        page.get_by_role("button", name="load an example").click()
        page.get_by_role("button", name="Decide").click()
        playwright_sync.expect(page.get_by_role("meter")).to_have_count(2 + 3 + 5 + 3)
        # the key never lands in the copied code: it reads $CLEF_API_KEY
        page.get_by_role("button", name="Copy as curl").click()
        curl = page.evaluate("navigator.clipboard.readText()")
        assert API_KEY not in curl and '"Authorization: Bearer $CLEF_API_KEY"' in curl
        run = subprocess.run(["bash", "-c", curl], capture_output=True, text=True, timeout=60,
                             env={**os.environ, "CLEF_API_KEY": API_KEY})
        assert run.returncode == 0, run.stdout + run.stderr
        # a wrong key: the 401 is shown as an error, not a blank page
        key.fill("wrong")
        page.get_by_role("button", name="Decide").click()
        playwright_sync.expect(page.locator("#error")).to_contain_text("HTTP 401")
        playwright_sync.expect(page.locator("#error")).to_contain_text("invalid API key")
        assert [e for e in p.errors if "401" not in e] == [], p.errors


def test_hostile_names_show_as_text_and_the_compare_curl_on_screen_quotes_them(browser, auth_server: ClefServer,
                                                                                 tmp_path: Path, timed):
    """Names models.toml refuses (registry_names), listed anyway (a route stands in for /v1/models): the pickers
    show them as text, and the curl commands on screen in compare mode, run by sh against a stub curl, send each
    name exactly and run nothing else (issue 32: the second model's raw name used to sit in a shell comment)."""
    names = ["<img src=x onerror=\"document.title='PWNED'\">", "b'$(touch PWNED)`touch PWNED`\n# \u202e\nJSON\nid"]
    with Page(browser, auth_server.url) as p:
        page = p.page
        page.route("**/v1/models", lambda route: route.fulfill(json={"models": [{"name": n, "x_media": []}
                                                                                 for n in names]}))
        page.reload()
        choose_model(page, "Model", names[0])
        choose_model(page, "Compare with", names[1])
        assert page.eval_on_selector_all("#model option", "els => els.map(e => e.textContent)") == names
        assert page.locator("img").count() == 0 and page.title() != "PWNED"
        shown = page.locator("#code-curl").text_content()
        assert all(line.isprintable() for line in shown.split("\n"))  # the bidi control shows as \u202e
        calls = run_with_stub_curl(shown, tmp_path)
        assert [json.loads(call["stdin"])["model"] for call in calls] == names
        assert not (tmp_path / "PWNED").exists()
        page.get_by_role("button", name="Copy as curl").click()
        copied = page.evaluate("navigator.clipboard.readText()")
        assert copied == shown  # no media: the copy is the screen's text
        assert [e for e in p.errors if "401" not in e] == [], p.errors  # the first load's list, before the route


def test_copy_as_openai_runs_and_answers_as_system_one(browser, server: ClefServer, timed):
    """The openai SDK snippet asks POST /v1/decisions the same questions about the same text: the probabilities
    System One gives, in question order, with the choices' values and the levels' labels."""
    with Page(browser, server.url) as p:
        page = p.page
        choose_model(page, "Model", "demo")
        fill_request(page)
        body = request_body(page)
        status, direct = http("POST", server.url + "/v1/systemone", body)
        assert status == 200, direct
        page.get_by_role("button", name="Copy as OpenAI").click()
        playwright_sync.expect(page.get_by_text("Copied the OpenAI code.")).to_be_visible()
        code = page.evaluate("navigator.clipboard.readText()")
        page.get_by_role("tab", name="Python (openai)").click()
        assert page.get_by_role("tabpanel", name="Python (openai)").text_content() == code
        assert "from openai import OpenAI" in code and f'base_url="{server.url}/v1"' in code
        dump = "print('ANSWERS=' + __import__('json').dumps(decision.model_dump(mode='json')['answers']))"
        run = subprocess.run([sys.executable, "-c", f"{code}\n{dump}\n"], capture_output=True, text=True,
                             timeout=120)
        assert run.returncode == 0, run.stderr
        answers = json.loads(run.stdout.rsplit("ANSWERS=", 1)[1])
        assert [a["name"] for a in answers] == list(direct["answers"])
        for answer, want in zip(answers, direct["answers"].values()):
            # the same prompt; a prefix-cache hit may move the 4th decimal
            if "noul" in want:
                assert answer["probability"] == pytest.approx(want["noul"], abs=2e-4)
            else:
                assert [x["probability"] for x in answer["probabilities"]] == pytest.approx(
                    list(want["probabilities"].values()), abs=2e-4)
        assert p.errors == [], p.errors
