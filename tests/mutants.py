"""A small mutation check: named bugs put into a temporary copy of the tree, each run against its tests.

    .venv/bin/python -m tests.mutants [--list] [--only NAME ...] [--level LEVEL] [--by-level] [--keep]

Each mutant is one (file, old text, new text) edit, applied to a copy of the tree in a temporary
folder (the checkout is never written), where the tests named for it run with `-x`: a failing test
kills it, a passing run lets it survive. --level runs only the tests of a level and those below it
(unit: `-m unit`; integration: `-m "not slow"`; all, the default: every test named); --by-level runs
each mutant's unit tests first, then, where it survived, up to integration, then all (up to --level),
and prints how many each level kills. The copy imports its own code (a PYTHONPATH folder maps
clef_bridge.* onto the copy, ahead of the editable install) and shares the checkout's .fixtures/.
Prints one line per mutant and the kill rate; exits 1 when a mutant survived or no longer applies
(its old text is gone: update the list). About 4 minutes on 2 cores, the passing baselines included.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
RUN_LIMIT_S = 900  # one mutant's test run; a run that hangs this long counts as killed (CI's timeout would)


@dataclass(frozen=True)
class Mutant:
    name: str
    file: str
    old: str
    new: str
    tests: tuple[str, ...]  # pytest arguments: files, node ids, -k expressions


ANSWER = ("tests/test_answer_math.py", "tests/test_pipeline.py")
HEAD = ("tests/test_head_parity.py", "tests/test_head_pooling.py")
PREFIX = ("tests/test_prefix_property.py", "tests/test_prefix_cache.py")
INTEGRITY = ("tests/test_integrity.py",)
HEADERS = ("tests/test_header_decoder.py", "tests/test_server_adversarial.py", "-k", "utf8 or header")
AUDIO = ("tests/test_audio_tower.py",)
VIDEO_LIMITS = ("tests/test_media_limits.py", "tests/test_video_headers.py", "tests/test_media_boundaries.py")
MEDIA_BYTES = ("tests/test_media_limits.py", "tests/test_video_headers.py")
WAV_CHUNKS = ("tests/test_media_limits.py", "tests/test_media_headers.py", "tests/test_media_boundaries.py")
DECODE_KIND = ("tests/test_media_limits.py",
               "tests/test_decoders.py::test_the_service_gives_each_kind_its_own_time_limit")
VIDEO_POSITIONS = ("tests/test_video_prompt.py", "tests/test_video_positions.py")
LEVELS = {"unit": ("-m", "unit"), "integration": ("-m", "not slow"), "all": ()}  # each level includes those before
LEVEL_NAMES = {"unit": "unit", "integration": "unit + integration", "all": "all (slow included)"}

MUTANTS = (
    # the answer math (head/answer.py)
    Mutant("temperature: type key before bucket key", "head/answer.py",
           'self.temperature.get(f"{kind}.{bucket}", self.temperature.get(kind, 1.0))',
           'self.temperature.get(kind, self.temperature.get(f"{kind}.{bucket}", 1.0))', ANSWER),
    Mutant("temperature: bucket bound 5 -> 4", "head/answer.py", '("3_5", 5)', '("3_5", 4)', ANSWER),
    Mutant("temperature: bucket bound 10 -> 11", "head/answer.py", '("6_10", 10)', '("6_10", 11)', ANSWER),
    Mutant("temperature: divided by T^2", "head/answer.py",
           "options.temperature_for(q.type, end - start))", "options.temperature_for(q.type, end - start) ** 2)",
           ANSWER),
    Mutant("softmax: z * T", "head/answer.py", "e = np.exp((z - z.max()) / temperature)",
           "e = np.exp((z - z.max()) * temperature)", ANSWER),
    Mutant("score: levels counted from 1", "head/answer.py", "sum(i * p for i, p in enumerate(ordered))",
           "sum((i + 1) * p for i, p in enumerate(ordered))", ANSWER),
    Mutant("choice: a tie goes to the last option", "head/answer.py",
           "best = question.answer_keys[int(ordered.argmax())]",
           "best = question.answer_keys[len(ordered) - 1 - int(ordered[::-1].argmax())]", ANSWER),
    Mutant("choice: confidence of the last option", "head/answer.py",
           'conf = by_id[best] if confidence == "reference"', 'conf = float(ordered[-1]) if confidence == "reference"',
           ANSWER),
    Mutant("jev score confidence: spread of the median level", "head/answer.py",
           "(p * np.abs(levels - p.argmax())).sum()", "(p * np.abs(levels - (n - 1) / 2)).sum()", ANSWER),
    Mutant("noul: p(false) served", "head/answer.py", 'round(by_id["true"], 4)', 'round(by_id["false"], 4)',
           ANSWER),
    # the head (head/)
    Mutant("head: routing scores unscaled", "head/model.py",
           "scores = (base @ options.T) / np.float32(math.sqrt(options.shape[-1]))",
           "scores = base @ options.T", HEAD),
    Mutant("head: logit scales clamped at e^5", "head/model.py",
           "prior_scale = xp.exp(xp.minimum(prior_logit_scale, LOG_100))",
           "prior_scale = xp.exp(xp.minimum(prior_logit_scale, 5.0))", HEAD),
    Mutant("head: LayerNorm eps 1e-3", "head/model.py", "def layer_norm(x, weight, bias, eps=1e-5):",
           "def layer_norm(x, weight, bias, eps=1e-3):", HEAD),
    Mutant("schema: choices in reverse code-point order", "head/schema.py",
           'return sorted(keys) if qtype == "choice"', 'return sorted(keys, reverse=True) if qtype == "choice"',
           ("tests/test_answer_math.py", "tests/test_pipeline.py")),
    # the prefix cache (bridge/llama/)
    Mutant("prefix: a follower joins 8 tokens past the divergence", "bridge/llama/prefix_cache.py",
           "c <= common and c < len(p.tokens)", "c <= common + 8 and c < len(p.tokens)", PREFIX),
    Mutant("prefix: a hit restores one KV cell short", "bridge/llama/prefix_cache.py",
           "self.memory.copy_cells(plan.source.seq, i, 0, plan.reused)",
           "self.memory.copy_cells(plan.source.seq, i, 0, plan.reused - 1)", PREFIX),
    Mutant("prefix: a checkpoint matches on its last token only", "bridge/llama/prefix_tree.py",
           "np.array_equal(child.segment, tokens[node.pos:child.pos])",
           "np.array_equal(child.segment[-1:], tokens[child.pos - 1:child.pos])", PREFIX),
    # the validator (bridge/config/integrity.py)
    Mutant("validator: a head of another hidden size passes", "bridge/config/integrity.py",
           "if isinstance(n_embd, int) and cfg.hidden_size != n_embd:",
           "if isinstance(n_embd, int) and cfg.hidden_size != n_embd and False:", INTEGRITY),
    Mutant("validator: NaN head tensors pass", "bridge/config/integrity.py",
           "bad = [n for n, t in tensors.items() if not np.isfinite(t).all()]", "bad = []", INTEGRITY),
    Mutant("validator: a headless GGUF passes", "bridge/config/integrity.py",
           "    if head is None:\n        report.add(\"error\", \"pair.headless\"",
           "    if head is None and False:\n        report.add(\"error\", \"pair.headless\"", INTEGRITY),
    Mutant("validator: a fine-tuned backbone's canary drift passes", "bridge/config/integrity.py",
           "        if drift > MAX_STATE_DRIFT:", "        if drift > 10 * MAX_STATE_DRIFT:", INTEGRITY),
    Mutant("validator: pins compared by prefix", "bridge/config/integrity.py",
           "if actual != pin.lower():", "if not actual.startswith(pin.lower()[:8]):", INTEGRITY),
    # the header decoder (bridge/server/body.py)
    Mutant("headers: undecodable bytes replaced, not refused", "bridge/server/body.py",
           'return value.encode("utf-8", "surrogateescape").decode("utf-8")',
           'return value.encode("utf-8", "surrogateescape").decode("utf-8", "replace")', HEADERS),
    Mutant("headers: non-ASCII read as Latin-1", "bridge/server/body.py",
           'return value.encode("utf-8", "surrogateescape").decode("utf-8")',
           'return value.encode("utf-8", "surrogateescape").decode("latin-1")', HEADERS),
    # the audio front end (bridge/media/audio_tower.py): each passed the whole suite before test_audio_tower.py
    Mutant("audio: log-mel floor at max - 7", "bridge/media/audio_tower.py",
           "log_spec = xp.maximum(log_spec, log_spec.max() - 8.0)",
           "log_spec = xp.maximum(log_spec, log_spec.max() - 7.0)", AUDIO),
    Mutant("audio: a symmetric Hann window", "bridge/media/audio_tower.py",
           "window = (0.5 - 0.5 * xp.cos(2 * math.pi * xp.arange(N_FFT) / N_FFT)).astype(xp.float32)",
           "window = xp.hanning(N_FFT).astype(xp.float32)", AUDIO),
    # media limits (bridge/media/): each passed the whole suite before issue 41's tests
    Mutant("video: a clip of exactly max_video_seconds refused", "bridge/media/video.py",
           "header.duration_s is not None and header.duration_s > limits.max_seconds",
           "header.duration_s is not None and header.duration_s >= limits.max_seconds", VIDEO_LIMITS),
    Mutant("video: exactly 120 frames per allowed second refused", "bridge/media/video.py",
           "header.frames and header.frames > MAX_SOURCE_FPS * limits.max_seconds",
           "header.frames and header.frames >= MAX_SOURCE_FPS * limits.max_seconds", VIDEO_LIMITS),
    Mutant("video: a soundtrack may not outlast its frames", "bridge/media/video.py",
           "round((limits.max_seconds + 1) * SAMPLE_RATE)", "round(limits.max_seconds * SAMPLE_RATE)", VIDEO_LIMITS),
    Mutant("media: max_media_bytes counts the videos alone", "bridge/media/request.py",
           "sum(len(d) for s in sources.values() for _, d in s)", "sum(len(d) for _, d in sources[VIDEO])",
           MEDIA_BYTES),
    Mutant("media: max_media_bytes leaves the audio out", "bridge/media/request.py",
           "sum(len(d) for s in sources.values() for _, d in s)",
           "sum(len(d) for k in (IMAGE, VIDEO) for _, d in sources[k])", MEDIA_BYTES),
    Mutant("wav: an odd-sized chunk's pad byte read as the next chunk", "bridge/media/audio.py",
           "at += 8 + size + (size & 1)", "at += 8 + size", WAV_CHUNKS),
    # the decoder pool's time limits (bridge/service/decision.py, bridge/media/decoders.py)
    Mutant("service: a video decoded under the audio time limit", "bridge/service/decision.py",
           "inputs[0].loc[:2],\n                                                      kind)", "inputs[0].loc[:2])",
           DECODE_KIND),
    Mutant("decoders: one time limit for every kind", "bridge/media/decoders.py",
           "return self.video_seconds if kind == VIDEO.name else self.seconds", "return self.seconds",
           ("tests/test_decoders.py",)),
    # a vision model's LoRA fine-tune (bridge/llama/adapters.py)
    Mutant("lora: an image request runs the last model's adapter", "bridge/llama/adapters.py",
           "        with self.shared.lock:\n            self.shared.select(self.adapter)\n"
           "            return self.shared.backbone.decode_media(chunks)",
           "        with self.shared.lock:\n            return self.shared.backbone.decode_media(chunks)",
           ("tests/test_lora_vision.py",)),
    # video positions (bridge/llama/omni_positions.py, bridge/media/video.py)
    Mutant("video positions: rows and columns swapped", "bridge/llama/omni_positions.py",
           "rows, cols = h // merge, w // merge", "cols, rows = h // merge, w // merge", VIDEO_POSITIONS),
    Mutant("video: seconds per grid at the processor's default fps (1.0)", "bridge/media/video.py",
           "return 2 / FPS", "return 2 / 1.0", VIDEO_POSITIONS),
)


def copy_tree(dest: Path) -> None:
    """The checkout's tracked and untracked-but-not-ignored files; .fixtures/ shared by a link."""
    listed = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"], cwd=ROOT,
                            capture_output=True, check=True).stdout.decode().split("\0")
    for name in filter(None, listed):
        src = ROOT / name
        if src.is_file():
            (dest / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, dest / name)
    fixtures = ROOT / ".fixtures"
    fixtures.mkdir(exist_ok=True)
    (dest / ".fixtures").symlink_to(fixtures.resolve())
    site = dest / ".mutant-site" / "clef_bridge"  # clef_bridge.* from the copy, ahead of the editable install
    site.mkdir(parents=True)
    for part in ("bridge", "head", "tools"):
        (site / part).symlink_to(dest / part)


def run_tests(tree: Path, tests: tuple[str, ...], level: str = "all") -> tuple[str, float]:
    """'killed' (a test failed or the run hung), 'survived' (none failed, or none is of this level), or 'broken'
    (pytest could not run them)."""
    env = dict(os.environ, PYTHONPATH=str(tree / ".mutant-site"), PYTHONDONTWRITEBYTECODE="1")
    started = time.monotonic()
    try:
        done = subprocess.run([sys.executable, "-m", "pytest", "-x", "-q", "-p", "no:cacheprovider", *LEVELS[level],
                               *tests], cwd=tree, env=env, capture_output=True, text=True, timeout=RUN_LIMIT_S)
    except subprocess.TimeoutExpired:
        return "killed", time.monotonic() - started
    seconds = time.monotonic() - started
    if done.returncode == 1:
        return "killed", seconds
    if done.returncode in (0, 5):  # 5: every test named is of a higher level, so none ran
        return "survived", seconds
    return f"broken (pytest exit {done.returncode}: {done.stdout.strip().splitlines()[-1:]})", seconds


def check_imports_the_copy(tree: Path) -> None:
    """Refuse to report anything if the copy's tests would import the checkout's code."""
    env = dict(os.environ, PYTHONPATH=str(tree / ".mutant-site"))
    where = subprocess.run([sys.executable, "-c", "import clef_bridge.head.answer as a; print(a.__file__)"],
                           cwd=tree, env=env, capture_output=True, text=True, check=True).stdout.strip()
    if not Path(where).resolve().is_relative_to(tree.resolve()):
        raise SystemExit(f"the copy imports {where}, not its own code: mutants would test the checkout")


def run_mutant(tree: Path, m: Mutant, levels: list[str]) -> str:
    """The mutant's outcome at the first level (of levels, lowest first) whose tests kill it, else at the last."""
    target = tree / m.file
    original = target.read_text()
    if original.count(m.old) != 1:
        return f"stale ({m.file} holds its old text {original.count(m.old)} times)"
    target.write_text(original.replace(m.old, m.new))
    try:
        for level in levels:
            outcome, seconds = run_tests(tree, m.tests, level)
            if outcome != "survived":
                break
    finally:
        target.write_text(original)
    return f"{outcome} in {seconds:.0f} s" + (f" ({level})" if outcome == "killed" else "")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.mutants", description=__doc__.split("\n")[0])
    parser.add_argument("--list", action="store_true", help="print the mutants and their tests, run nothing")
    parser.add_argument("--only", nargs="+", metavar="TEXT", help="run the mutants whose name contains TEXT")
    parser.add_argument("--level", choices=list(LEVELS), default="all",
                        help="run the tests of this level and those below it (unit, unit + integration, all)")
    parser.add_argument("--by-level", action="store_true",
                        help="run each mutant's unit tests first, then up to integration, then all (up to --level), "
                             "and count the kills of each level")
    parser.add_argument("--keep", action="store_true", help="keep the temporary tree (its path is printed)")
    args = parser.parse_args(argv)
    chosen = [m for m in MUTANTS if not args.only or any(t in m.name for t in args.only)]
    if not chosen:
        parser.error(f"no mutant's name contains {args.only}; --list shows them")
    if args.list:
        for m in chosen:
            print(f"{m.name}  [{m.file}]  -> pytest {' '.join(m.tests)}")
        return 0
    top = list(LEVELS).index(args.level)
    levels = list(LEVELS)[:top + 1] if args.by_level else [args.level]
    tree = Path(tempfile.mkdtemp(prefix="clef-mutants-"))
    results: list[tuple[Mutant, str]] = []
    try:
        copy_tree(tree)
        check_imports_the_copy(tree)
        for tests in dict.fromkeys(m.tests for m in chosen):  # each set must pass before it can kill anything
            outcome, seconds = run_tests(tree, tests, args.level)
            print(f"baseline {'passed' if outcome == 'survived' else outcome} in {seconds:.0f} s: "
                  f"pytest {' '.join(LEVELS[args.level] + tests)}", flush=True)
            if outcome != "survived":
                raise SystemExit("the unmutated tree fails these tests: fix them first, or no kill means anything")
        for m in chosen:
            results.append((m, run_mutant(tree, m, levels)))
            print(f"{results[-1][1]:<36} {m.name}", flush=True)
    finally:
        if args.keep:
            print(f"tree kept at {tree}")
        else:
            shutil.rmtree(tree, ignore_errors=True)
    killed = sum(r.startswith("killed") for _, r in results)
    if args.by_level:
        for i, level in enumerate(levels):
            upto = sum(any(r.endswith(f"({lv})") for lv in levels[:i + 1]) for _, r in results)
            print(f"killed by the {LEVEL_NAMES[level]} tests: {upto} of {len(results)}")
    print(f"killed {killed} of {len(results)} mutants ({100 * killed / len(results):.0f}%) at level {args.level}")
    for m, r in results:
        if not r.startswith("killed"):
            print(f"  not killed: {m.name}: {r}")
    return 0 if killed == len(results) else 1


if __name__ == "__main__":
    sys.exit(main())
