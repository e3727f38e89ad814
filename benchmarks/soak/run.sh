#!/usr/bin/env bash
# Reproduces benchmarks/soak/result.{json,md} (and rss.png): the local tritonserver serving every ONNX
# model of model_repository/ (what `make demo` exports) under 100 checked requests/s for 10 minutes,
# from 2 client threads (gRPC and HTTP), batch sizes 1, 8, 64 and 256; every answer compared with
# ONNX Runtime in process. Targets: 0 errors, RSS growth after the 60 s warm-up < 5 %.
#
#   bash benchmarks/soak/run.sh        # from the repository root, after `make demo`
#
# About 11 minutes. The code is lab/soak.py (`python -m lab soak`); the load is the
# bundle's closed-loop driver (loadtest/engine/driver.py), paced to the rate.
set -euo pipefail
cd "$(dirname "$0")/../.."
export PYTHONPATH="$PWD" PATH="$PWD/.venv/bin:$PATH"

python -m lab soak --repository "${REPOSITORY:-model_repository}" --duration "${DURATION:-600}" \
  --warmup "${WARMUP:-60}" --out benchmarks/soak
