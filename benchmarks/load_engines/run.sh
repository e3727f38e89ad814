#!/usr/bin/env bash
# The bundle's load engines beside perf_analyzer, Triton's own load tool, on one local server:
# locust (the sweep), the closed-loop driver (what tune and the benchmarks run on) and
# perf_analyzer take each step back to back, the first one rotating, ROUNDS times; every step
# records samples/s, p50, p99, the load generator's CPU per request and the client-bound flag.
#
#   bash benchmarks/load_engines/run.sh      # from the repository root, after `make setup`
#
# The set-up: an untrained `small` DLRM (its speed does not depend on
# training), exported FP32 and INT8 (dlrm_onnx, dlrm_onnx_int8), gRPC and HTTP, batch 1, 64 and
# 1024, concurrency 1, 2, 4 and 8, in two layouts one after the other (LAYOUTS): pinned apart, the
# load generators on core 0 (CLIENT_CPUS) and the server on the others, so that no engine's CPU is
# taken from the server (report: benchmarks/load_engines/dlrm); and on the same cores, nothing
# pinned, as `make demo` and a user's first sweep run (benchmarks/load_engines/dlrm-shared). Every engine measures
# DURATION seconds per step (perf_analyzer's three reported windows together cover them). About
# 65 minutes a layout on 2 cores; run it on an otherwise idle machine (the report records the load average). Models go
# to artifacts/load_engines (not committed).
set -euo pipefail
cd "$(dirname "$0")/../.."
export PATH="$PWD/.venv/bin:$PATH"

WORK=${WORK:-artifacts/load_engines}
REPO=$WORK/model_repository
DURATION=${DURATION:-6}
ROUNDS=${ROUNDS:-3}
CONCURRENCY=${CONCURRENCY:-1,2,4,8}
BATCHES=${BATCHES:-1,64,1024}
CLIENT_CPUS=${CLIENT_CPUS:-0}
LAYOUTS=${LAYOUTS:-apart,shared}

python -m loadtest perf-analyzer where >/dev/null
if [[ ! -f $REPO/dlrm_onnx/1/model.onnx || ! -f $REPO/dlrm_onnx_int8/1/model.onnx || -n ${REBUILD:-} ]]; then
  python -m criteo synth --rows 4000 --out "$WORK/data/valid.tsv" --seed 2
  python -m models random-dlrm --preset small --out "$WORK/dlrm"
  python -m export dlrm --checkpoint "$WORK/dlrm" --repository "$REPO" --no-fp16 \
    --check-data "$WORK/data/valid.tsv" --check-rows 1024 --calibration-data "$WORK/data/valid.tsv"
fi

for layout in ${LAYOUTS//,/ }; do
  case $layout in
    apart) pinning=(--client-cpus "$CLIENT_CPUS"); out=dlrm; where="load generators on core $CLIENT_CPUS, the server on the others" ;;
    shared) pinning=(); out=dlrm-shared; where="load generators and the server on the same cores" ;;
    *) echo "LAYOUTS: apart or shared, not $layout" >&2; exit 2 ;;
  esac
  python -m loadtest sweep --repository "$REPO" --model dlrm_onnx --model dlrm_onnx_int8 \
    --protocol grpc --protocol http --engine locust,driver,perf_analyzer \
    --batch-size "$BATCHES" --concurrency "$CONCURRENCY" --duration "$DURATION" --warmup 1 --rounds "$ROUNDS" \
    "${pinning[@]}" --no-baseline --out "benchmarks/load_engines/$out" --raw "$WORK/raw-$layout" \
    --title "Load engines against perf_analyzer: small DLRM, FP32 and INT8, on the local tritonserver ($where)"
done
