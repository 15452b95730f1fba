#!/bin/sh
# The one prepared GPU run, on the GPU machine (see `tvm-ext gpu-run --help` and bench/README.md).
#
#   bash scripts/gpu_run.sh RUN_DIR [OUT] [--dry-run] [--deadline S]
#
# RUN_DIR: written here by `tvm-ext gpu-run prepare --out RUN_DIR` and carried to the GPU machine.
# OUT: where results go (default $OUT, the device tool's folder that comes back).
# Needs only python3 with numpy there: the harness is RUN_DIR/python, the TVM runtime
# RUN_DIR/runtime (unpacked once). Each step runs in its own process with its own time limit.
# Back here: `tvm-ext gpu-run ingest OUT --run RUN_DIR` puts the results into bench/.
set -u
[ $# -ge 1 ] || { echo "usage: $0 RUN_DIR [OUT] [executor options]" >&2; exit 2; }
RUN=$(cd "$1" && pwd); shift
case "${1:-}" in ''|-*) DEST=${OUT:?give OUT or set \$OUT} ;; *) DEST=$1; shift ;; esac
mkdir -p "$DEST"
PY=${PYTHON:-python3}
PYTHONPATH="$RUN/python${PYTHONPATH:+:$PYTHONPATH}" exec "$PY" -m tvm_ext.bench.gpu_execute "$RUN" --out "$DEST" \
    --python "$PY" "$@"
