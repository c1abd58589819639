#!/bin/sh
# Prepare .gpu/ for tools/gpu_check.sh on a CUDA machine that cannot reach a package index (the
# device tool's H200): llama-cpp-python 0.3.36's source without what a CUDA build never reads
# (llama.cpp's docs, examples, tests, other backends, test vocabularies but Qwen's), and wheels of
# the dependencies a bare CUDA image lacks, for its Python (3.12, x86-64). About 15 MB.
#   sh tools/gpu_bundle.sh [SDIST]   (default: the tests' copy in .fixtures/sdist, else pip downloads it)
set -eu
cd "$(dirname "$0")/.."
OUT=${GPU_BUNDLE:-.gpu}
PYVER=${GPU_PYTHON_VERSION:-3.12}
SDIST=${1:-.fixtures/sdist/llama_cpp_python-0.3.36.tar.gz}
# what clef-bridge and llama-cpp-python import that the CUDA image (CuPy, numpy, aiohttp, ...) lacks
WHEELS="gguf==0.19.0 orjson==3.13.0 tomlkit==0.15.2 diskcache==5.6.3 backports.zstd==1.8.0"
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT
if [ ! -f "$SDIST" ]; then
  python3 -m pip download -q --no-deps --no-binary :all: -d "$TMP" llama-cpp-python==0.3.36
  SDIST=$(ls "$TMP"/llama_cpp_python-*.tar.gz)
fi
tar -xzf "$SDIST" -C "$TMP"
NAME=$(basename "$SDIST" .tar.gz)
V="$TMP/$NAME/vendor/llama.cpp"
mv "$V/models/ggml-vocab-qwen35.gguf" "$TMP/vocab.gguf"
rm -rf "$V/models" "$V/docs" "$V/media" "$V/benches" "$V/.github" "$V/examples" "$V/tests" "$V/gguf-py" \
  "$V/conversion" "$V/scripts"
mkdir "$V/models" && mv "$TMP/vocab.gguf" "$V/models/ggml-vocab-qwen35.gguf"
rm -rf "$TMP/$NAME/.git" "$TMP/$NAME/examples" "$TMP/$NAME/tests"  # a source checkout's sdist may carry its .git
find "$V/tools" -mindepth 1 -maxdepth 1 ! -name mtmd -exec rm -rf {} +  # llama-cpp-python builds mtmd alone
for backend in "$V"/ggml/src/ggml-*/; do
  case $(basename "$backend") in ggml-cpu|ggml-cuda) ;; *) rm -rf "$backend" ;; esac
done
rm -rf "$OUT"
mkdir -p "$OUT/wheels"
tar -czf "$OUT/$NAME.tar.gz" -C "$TMP" "$NAME"
# shellcheck disable=SC2086 - one argument per wheel
python3 -m pip download -q --no-deps --only-binary=:all: --python-version "$PYVER" --implementation cp \
  --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
  -d "$OUT/wheels" $WHEELS
du -sh "$OUT"
ls "$OUT" "$OUT/wheels"
