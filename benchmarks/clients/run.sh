#!/usr/bin/env bash
# Reproduces benchmarks/clients/client_cost.{json,md}: the client-side cost per request of HTTP,
# gRPC and system shared memory at batch 1 and 1024, against the bundle's local tritonserver
# serving a tiny DLRM (the cost depends on tensor sizes, not on the weights).
#
#   bash benchmarks/clients/run.sh     # from the repository root, after `make setup`
#
# About 3 minutes on a 2-core machine. The code is lab/client_cost.py
# (`python -m lab client-cost`); each case runs on the bundle's closed-loop driver
# (loadtest/engine/driver.py) with one worker. Data and the model go to artifacts/client-cost.
set -euo pipefail
cd "$(dirname "$0")/../.."
export PYTHONPATH="$PWD" PATH="$PWD/.venv/bin:$PATH"

WORK=${WORK:-artifacts/client-cost}
if [[ ! -f $WORK/repo/dlrm_onnx/1/model.onnx ]]; then
  python -m criteo synth --rows 5000 --out "$WORK/rows.tsv"
  python -m models train dlrm --data "$WORK/rows.tsv" --out "$WORK/dlrm" --preset tiny
  python -m export dlrm --checkpoint "$WORK/dlrm" --repository "$WORK/repo" --no-fp16 --no-int8
fi
python -m lab client-cost --repository "$WORK/repo" --out benchmarks/clients
