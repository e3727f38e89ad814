#!/usr/bin/env bash
# Open against closed loop on the reference-size INT8 DLRM (tables of 100,000 rows), one local
# tritonserver, gRPC, batch 16, in one run (python -m lab open-loop):
#   1. the capacity at a p99 of 10 ms: the highest Poisson request rate whose p99, counted from
#      each request's scheduled time, holds 10 ms (doubling from 100/s, then halving to 5 %; each
#      step 10 s and at least 1,000 requests);
#   2. open-loop steps at 0.25 to 1.25 of that rate, and closed-loop steps at concurrency 1 to 8:
#      p99 against the throughput each reached, on one chart;
#   3. MLPerf's Server scenario through the official LoadGen at the rate found, bound 10 ms, with
#      LoadGen's verdict (60 s and 1,024 queries at least);
#   4. the open loop against perf_analyzer's request-rate mode at three rates below it, over gRPC
#      and over HTTP (benchmarks/open_loop/agreement, benchmarks/open_loop/agreement-http).
#
#   bash benchmarks/open_loop/run.sh      # from the repository root, after `make setup`
#
# The load generators (the open loop, the closed loop, LoadGen) run on core 0 (CLIENT_CPUS), the
# server on the others: unpinned on 2 cores, ONNX Runtime's threads kept the generator's threads
# from a core, and every open-loop step was flagged as the generator falling behind. The model
# runs one ONNX Runtime thread (--threads 1), as many as the server's one core: ONNX Runtime sizes
# its pool by the machine's cores, not the process's, and a second thread spinning on the same
# core delays the one that serves.
#
# About 35 minutes on 2 cores (the model is made first where WORK does not hold it); run it on an
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
    --int8 --int8-auc-tolerance 0.01 --threads 1
fi

python -m lab open-loop --repository "$REPO" --model dlrm_onnx_int8 --batch-size 16 --p99-budget-ms 10 --start-rate 100 \
  --data "$WORK/data/valid.tsv" --client-cpus "$CLIENT_CPUS" --out benchmarks/open_loop

# The bundle's open loop beside perf_analyzer's request-rate mode on the same server, at a quarter,
# half and three quarters of the rate found above, both on core 0, five rounds of 20 s each, taking turns:
# the medians of their p50 and p99 side by side, and how many of the steps neither flagged agree
# within 10 %.
RATES=$(python - <<'PY'
import json
found = json.load(open("benchmarks/open_loop/open_loop.json"))["capacity"]["best"]
rate = found["request_rate"] if found else 20.0
print(",".join(f"{rate * share:.0f}" for share in (0.25, 0.5, 0.75)))
PY
)
python -m loadtest sweep --repository "$REPO" --model dlrm_onnx_int8 --protocol grpc --batch-size 16 \
  --engine driver,perf_analyzer --request-rate "$RATES" --duration 20 --rounds 5 --client-cpus "$CLIENT_CPUS" \
  --p99-budget-ms 10 --out benchmarks/open_loop/agreement --raw "$WORK/agreement-raw" \
  --title "Open loop against perf_analyzer"
python -m loadtest sweep --repository "$REPO" --model dlrm_onnx_int8 --protocol http --batch-size 16 \
  --engine driver,perf_analyzer --request-rate "$RATES" --duration 20 --rounds 5 --client-cpus "$CLIENT_CPUS" \
  --p99-budget-ms 10 --out benchmarks/open_loop/agreement-http --raw "$WORK/agreement-http-raw" \
  --title "Open loop against perf_analyzer, HTTP"
