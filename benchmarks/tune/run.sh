#!/usr/bin/env bash
# Reproduces benchmarks/tune: `python -m loadtest tune` for DLRM and Wide & Deep at p99 budgets of
# 10 ms and 50 ms, on the reference-size models of benchmarks/cpu (table 100000, FP32 + FP16 +
# INT8 static), served by the local tritonserver. Each run writes report.{md,json} and
# frontier.png to benchmarks/tune/<family>-<budget>ms. The cpu profile's default (INT8, 1
# instance, ONNX Runtime's default threads, 100 us queue delay, no preferred batch sizes) and the best other
# configs are re-measured side by side in the same run (a config over the budget steps its load down
# and is measured again, the default by the same rule), and the report states the search's
# measured seconds against a brute force over the same space (grid points x the fixed per-point
# duration, rule in each report).
#
#   bash benchmarks/tune/run.sh        # from the repository root, after `make setup`
#   PARTS=main bash benchmarks/tune/run.sh   # only the four tunes (PARTS=validate: only the check)
#
# Space (chosen so that the four runs take about 20 minutes on a 2-core machine): FP32 and INT8
# (FP16 runs slower than FP32 on this CPU, benchmarks/cpu/precision.md), 1 or 2 instances,
# ONNX Runtime threads auto or 1, queue delay 100 or 2000 us, no preferred batch sizes (16 configs;
# --preferred is searched by tests/integration/test_tune_served.py), the cpu profile's default (INT8,
# 1 instance, auto threads, 100 us, no preferred sizes) among them; client batch 64, 256, 1024 and
# concurrency 1, 2, 4, 8: 16 x 12 = 192 grid points.
# Windows of 0.5 s, 0.5 s warm-up, 3 to 8 windows per step. Last, a check of the pruning:
# tune and `tune --brute-force` over one reduced grid (benchmarks/tune/validate-dlrm-10ms).
#
# The machine may be shared (another benchmark ran beside the committed results): each report
# records the load average across its run, and compares winner and default side by side.
set -euo pipefail
cd "$(dirname "$0")/../.."
export PYTHONPATH="$PWD" PATH="$PWD/.venv/bin:$PATH"

# The cpu profile's repository of benchmarks/cpu/run.sh when it exists; else one built here
# (artifacts/tune-bench): the same reference-size models (table 100000) trained one epoch on
# 30,000 synthetic rows, exported FP32 + INT8 (static). Throughput does not depend on accuracy,
# so the INT8 gate is opened (--int8-auc-tolerance 1.0), as the integration tests do.
WORK=${WORK:-artifacts/tune-bench}
REPO=${REPO:-artifacts/cpu-bench/repo}
DATA=${DATA:-$WORK/data/check.tsv}
OUT=${OUT:-benchmarks/tune}
if [[ ! -f $REPO/dlrm_onnx_int8/1/model.onnx || ! -f $REPO/wide_deep_onnx_int8/1/model.onnx ]]; then
  REPO=$WORK/repo
  if [[ ! -f $REPO/dlrm_onnx_int8/1/model.onnx || ! -f $REPO/wide_deep_onnx_int8/1/model.onnx ]]; then
    [[ -f $WORK/data/check.tsv ]] || {
      python -m criteo synth --rows 30000 --seed 1 --out "$WORK/data/train.tsv"
      python -m criteo synth --rows 8000 --seed 2 --out "$WORK/data/check.tsv"
    }
    train=(--preset reference --table-size 100000 --data "$WORK/data/train.tsv" --valid "$WORK/data/check.tsv")
    [[ -f $WORK/dlrm/model.pt ]] || python -m models train dlrm "${train[@]}" --out "$WORK/dlrm"
    [[ -f $WORK/wide_deep/config.json ]] || python -m models train wide-deep "${train[@]}" --out "$WORK/wide_deep"
    export_args=(--repository "$REPO" --no-fp16 --int8 --check-data "$WORK/data/check.tsv" --check-rows 2048
                 --calibration-data "$WORK/data/train.tsv" --int8-auc-tolerance 1.0)
    python -m export dlrm --checkpoint "$WORK/dlrm" "${export_args[@]}"
    python -m export wide-deep --saved-model "$WORK/wide_deep" "${export_args[@]}"
  fi
fi
data=()
[[ -f $DATA ]] && data=(--data "$DATA")

space=(--variants fp32,int8 --instances 1,2 --threads 0,1 --queue-delay-us 100,2000 --preferred none
       --batch-sizes 64,256,1024 --concurrency 1,2,4,8 --window 0.5 --warmup 0.5 --min-windows 3 --max-windows 8)
PARTS=${PARTS:-"main validate"}
if [[ $PARTS == *main* ]]; then
  for family in dlrm wide_deep; do
    for budget in 10 50; do
      python -m loadtest tune --repository "$REPO" --model "$family" --p99-budget-ms "$budget" \
        "${space[@]}" "${data[@]}" --out "$OUT/$family-${budget}ms"
    done
  done
fi

# Validation of the pruning: the same reduced grid (FP32 and INT8, 1 or 2 instances, batch 64 and
# 256, concurrency 1, 2, 4, the default among them: 24 points) searched by tune and by --brute-force (every point 8 windows).
small=(--variants fp32,int8 --instances 1,2 --threads 0 --queue-delay-us 100 --preferred none
       --batch-sizes 64,256 --concurrency 1,2,4 --window 0.5 --warmup 0.5 --min-windows 3 --max-windows 8)
if [[ $PARTS == *validate* ]]; then
  for mode in smart brute; do
    flag=()
    if [[ $mode == brute ]]; then flag=(--brute-force); fi
    python -m loadtest tune --repository "$REPO" --model dlrm --p99-budget-ms 10 "${small[@]}" "${flag[@]}" \
      "${data[@]}" --out "$OUT/validate-dlrm-10ms/$mode"
  done
fi
