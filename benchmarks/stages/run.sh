#!/usr/bin/env bash
# The server-side stages, python and compiled, side by side in one local tritonserver: the
# raw-row stage (criteo_rows) and the hot/cold embedding stage (dlrm_embedding), each served by
# the python backend and by its C++ backend with the same config; the server's time per request
# (Triton's statistics), warm, at batch 1, 64 and 1024; 5 rounds that alternate which goes first.
#
#   bash benchmarks/stages/run.sh      # from the repository root, after `make setup`
#
# A few minutes on 2 cores; run it on an otherwise idle machine. The report goes to
# benchmarks/stages (the scratch repository and row store are deleted afterwards).
set -euo pipefail
cd "$(dirname "$0")/../.."
export PATH="$PWD/.venv/bin:$PATH"

python -m lab stage-times --batch-size 1,64,1024 --requests 200 --rounds 5 \
  --log-file artifacts/stages/tritonserver.log --out benchmarks/stages
