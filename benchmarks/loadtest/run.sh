#!/usr/bin/env bash
# Reproduces the committed load-test benchmarks: reference-size DLRM and Wide & Deep,
# served by the bundle's local tritonserver, swept at batch 1, 64 and 1024 over gRPC and
# HTTP, plus the peer comparison (local Triton vs PyTriton vs FastAPI, same DLRM file).
#
#   bash benchmarks/loadtest/run.sh            # from the repository root, after `make setup`
#   PARTS=peers bash benchmarks/loadtest/run.sh   # only the peer comparison (PARTS=sweeps: only the sweeps)
#
# About 40 minutes on a 2-core machine (sweeps 18, peers 21; PROTOCOLS="--protocol grpc": sweeps 11). Run it on an otherwise idle machine (the
# reports record the load average at start and end). Models and data go to
# artifacts/bench (not committed); reports to benchmarks/loadtest/{dlrm,wide_deep}
# and benchmarks/peers/dlrm. Accuracy does not matter for throughput, so the models
# train one epoch on 30,000 synthetic rows.
set -euo pipefail
cd "$(dirname "$0")/../.."
export PYTHONPATH="$PWD" PATH="$PWD/.venv/bin:$PATH"

WORK=${WORK:-artifacts/bench}
REPO=$WORK/model_repository
# Serving settings of the benchmarked repository: 1 instance, ONNX Runtime's default threads, 100 us queue delay.
SERVING=${SERVING:-"--instances 1 --threads 0 --max-queue-delay-us 100"}
DURATION=${DURATION:-8}
# The peer comparison runs each level in 3 interleaved rounds and reports each server's median:
# on shared cores one round can land on a burst of someone else's load.
PEER_DURATION=${PEER_DURATION:-10}
PEER_ROUNDS=${PEER_ROUNDS:-3}
PROTOCOLS=${PROTOCOLS:-"--protocol grpc --protocol http"}

if [[ ! -f $REPO/dlrm_onnx/1/model.onnx || ! -f $REPO/wide_deep_onnx/1/model.onnx || -n ${REBUILD:-} ]]; then
  python -m criteo synth --rows 30000 --out "$WORK/data/train.tsv" --seed 1
  python -m criteo synth --rows 8000 --out "$WORK/data/valid.tsv" --seed 2
  common=(--data "$WORK/data/train.tsv" --valid "$WORK/data/valid.tsv" --preset reference --table-size 100000)
  python -m models train dlrm "${common[@]}" --out "$WORK/dlrm"
  python -m models train wide-deep "${common[@]}" --out "$WORK/wide_deep"
  export_args=(--repository "$REPO" --no-fp16 --no-int8 --check-data "$WORK/data/valid.tsv" --check-rows 2048)
  # shellcheck disable=SC2086  # SERVING holds several flags
  python -m export dlrm --checkpoint "$WORK/dlrm" "${export_args[@]}" $SERVING
  # shellcheck disable=SC2086
  python -m export wide-deep --saved-model "$WORK/wide_deep" "${export_args[@]}" $SERVING
fi

PARTS=${PARTS:-"sweeps peers"}
if [[ $PARTS == *sweeps* ]]; then
  # shellcheck disable=SC2206  # PROTOCOLS holds several flags
  sweep=(--repository "$REPO" $PROTOCOLS --batch-size 1,64,1024
         --concurrency 1,2,4,8 --max-rows-in-flight 2048 --duration "$DURATION" --warmup 2)
  python -m loadtest sweep --model dlrm_onnx "${sweep[@]}" --out benchmarks/loadtest/dlrm --raw "$WORK/raw/dlrm" \
    --title "DLRM (reference sizes, table 100000) on the local tritonserver"
  python -m loadtest sweep --model wide_deep_onnx "${sweep[@]}" --out benchmarks/loadtest/wide_deep --raw "$WORK/raw/wide_deep" \
    --title "Wide & Deep (reference sizes, table 100000) on the local tritonserver"
fi
if [[ $PARTS == *peers* ]]; then
  python -m loadtest compare --repository "$REPO" --model dlrm_onnx --protocol grpc --batch-size 1,64,1024 \
    --concurrency 1,2,4,8 --max-rows-in-flight 2048 --duration "$PEER_DURATION" --warmup 2 --rounds "$PEER_ROUNDS" \
    --out benchmarks/peers/dlrm --raw "$WORK/raw/peers" \
    --title "DLRM (reference sizes, table 100000): local Triton vs PyTriton vs FastAPI, same ONNX file"
fi
