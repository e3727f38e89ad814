#!/usr/bin/env bash
# Raw rows against tensors: the INT8 DLRM served as tensors the client made (dlrm_onnx_int8) and
# as the rows' text parsed in the server (dlrm_onnx_int8_raw), side by side on one local
# tritonserver, batch 1 and 1024, concurrency 1, 2 and 4, 3 rounds in alternating order; where a
# raw request's time goes in the server; the two input forms (B x 1 and B x 39 BYTES) timed
# in-process.
#
#   bash benchmarks/raw_rows/run.sh      # from the repository root, after `make setup`
#
# The model: an untrained DLRM of the reference preset with 100,000-row tables (the size the cpu
# benchmarks serve; its speed does not depend on training), exported INT8 with its raw-row
# models (untrained, its AUC is noise around 0.5: the INT8 check's AUC tolerance is widened). The load generator runs on core 0 (CLIENT_CPUS) and the server on the others. About
# 10 minutes on 2 cores; run it on an otherwise idle machine. Models go to artifacts/raw_rows
# (not committed); the report to benchmarks/raw_rows.
set -euo pipefail
cd "$(dirname "$0")/../.."
export PATH="$PWD/.venv/bin:$PATH"

WORK=${WORK:-artifacts/raw_rows}
REPO=$WORK/model_repository
CLIENT_CPUS=${CLIENT_CPUS:-0}

if [[ ! -f $REPO/dlrm_onnx_int8/1/model.onnx || ! -f $REPO/dlrm_onnx_int8_raw/config.pbtxt || -n ${REBUILD:-} ]]; then
  python -m criteo synth --rows 8000 --out "$WORK/data/valid.tsv" --seed 2
  python -m models random-dlrm --preset reference --table-size 100000 --out "$WORK/dlrm"
  python -m export dlrm --checkpoint "$WORK/dlrm" --repository "$REPO" --no-fp16 \
    --check-data "$WORK/data/valid.tsv" --check-rows 4096 --calibration-data "$WORK/data/valid.tsv" \
    --int8 --int8-auc-tolerance 0.01
fi

python -m lab raw-rows --repository "$REPO" --model dlrm_onnx_int8 --batch-size 1,1024 \
  --concurrency 1,2,4 --rounds 3 --seconds 3 --warmup 1 --protocol grpc --data "$WORK/data/valid.tsv" \
  --client-cpus "$CLIENT_CPUS" --out benchmarks/raw_rows
