#!/bin/sh
# Install clef-bridge with its test extra into .venv, then run the test suite.
# Needs only Python >= 3.11, gcc and cmake: llama-cpp-python builds from source here.
# Generated fixtures (tiny models, GGUFs, heads) land in .fixtures/ and are reused.
set -eu
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
[ -x .venv/bin/python ] || "$PY" -m venv .venv
. .venv/bin/activate
export CMAKE_BUILD_PARALLEL_LEVEL="${CMAKE_BUILD_PARALLEL_LEVEL:-$(nproc 2>/dev/null || echo 2)}"
SDIST=.fixtures/sdist/llama_cpp_python-0.3.36.tar.gz
if [ ! -f "$SDIST" ]; then
  # one download serves both the build and the fixtures (convert_hf_to_gguf.py, the Qwen3.5 vocab)
  python -m pip download --quiet --no-deps --no-binary :all: -d .fixtures/sdist llama-cpp-python==0.3.36
fi
if ! python -c 'import llama_cpp, sys; sys.exit(llama_cpp.__version__ != "0.3.36")' 2>/dev/null; then
  echo "building llama-cpp-python 0.3.36 from source: about 8 minutes on 2 idle cores, 12 to 15 on busy ones, silent"
  python -m pip install --quiet "$SDIST"
fi
# the ray extra too: tests/test_ray_serve.py runs Ray Serve replicas (about 1 minute to install, 1.5 to 2 to test)
python -m pip install --quiet -e '.[test,ray]'
python -m pip install --quiet --no-deps clef-finetune==0.1.0
# tests/test_playground.py drives Debian's Chromium through Playwright (the test extra's driver, never
# `playwright install`); CI runs as root on Debian
command -v chromium >/dev/null || { apt-get update && apt-get install -y --no-install-recommends chromium; }
# Cloudflare's clef-omni reference (tests/omni_reference.py takes one file out of it; Requires-Python >= 3.12)
[ -f .fixtures/wheels/ollajev-0.4.0-py3-none-any.whl ] || python -m pip download --quiet --no-deps \
  --python-version 3.12 --only-binary=:all: ollajev==0.4.0 -d .fixtures/wheels
exec python -m pytest "$@"
