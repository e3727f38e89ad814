#!/usr/bin/env bash
# `python -m loadtest tune` beside Triton Model Analyzer 1.58 on the same model, search space and
# p99 budgets, both answers then re-measured side by side with perf_analyzer:
#
#   bash benchmarks/model_analyzer/run.sh      # from the repository root, after `make setup`
#
# Models: a `small` DLRM (untrained: its speed does not depend on training) and a `small` Wide &
# Deep trained one epoch on synthetic rows, exported FP32 (dlrm_onnx, wide_deep_onnx) into
# artifacts/model_analyzer/repository. Space for both tools: instances 1 and 2, max queue delay
# 100 and 2000 us, client batch 64 and 1024, concurrency 1, 2, 4 and 8, over gRPC; budgets
# 10 and 50 ms. Model Analyzer goes into its own venv (artifacts/model_analyzer/venv: it pins
# packages of its own) and starts the bundle's tritonserver through ./tritonserver. About
# 30 minutes on 2 cores. The report goes to benchmarks/model_analyzer.
set -euo pipefail
cd "$(dirname "$0")/../.."
export PATH="$PWD/.venv/bin:$PATH"

WORK=${WORK:-artifacts/model_analyzer}
REPO=$WORK/repository
MA=$WORK/venv/bin/model-analyzer

python -m loadtest perf-analyzer where >/dev/null
if [[ ! -x $MA ]]; then
  python -m venv "$WORK/venv"
  "$WORK/venv/bin/pip" install --quiet triton-model-analyzer==1.58.0
fi
if [[ ! -f $REPO/dlrm_onnx/1/model.onnx || ! -f $REPO/wide_deep_onnx/1/model.onnx ]]; then
  python -m criteo synth --rows 20000 --out "$WORK/data/train.tsv" --seed 1
  python -m criteo synth --rows 4000 --out "$WORK/data/valid.tsv" --seed 2
  python -m models random-dlrm --preset small --out "$WORK/dlrm"
  python -m models train wide-deep --preset small --data "$WORK/data/train.tsv" --valid "$WORK/data/valid.tsv" \
    --out "$WORK/wide_deep"
  python -m export dlrm --checkpoint "$WORK/dlrm" --repository "$REPO" --no-fp16 --no-int8 \
    --check-data "$WORK/data/valid.tsv" --check-rows 1024
  python -m export wide-deep --saved-model "$WORK/wide_deep" --repository "$REPO" --no-fp16 --no-int8 \
    --check-data "$WORK/data/valid.tsv" --check-rows 1024
fi

python -m lab model-analyzer --repository "$REPO" --model-analyzer "$MA" \
  --model dlrm --model wide_deep --p99-budget-ms 10 --p99-budget-ms 50 \
  --batch-sizes 64,1024 --concurrency 1,2,4,8 --instances 1,2 --queue-delay-us 100,2000 \
  --work "$WORK/work" --out benchmarks/model_analyzer
