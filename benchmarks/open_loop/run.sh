#!/usr/bin/env bash
# Open against closed loop on the reference-size INT8 DLRM (tables of 100,000 rows), one local
# tritonserver, gRPC, batch 16, in one run (python -m lab open-loop):
#   1. the capacity at a p99 of 10 ms: the highest Poisson request rate whose p99, counted from
#      each request's scheduled time, holds 10 ms (doubling from 20/s, then halving to 5 %);
#   2. open-loop steps at 0.25 to 1.25 of that rate, and closed-loop steps at concurrency 1 to 8:
#      p99 against the throughput each reached, on one chart;
#   3. MLPerf's Server scenario through the official LoadGen at the rate found, bound 10 ms, with
#      LoadGen's verdict (60 s and 1,024 queries at least).
#
#   bash benchmarks/open_loop/run.sh      # from the repository root, after `make setup`
#
# The load generators (the open loop, the closed loop, LoadGen) run on core 0 (CLIENT_CPUS), the
# server on the others: unpinned on 2 cores, ONNX Runtime's threads kept the generator's threads
# from a core, and every open-loop step was flagged as the generator falling behind.
#
# About 10 minutes on 2 cores (the model is made first where WORK does not hold it); run it on an
# otherwise idle machine. The model goes to artifacts/open_loop (not committed).
set -euo pipefail
cd "$(dirname "$0")/../.."
export PYTHONPATH="$PWD" PATH="$PWD/.venv/bin:$PATH"

WORK=${WORK:-artifacts/open_loop}
REPO=$WORK/model_repository
CLIENT_CPUS=${CLIENT_CPUS:-0}

if [[ ! -f $REPO/dlrm_onnx_int8/1/model.onnx || -n ${REBUILD:-} ]]; then
  python -m criteo synth --rows 8000 --out "$WORK/data/valid.tsv" --seed 2
  python -m models random-dlrm --preset reference --table-size 100000 --out "$WORK/dlrm"
  python -m export dlrm --checkpoint "$WORK/dlrm" --repository "$REPO" --no-fp16 --no-raw-rows \
    --check-data "$WORK/data/valid.tsv" --check-rows 4096 --calibration-data "$WORK/data/valid.tsv" \
    --int8 --int8-auc-tolerance 0.01
fi

python -m lab open-loop --repository "$REPO" --model dlrm_onnx_int8 --batch-size 16 --p99-budget-ms 10 \
  --data "$WORK/data/valid.tsv" --client-cpus "$CLIENT_CPUS" --out benchmarks/open_loop
