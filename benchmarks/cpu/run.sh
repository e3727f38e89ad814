#!/usr/bin/env bash
# Reproduces benchmarks/cpu: reference-size DLRM and Wide & Deep (table 100000) trained on
# 200,000 synthetic rows, exported FP32 + FP16 + INT8 (static, calibrated on training rows: the
# default) and INT8 dynamic, then
#   1. serving_defaults.{json,md} (python -m lab serving-defaults): candidate serving settings
#      through the local tritonserver;
#   2. concurrency.{json,md} (python -m lab serving-defaults --name concurrency): why served
#      INT8 DLRM at batch 1024 lost throughput from concurrency 1 to 2 and 4, each
#      hypothesis (ONNX Runtime spinning, the batcher merging requests, thread counts) side by side;
#   3. precision.{json,md} (python -m lab precision): served and in-process samples/s of every
#      precision at batch 1024 as fractions of the FP32 sgemm ceiling measured in the same run, with
#      each AUC delta.
# All measure with the bundle's one load driver and one in-process timer (loadtest/engine/driver.py,
# loadtest/engine/timer.py); the code is in loadtest/, this folder holds only results and this script.
#
#   bash benchmarks/cpu/run.sh        # from the repository root, after `make setup`
#
# About 45 minutes on a 2-core machine (training and export about 15; existing models in WORK are
# reused, REBUILD=1 re-exports). The machine may be
# shared: each measuring step takes /tmp/bench.lock (so it never overlaps another benchmark
# that does the same) and starts once the 1-minute load average is below 1.0.
# Models and data go to artifacts/cpu-bench (not committed).
set -euo pipefail
cd "$(dirname "$0")/../.."
export PYTHONPATH="$PWD" PATH="$PWD/.venv/bin:$PATH"

WORK=${WORK:-artifacts/cpu-bench}
OUT=${OUT:-benchmarks/cpu}

quiet() {  # run "$@" holding the benchmark lock, once the machine is idle
  flock /tmp/bench.lock sh -c 'while awk "{exit !(\$1 >= 1.0)}" /proc/loadavg; do sleep 10; done; exec "$@"' quiet "$@"
}

train=(--preset reference --table-size 100000 --data "$WORK/data/train.tsv" --valid "$WORK/data/valid.tsv" --max-rows 200000)
check=(--check-data "$WORK/data/check.tsv" --check-rows 4096 --calibration-data "$WORK/data/train.tsv")
if [[ ! -f $WORK/data/valid.tsv ]]; then
  python -m criteo synth --rows 200000 --seed 1 --out "$WORK/data/train.tsv"
  python -m criteo synth --rows 20000 --seed 2 --out "$WORK/data/check.tsv"
  python -m criteo synth --rows 20000 --seed 3 --out "$WORK/data/valid.tsv"
fi
[[ -f $WORK/dlrm/model.pt ]] || quiet python -m models train dlrm "${train[@]}" --out "$WORK/dlrm"
[[ -f $WORK/wide_deep/config.json ]] || quiet python -m models train wide-deep "${train[@]}" --out "$WORK/wide_deep"
if [[ ! -f $WORK/repo/dlrm_onnx_int8/1/model.onnx || ! -f $WORK/repo/wide_deep_onnx_int8/1/model.onnx || -n ${REBUILD:-} ]]; then
  # The cpu profile's defaults: FP32, FP16 and INT8 (static, calibrated on training rows).
  rm -rf "$WORK/repo" "$WORK/repo_dynamic"
  python -m export dlrm --checkpoint "$WORK/dlrm" --repository "$WORK/repo" "${check[@]}"
  python -m export wide-deep --saved-model "$WORK/wide_deep" --repository "$WORK/repo" "${check[@]}"
  # INT8 dynamic, measured beside it as <family>_onnx_int8_dynamic.
  dynamic=(--no-fp16 --int8 --int8-method dynamic "${check[@]}")
  python -m export dlrm --checkpoint "$WORK/dlrm" --repository "$WORK/repo_dynamic" "${dynamic[@]}"
  python -m export wide-deep --saved-model "$WORK/wide_deep" --repository "$WORK/repo_dynamic" "${dynamic[@]}"
fi

quiet python -m lab serving-defaults --repository "$WORK/repo" --model dlrm_onnx_int8 \
  --model wide_deep_onnx_int8 --data "$WORK/data/check.tsv" --out "$OUT"
concurrency=(
  --candidate "1 inst x default threads, spin on, delay 100"
  --candidate "1 inst x default threads, spin off, delay 100"
  --candidate "1 inst x default threads, spin on, delay 100, max batch 1024"
  --candidate "1 inst x default threads, spin off, delay 100, max batch 1024"
  --candidate "1 inst x default threads, spin off, delay 100, preferred 1024"
  --candidate "1 inst x 1 thread, spin off, delay 100"
  --candidate "2 inst x 1 thread, spin off, delay 100"
)
quiet python -m lab serving-defaults --repository "$WORK/repo" --model dlrm_onnx_int8 \
  --data "$WORK/data/check.tsv" --out "$OUT" --name concurrency --step 1024x1 --step 1024x2 --step 1024x4 \
  --step 1x1 --step 1x16 --rounds 3 "${concurrency[@]}"
quiet python -m lab precision --repository "$WORK/repo" --dynamic-repository "$WORK/repo_dynamic" \
  --data "$WORK/data/check.tsv" --out "$OUT"
