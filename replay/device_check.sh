#!/usr/bin/env bash
# replay/device_check.sh: check tiersim's torch runner on a CUDA machine with one GPU, and write a table.
#
#   replay/device_check.sh               # on the CUDA machine (from the repository root, after
#                                        #   pip install -e '.[dev]')
#   replay/device_check.sh --cpu-smoke   # tiny versions of every stage on the CPU (what the tests run)
#
# Stages, each bounded by `timeout` and logged to $OUT/<stage>.log (its stdout to $OUT/<stage>.out):
#   env          torch, CUDA and the device (fails at once without CUDA unless --cpu-smoke)
#   calibrate    `tiersim calibrate` of this machine -> $OUT/calibrated.yaml (tiny sizes in the smoke run)
#   plan-<p>     `tiersim simulate` of a small model on the calibrated spec with policy p -> $OUT/plan-<p>.json
#                (zero-infinity-nvme: zero-infinity with its parameters on the nvme tier, files in $OUT)
#   replay-<p>   `tiersim replay --verify --json` of that plan on the device (cuda; cpu in the smoke run)
#   plan-gpt2-<p>, replay-gpt2-<p>  the default workflow (CUDA only): gpt2 at its default workload, policies
#                DEVICE_CHECK_WORKFLOW (default: zero-offload none; empty: none of them), replayed without --verify
#   validation   `python -m replay.validation` (the held-out matrix is its own; --quick in the smoke run;
#                on the device when it takes --device)
#   table        python -m replay.device_check_table: $OUT/table.md (also printed)
# A stage that fails or runs out of time is reported at once on stderr (its name, why, its log and the log's
# tail); env and calibrate stop the script (everything needs them), a failed plan skips its replay, the other
# stages carry on so that one run on a lent machine reports everything. Exit 1 when any stage failed (the table
# and a last line name them), 0 when every stage ran and every --verify held; 2 on bad arguments.
#
# Environment: OUT (default ./device_check_out), PYTHON (default python), DEVICE_CHECK_POLICIES (default: every
# policy; the smoke run: zero-offload), DEVICE_CHECK_TIMEOUT_<STAGE> in seconds (ENV, CALIBRATE, PLAN, REPLAY,
# VALIDATION, TABLE), DEVICE_CHECK_VALIDATION=0 (leave the validation matrix out), DEVICE_CHECK_DRY=1 (print each
# stage's command, run nothing).
set -euo pipefail

MODE=cuda
case "${1:-}" in
  "") ;;
  --cpu-smoke) MODE=smoke ;;
  -h|--help) sed -n '2,/^set -euo/p' "$0" | grep '^#' | sed 's/^# \{0,1\}//'; exit 0 ;;
  *) echo "device_check: unknown argument '$1'; use --cpu-smoke or nothing" >&2; exit 2 ;;
esac

if [ ! -f replay/device_check.sh ] || [ ! -f pyproject.toml ]; then
  echo "device_check: run it from the repository root (replay/device_check.sh)" >&2
  exit 2
fi

PY="${PYTHON:-python}"
OUT="${OUT:-./device_check_out}"
DRY="${DEVICE_CHECK_DRY:-}"
if [ "$MODE" = smoke ]; then
  DEVICE=cpu
  POLICIES="${DEVICE_CHECK_POLICIES:-zero-offload}"
else
  DEVICE=cuda
  POLICIES="${DEVICE_CHECK_POLICIES:-none zero-offload zero-infinity zero-infinity-nvme tinypipe lazytrain synergyscale}"
fi
T_ENV="${DEVICE_CHECK_TIMEOUT_ENV:-120}"
T_CALIBRATE="${DEVICE_CHECK_TIMEOUT_CALIBRATE:-300}"
T_PLAN="${DEVICE_CHECK_TIMEOUT_PLAN:-120}"
T_REPLAY="${DEVICE_CHECK_TIMEOUT_REPLAY:-180}"
T_VALIDATION="${DEVICE_CHECK_TIMEOUT_VALIDATION:-900}"
T_TABLE="${DEVICE_CHECK_TIMEOUT_TABLE:-60}"
for t in "$T_ENV" "$T_CALIBRATE" "$T_PLAN" "$T_REPLAY" "$T_VALIDATION" "$T_TABLE"; do
  case "$t" in
    ''|*[!0-9]*|0) echo "device_check: DEVICE_CHECK_TIMEOUT_* must be a whole number of seconds > 0, got '$t'" >&2
       exit 2 ;;
  esac
done

mkdir -p "$OUT" || { echo "device_check: OUT=$OUT: cannot create it; pick a writable folder" >&2; exit 2; }
[ -w "$OUT" ] || { echo "device_check: OUT=$OUT: not writable; pick a writable folder" >&2; exit 2; }
STAGES="$OUT/stages.tsv"
printf 'stage\tstatus\tseconds\tlimit_s\n' > "$STAGES"
printf '%s\n' "$MODE" > "$OUT/mode"

table() {
  if [ -n "$DRY" ]; then
    echo "dry: table (timeout ${T_TABLE}s): $PY -m replay.device_check_table $OUT"
    return 0
  fi
  timeout -k 10 "$T_TABLE" "$PY" -m replay.device_check_table "$OUT" || \
    echo "device_check: the table could not be written (see $OUT/stages.tsv)" >&2
}

FAILED=()
# stage NAME LIMIT_S COMMAND...: run COMMAND under `timeout` and record it; returns its exit status (0 when it
# ran). A failure is reported at once and remembered in FAILED.
stage() {
  local name="$1" limit="$2"
  shift 2
  if [ -n "$DRY" ]; then
    echo "dry: $name (timeout ${limit}s): $*"
    printf '%s\tdry\t0\t%s\n' "$name" "$limit" >> "$STAGES"
    return 0
  fi
  echo "device_check: $name (at most ${limit}s)" >&2
  local t0 t1 rc=0
  t0=$(date +%s)
  timeout -k 10 "$limit" "$@" > "$OUT/$name.out" 2> "$OUT/$name.log" || rc=$?
  t1=$(date +%s)
  if [ "$rc" -eq 0 ]; then
    printf '%s\tok\t%s\t%s\n' "$name" "$((t1 - t0))" "$limit" >> "$STAGES"
    return 0
  fi
  local why="exit $rc"
  if [ "$rc" -eq 124 ] || [ "$rc" -eq 137 ]; then why="timed out after ${limit}s"; fi
  printf '%s\tfailed (%s)\t%s\t%s\n' "$name" "$why" "$((t1 - t0))" "$limit" >> "$STAGES"
  echo "device_check: stage '$name' FAILED ($why); log: $OUT/$name.log, output: $OUT/$name.out" >&2
  tail -n 25 "$OUT/$name.log" >&2 || true
  FAILED+=("$name")
  return 1
}

finish() {  # the table, then the verdict
  table
  if [ "${#FAILED[@]}" -gt 0 ]; then
    echo "device_check: FAILED stages: ${FAILED[*]} (logs in $OUT)" >&2
    exit 1
  fi
  echo "device_check: every stage passed; table in $OUT/table.md" >&2
  exit 0
}

skip() {  # skip NAME WHY: a stage that does not apply to this run, recorded as such
  printf '%s\tskipped (%s)\t0\t0\n' "$1" "$2" >> "$STAGES"
}

# -- env ---------------------------------------------------------------------------------------------------
stage env "$T_ENV" "$PY" -c "
import json, platform, sys
import torch
cuda = torch.cuda.is_available()
info = {'python': sys.version.split()[0], 'platform': platform.platform(), 'torch': torch.__version__,
        'cuda_available': cuda, 'cuda': torch.version.cuda, 'device_count': torch.cuda.device_count() if cuda else 0,
        'device': torch.cuda.get_device_name(0) if cuda else 'cpu', 'mode': '$MODE'}
print(json.dumps(info))
if '$MODE' == 'cuda' and not cuda:
    sys.exit('device_check: no CUDA device here (torch.cuda.is_available() is False); on a CPU machine run '
             'replay/device_check.sh --cpu-smoke')
" || finish
if [ "$MODE" = smoke ]; then
  skip cuda "cpu smoke run: the CUDA stages ran on the CPU with tiny sizes"
fi

# -- calibrate ---------------------------------------------------------------------------------------------
if [ "$MODE" = smoke ]; then  # tiny sizes (replay.calibrate.CalibrationSizes.tiny), through the command itself
  stage calibrate "$T_CALIBRATE" "$PY" -c "
import argparse, sys
from replay.calibrate import CalibrationSizes
from tiersim.commands.calibrate import run
sys.exit(run(argparse.Namespace(output='$OUT/calibrated.yaml', dir='$OUT', base=None, json=True),
             CalibrationSizes.tiny()))
" || finish
else
  stage calibrate "$T_CALIBRATE" "$PY" -m tiersim calibrate -o "$OUT/calibrated.yaml" --dir "$OUT" --json || finish
fi

# -- plans and replays -------------------------------------------------------------------------------------
# A small LLaMA-style model (3.7 M parameters): every policy replays it in seconds. Its states need ~60 MB on a
# GPU, so the offloading policies are given a 30 MB GPU budget (no reserved bytes) and offload for real.
printf '{name: device-check-small, layers: 4, hidden: 256, heads: 8, vocab: 1024, mlp: swiglu, ffn: 688}\n' \
  > "$OUT/model.yaml"
for p in $POLICIES; do
  BUDGET=(--set 'gpu.reserved={}' --set gpu.fragmentation=0)
  [ "$p" = none ] || BUDGET+=(--set gpu.memory=30MB)
  POLICY=("$p")
  # zero-infinity-nvme: its parameters on the nvme tier (replay.nvme_files: O_DIRECT files in $OUT)
  [ "$p" = zero-infinity-nvme ] && POLICY=(zero-infinity --knob param_device=nvme)
  stage "plan-$p" "$T_PLAN" "$PY" -m tiersim simulate --hw "$OUT/calibrated.yaml" --model "$OUT/model.yaml" \
    --policy "${POLICY[@]}" --micro-batch 1 --seq-len 64 --global-batch 2 "${BUDGET[@]}" \
    --plan-out "$OUT/plan-$p.json" --json || { skip "replay-$p" "its plan failed"; continue; }
  stage "replay-$p" "$T_REPLAY" "$PY" -m tiersim replay "$OUT/plan-$p.json" --device "$DEVICE" --verify --json \
    --steps 3 --nvme-dir "$OUT" || true
done

# -- the default workflow: gpt2 at its default workload on the calibrated spec (issue 12) ---------------------
# What a new user does: calibrate, `simulate --model gpt2 --plan-out`, `replay` (no --verify: the timing is the
# point, and the reference run would double the stage). Device-sized, so the smoke run records it as skipped.
WORKFLOW="${DEVICE_CHECK_WORKFLOW-zero-offload none}"
if [ "$MODE" = smoke ]; then
  skip workflow "cpu smoke run: gpt2 at its default workload is device-sized"
else
  for p in $WORKFLOW; do
    stage "plan-gpt2-$p" "$T_PLAN" "$PY" -m tiersim simulate --hw "$OUT/calibrated.yaml" --model gpt2 \
      --policy "$p" --plan-out "$OUT/plan-gpt2-$p.json" --trace "$OUT/sim-gpt2-$p.trace.json" --json || { skip "replay-gpt2-$p" "its plan failed"; continue; }
    stage "replay-gpt2-$p" "$T_REPLAY" "$PY" -m tiersim replay "$OUT/plan-gpt2-$p.json" --device "$DEVICE" --json \
      --steps 3 --nvme-dir "$OUT" --trace "$OUT/replay-gpt2-$p.trace.json" || true
  done
fi

# -- validation matrix -------------------------------------------------------------------------------------
VARGS=(--out "$OUT/validation.md" --json "$OUT/validation.json" --cache-dir "$OUT/validation-cache")
if [ "$MODE" = smoke ]; then
  VARGS+=(--quick)
fi
if [ -z "$DRY" ] && [ "${DEVICE_CHECK_VALIDATION:-1}" != 0 ] \
    && "$PY" -m replay.validation --help 2>/dev/null | grep -q -- '--device'; then
  VARGS+=(--device "$DEVICE")
elif [ "$MODE" = cuda ]; then
  echo "device_check: python -m replay.validation takes no --device here: its matrix replays on the CPU" >&2
fi
if [ "${DEVICE_CHECK_VALIDATION:-1}" = 0 ]; then
  skip validation "DEVICE_CHECK_VALIDATION=0"
else
  stage validation "$T_VALIDATION" "$PY" -m replay.validation "${VARGS[@]}" || true
fi

finish
