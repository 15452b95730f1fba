#!/bin/sh
# Pack a runtime-only TVM for a GPU machine that has Python but no compiler or package index.
#
#   scripts/pack_runtime.sh OUT_DIR [--python 3.12] [--wheel-dir DIR] [--no-cudart]
#
# Writes into OUT_DIR:
#   tvm_runtime.tar.gz   the installed `tvm` package without libtvm_compiler.so, 3rdparty/,
#                        include/, src/ and caches, plus the CUDA runtime libcudart.so.13 next to
#                        libtvm_runtime_cuda.so (found there through its $ORIGIN runpath)
#   apache_tvm_ffi-*.whl the apache-tvm-ffi wheel (same version as installed here) for the
#                        target Python; taken from --wheel-dir (default: <repo>/.whl) or
#                        downloaded once with `pip download` into it
#   runtime.json         what was packed
# On the GPU machine: untar into a directory, unzip the wheel into the same directory
# (python3 -m zipfile -e WHEEL DIR), put it on PYTHONPATH and set TVM_USE_RUNTIME_LIB=1
# (a bundle's run.sh does all of this). The GPU machine needs numpy, typing_extensions and
# ml_dtypes in its Python, and the NVIDIA driver (libcuda.so.1).
set -eu

usage() { echo "usage: $0 OUT_DIR [--python 3.12] [--wheel-dir DIR] [--no-cudart]" >&2; exit 2; }
[ $# -ge 1 ] || usage
OUT=$1; shift
PYV=3.12
REPO=$(cd "$(dirname "$0")/.." && pwd)
WHEELS="$REPO/.whl"
CUDART=1
while [ $# -gt 0 ]; do
  case "$1" in
    --python) [ $# -ge 2 ] || usage; PYV=$2; shift 2 ;;
    --wheel-dir) [ $# -ge 2 ] || usage; WHEELS=$2; shift 2 ;;
    --no-cudart) CUDART=0; shift ;;
    *) usage ;;
  esac
done
case "$PYV" in
  3.[0-9]|3.[0-9][0-9]) ;;
  *) echo "error: --python wants a version like 3.12, got '$PYV'" >&2; exit 2 ;;
esac
PY=${PYTHON:-python3}

# Where tvm and tvm_ffi are installed, and the ffi version (found without importing tvm).
TVM_DIR=$("$PY" -c "import importlib.util as u; print(list(u.find_spec('tvm').submodule_search_locations)[0])")
FFI_VERSION=$("$PY" -c "import importlib.metadata as m; print(m.version('apache-tvm-ffi'))")
TVM_VERSION=$("$PY" -c "import importlib.metadata as m; print(m.version('apache-tvm'))")
[ -f "$TVM_DIR/lib/libtvm_runtime.so" ] || { echo "error: $TVM_DIR has no lib/libtvm_runtime.so" >&2; exit 1; }

mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)
STAGE=$(mktemp -d)
trap 'rm -rf "$STAGE"' EXIT

# 1. the tvm package, runtime only
mkdir -p "$STAGE/tvm"
(cd "$TVM_DIR" && tar -cf - --exclude='./lib/libtvm_compiler.so' --exclude='./3rdparty' --exclude='./include' \
    --exclude='./src' --exclude='__pycache__' --exclude='*.pyc' .) | (cd "$STAGE/tvm" && tar -xf -)
CUDART_FILE=none
if [ "$CUDART" = 1 ]; then
  # The toolkit: $CUDA_PATH, $CUDA_HOME, else the TOP nvcc reports (right through wrapper scripts),
  # as tvm_ext.toolchain.cuda finds it (tvm_ext passes CUDA_PATH when it runs this script).
  NVCC_TOP=
  if command -v nvcc >/dev/null 2>&1; then
    NVCC_TOP=$(nvcc -v --dryrun -x cu -c /dev/null -o /dev/null 2>&1 | sed -n 's/^#\$ TOP=//p' | head -n 1)
  fi
  for d in "${CUDA_PATH:-}" "${CUDA_HOME:-}" "$NVCC_TOP"; do
    for sub in lib64 lib targets/x86_64-linux/lib; do
      if [ -n "$d" ] && [ -f "$d/$sub/libcudart.so.13" ]; then
        cp -L "$d/$sub/libcudart.so.13" "$STAGE/tvm/lib/"; CUDART_FILE="$d/$sub/libcudart.so.13"; break 2
      fi
    done
  done
  [ "$CUDART_FILE" != none ] || echo "warning: libcudart.so.13 not found; the GPU machine must provide it" >&2
fi
tar -czf "$OUT/tvm_runtime.tar.gz" -C "$STAGE" tvm

# 2. the apache-tvm-ffi wheel for the target Python
TAG=cp$(echo "$PYV" | tr -d .)
mkdir -p "$WHEELS"
WHEEL=$(ls "$WHEELS"/apache_tvm_ffi-"$FFI_VERSION"-"$TAG"-*.whl 2>/dev/null | head -n 1 || true)
if [ -z "$WHEEL" ]; then
  "$PY" -m pip download --quiet --no-deps --only-binary=:all: --python-version "$PYV" --implementation cp \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_24_x86_64 --platform manylinux_2_17_x86_64 \
    -d "$WHEELS" "apache-tvm-ffi==$FFI_VERSION" >&2 \
    || { echo "error: no apache-tvm-ffi $FFI_VERSION wheel for Python $PYV in $WHEELS and pip download failed" >&2; exit 1; }
  WHEEL=$(ls "$WHEELS"/apache_tvm_ffi-"$FFI_VERSION"-"$TAG"-*.whl | head -n 1)
fi
rm -f "$OUT"/apache_tvm_ffi-*.whl
cp "$WHEEL" "$OUT/"

# 3. what was packed
cat > "$OUT/runtime.json" <<EOF
{"tvm_version": "$TVM_VERSION", "ffi_version": "$FFI_VERSION", "python": "$PYV",
 "archive": "runtime/tvm_runtime.tar.gz", "ffi_wheel": "runtime/$(basename "$WHEEL")",
 "cudart": "$(basename "$CUDART_FILE")",
 "excluded": ["lib/libtvm_compiler.so", "3rdparty/", "include/", "src/", "__pycache__/"]}
EOF
echo "packed TVM $TVM_VERSION runtime ($(du -k "$OUT/tvm_runtime.tar.gz" | cut -f1) KiB) and $(basename "$WHEEL") ($(du -k "$OUT/$(basename "$WHEEL")" | cut -f1) KiB) into $OUT"
