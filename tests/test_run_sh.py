"""tests/run.sh, run against stand-ins for python and apt-get: it says what it will do (root for apt-get,
clef-bridge reinstalled in editable mode, the ten-second unit check) and each phase as it starts, on
stderr only, so that `sh tests/run.sh -q` (.ci/run) prints pytest's output alone on stdout."""

from __future__ import annotations

import os
import shutil
import stat
import subprocess
from pathlib import Path

import pytest

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parent.parent
# each stand-in writes "ran: NAME ARGS" to stderr, between run.sh's messages; `python -c` (is llama_cpp
# 0.3.36 there?) answers $LLAMA_THERE
STAND_IN = """#!/bin/sh
echo "ran: $(basename "$0") $*" >&2
[ "$1" != -c ] || exit "${LLAMA_THERE:-1}"
"""


def run_sh(tmp_path: Path, *args: str, **env: str) -> subprocess.CompletedProcess:
    (tmp_path / "tests").mkdir(exist_ok=True)
    shutil.copy(ROOT / "tests" / "run.sh", tmp_path / "tests" / "run.sh")
    bin_dir = tmp_path / ".venv" / "bin"
    bin_dir.mkdir(parents=True, exist_ok=True)
    (bin_dir / "activate").write_text(f'PATH="{bin_dir}:$PATH"\n')
    for name in ("python", "apt-get"):
        (bin_dir / name).write_text(STAND_IN)
        (bin_dir / name).chmod(stat.S_IRWXU)
    return subprocess.run(["sh", "tests/run.sh", *args], cwd=tmp_path, capture_output=True, text=True, timeout=60,
                          env={**os.environ, **env})


def lines_from(stderr: str, *starts: str) -> list[int]:
    """The index of the first stderr line starting with each of starts."""
    lines = stderr.splitlines()
    return [next(i for i, line in enumerate(lines) if line.startswith(start)) for start in starts]


def test_run_sh_says_each_phase_before_it_starts_and_only_on_stderr(tmp_path):
    done = run_sh(tmp_path, "-q", CHROMIUM=str(tmp_path / "no-chromium"))
    assert done.returncode == 0 and done.stdout == "", done
    first = done.stderr.splitlines()[0]
    assert first.startswith("tests/run.sh: installs clef-bridge from this checkout in editable mode into .venv")
    assert "needs root" in first and "apt-get" in first and "'.venv/bin/python -m pytest -m unit'" in first
    order = lines_from(done.stderr, "tests/run.sh: [1/4] Chromium: ", "ran: apt-get update",
                       "tests/run.sh: [2/4] build: llama-cpp-python 0.3.36 from source",
                       "ran: python -m pip install --quiet .fixtures/sdist/", "tests/run.sh: [3/4] extras: ",
                       "ran: python -m pip install --quiet -e .[test,ray]", "tests/run.sh: [4/4] the suite: ",
                       "ran: python -m pytest -q")
    assert order == sorted(order), done.stderr
    assert "needs root" in done.stderr.splitlines()[order[0]]


def test_run_sh_says_what_it_skips(tmp_path):
    chromium = tmp_path / "chromium"
    chromium.write_text("#!/bin/sh\n")
    chromium.chmod(stat.S_IRWXU)
    done = run_sh(tmp_path, CHROMIUM=str(chromium), LLAMA_THERE="0")
    assert done.returncode == 0 and done.stdout == "", done
    assert f"[1/4] Chromium: {chromium} is there" in done.stderr and "ran: apt-get" not in done.stderr
    assert "[2/4] build: llama-cpp-python 0.3.36 is in .venv already" in done.stderr
    assert "[4/4] the suite: python -m pytest: about 2,400 tests" in done.stderr
