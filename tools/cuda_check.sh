#!/usr/bin/env bash
# The harness on a real CUDA GPU, against the CPU, in one prepared script for a machine lent for
# minutes: every step has its own time limit (SIGINT, so a run stops resumable and keeps what it
# recorded), a step that fails does not stop the next, and everything lands in OUTDIR:
#   env.txt        torch, CUDA, the GPU
#   STEP.log       what each step printed, with its exit status and seconds
#   cuda.sqlite.gz the opdb of every run (conformance report --db ... renders it anywhere)
#   errors.txt / errors.json   the ops run's failing items grouped into causes
#
# Usage: tools/cuda_check.sh OUTDIR
# Env:   PYTHON (python3), WORKERS (cores - 2), TARGET (cuda), DTYPES, OPS_S / MODELS_S / GENERIC_S
#        (each step's seconds), MODEL_LIMIT (graphs per family).
# The machine needs torch with CUDA plus the harness's own dependencies (sqlite-utils, jinja2,
# hypothesis, click, expecttest); run it from the repository root.
set -u
OUT=${1:?usage: tools/cuda_check.sh OUTDIR}
PY=${PYTHON:-python3}
N=${WORKERS:-$(( $(nproc) > 3 ? $(nproc) - 2 : 1 ))}
TARGET=${TARGET:-cuda}
DTYPES=${DTYPES:-float32,bfloat16,float16,int64}
mkdir -p "$OUT"
DB=$OUT/cuda.sqlite
export PYTHONUNBUFFERED=1

{
  date -u
  $PY -c "import torch; print('torch', torch.__version__, 'cuda', torch.version.cuda, 'available', torch.cuda.is_available()); torch.cuda.is_available() and print(torch.cuda.get_device_name(0))"
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv 2>&1 || true
  nproc; echo "workers $N"
} 2>&1 | tee "$OUT/env.txt"

step() {  # step NAME SECONDS COMMAND...
  local name=$1 secs=$2 start rc
  shift 2
  echo "== $name (limit ${secs}s): $*"
  start=$(date +%s)
  timeout -s INT -k 30 "$secs" "$@" >"$OUT/$name.log" 2>&1
  rc=$?
  grep -v '^sweep ' "$OUT/$name.log" | tail -40
  echo "== $name rc=$rc in $(( $(date +%s) - start ))s" | tee -a "$OUT/$name.log"
}

C="$PY -m conformance"
step ops "${OPS_S:-240}" $C run --target "$TARGET" --dtypes "$DTYPES" -n "$N" --run-id "$TARGET-ops" \
  --db "$DB" --refcache none --exit-zero
step models "${MODELS_S:-110}" $C run --target "$TARGET" --models all --model-limit "${MODEL_LIMIT:-2}" \
  -n "$N" --run-id "$TARGET-models" --db "$DB" --refcache none --exit-zero
# The device-generic path (dispatcher-watched fallbacks, torch.accelerator sync) on the same GPU.
step generic "${GENERIC_S:-50}" $C run --target "device:$TARGET" --ops 'nn.functional.*' --dtypes float32 \
  --variants function,backward --no-schema -n "$N" --run-id "device-$TARGET-nn" --db "$DB" --refcache none --exit-zero
step errors 60 $C errors --db "$DB" --build "$TARGET-ops" --limit 0
mv "$OUT/errors.log" "$OUT/errors.txt"
$C errors --db "$DB" --build "$TARGET-ops" --json >"$OUT/errors.json" 2>>"$OUT/errors.txt" || true
$C errors --db "$DB" --build "$TARGET-models" --limit 0 >>"$OUT/errors.txt" 2>&1 || true
gzip -f "$DB"
ls -la "$OUT"
