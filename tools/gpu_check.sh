#!/bin/sh
# GPU path check for a CUDA machine: builds llama-cpp-python with CUDA and CuPy into .venv-gpu, then
# serves a random Qwen3.5-shaped backbone (hidden 4096) with a Clef-flash-shaped head on the GPU,
# checks that its answers equal the CPU's (tolerance in tools/gpu_check.py) and prints p50 latency
# for a ~750-token request with the head on CuPy and on numpy. Exit 0 when every answer is within
# tolerance. Needs nvcc (CUDA toolkit) and a driver; about 10 minutes to build.
set -eu
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
[ -x .venv-gpu/bin/python ] || "$PY" -m venv .venv-gpu
. .venv-gpu/bin/activate
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv
export CMAKE_BUILD_PARALLEL_LEVEL="${CMAKE_BUILD_PARALLEL_LEVEL:-$(nproc)}"
if ! python -c 'import llama_cpp, sys; sys.exit(not llama_cpp.llama_supports_gpu_offload())' 2>/dev/null; then
  CMAKE_ARGS="-DGGML_CUDA=on" python -m pip install --quiet --no-cache-dir --force-reinstall --no-binary llama-cpp-python \
    llama-cpp-python==0.3.36
fi
python -m pip install --quiet -e '.[cuda]'
python -c 'import cupy; print("cupy", cupy.__version__, cupy.cuda.runtime.getDeviceCount(), "device(s)")'
# gpu_check.py: the comparison and the timings
exec python -m clef_bridge.tools.gpu_check "$@"
