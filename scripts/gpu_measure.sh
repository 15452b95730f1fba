#!/bin/sh
# Measure a benchmark bundle on a GPU machine: whole-model numerics and latency, then one
# Nsight Compute profile per selected build (per-kernel time and DRAM bytes).
#
#   scripts/gpu_measure.sh BUNDLE OUT_DIR [MODEL/SYSTEM ...]
#
# BUNDLE: written by `tvm-ext bench --build-only --out BUNDLE` (with a packed runtime).
# Writes into OUT_DIR:
#   results.jsonl, results.md   `python -m tvm_ext.bench.run` (every build, torch-eager)
#   ncu.tar.gz                   one raw CSV per MODEL/SYSTEM (tvm_ext.bench.kernel_profile under ncu)
#   device.txt                   nvidia-smi and ncu versions
# On the build host: `python3 scripts/kernel_report.py BUNDLE OUT_DIR --device h200` joins the
# profiles with the manifest (measured vs modelled per kernel) and writes database records.
# Environment: RUN_ARGS (extra options of tvm_ext.bench.run, default "--systems ... --torch on"),
# NCU (the ncu binary; default: the one on PATH, else the newest under /opt/nvidia), DEADLINE_S
# (no new profile starts after this many seconds of the script; default 420), RUNTIME_SITE (an
# unpacked runtime-only TVM, for a bundle built with --no-runtime; also put it on PYTHONPATH).
set -u
START=$(date +%s)
[ $# -ge 2 ] || { echo "usage: $0 BUNDLE OUT_DIR [MODEL/SYSTEM ...]" >&2; exit 2; }
BUNDLE=$(cd "$1" && pwd); OUT=$2; shift 2
mkdir -p "$OUT" "$OUT/ncu"
PY=${PYTHON:-python3}

{ nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,clocks.max.mem,memory.total --format=csv
  "$PY" --version; } > "$OUT/device.txt" 2>&1

# 1. whole models: numerics and latency (run.sh unpacks the runtime-only TVM first), one model per
#    process with its own time limit (RUN_TIMEOUT_S, default 150): a kernel that hangs costs one model
SYSTEMS=$("$PY" -c "import json,sys; m=json.load(open(sys.argv[1]+'/manifest.json'));
print(','.join(sorted({b['system'] for e in m['models'] for b in e['builds']}) + ['torch-eager']))" "$BUNDLE")
MODELS=$("$PY" -c "import json,sys; print(' '.join(e['name'] for e in json.load(open(sys.argv[1]+'/manifest.json'))['models']))" "$BUNDLE")
for model in $MODELS; do
  timeout "${RUN_TIMEOUT_S:-150}" "$BUNDLE/run.sh" --models "$model" --systems "$SYSTEMS" --torch on \
      --out "$OUT/results.jsonl" ${RUN_ARGS:-} > "$OUT/run_$model.log" 2>&1
  echo "run $model: exit $?"; tail -n 12 "$OUT/run_$model.log"; rm -f "$OUT/run_$model.log"
done

# 2. one profiled inference per MODEL/SYSTEM, each in its own process under ncu
[ $# -gt 0 ] || exit 0
NCU=${NCU:-$(command -v ncu || ls -d /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | sort | tail -n 1)}
[ -n "$NCU" ] || { echo "no ncu found; per-kernel profiles skipped" >&2; exit 0; }
"$NCU" --version >> "$OUT/device.txt" 2>&1
export PYTHONPATH="${RUNTIME_SITE:-$BUNDLE/runtime/site}:$BUNDLE/python" TVM_USE_RUNTIME_LIB=1 TVM_DEVICE_BACKEND_AUTOLOAD=0
for pair in "$@"; do
  if [ $(( $(date +%s) - START )) -gt "${DEADLINE_S:-420}" ]; then echo "deadline: $pair and later not profiled"; break; fi
  model=${pair%%/*}; system=${pair#*/}
  timeout 60 "$NCU" --profile-from-start off --csv --page raw --print-units base --clock-control none \
      --cache-control all --metrics gpu__time_duration.sum,dram__bytes_read.sum,dram__bytes_write.sum \
      --log-file "$OUT/ncu/${model}__${system}.csv" \
      "$PY" -m tvm_ext.bench.kernel_profile "$BUNDLE" --model "$model" --system "$system" \
      > "$OUT/ncu/${model}__${system}.log" 2>&1
  echo "ncu $model/$system: exit $? ($(grep -c '^"[0-9]' "$OUT/ncu/${model}__${system}.csv" 2>/dev/null) kernels)"
done
tar -czf "$OUT/ncu.tar.gz" -C "$OUT" ncu && rm -rf "$OUT/ncu"
