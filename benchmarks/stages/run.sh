#!/usr/bin/env bash
# The compiled stages per warm request: the raw-row stage (criteo_rows) and the hot/cold embedding
# stage with its default config (its memory tier of cold rows), each served as the first step of an
# ensemble by one local tritonserver, one request at a time; the stage's own time per request from
# Triton's statistics at batch 1, 64 and 1024; beside each embedding step, the same lookups in process
# (the stage's code outside Triton) and a memcpy of the request's bytes, measured in the same run.
# The embedding stage: 26 tables of 20,000 rows of 32 floats, a tenth of each table's rows hot, and
# 80% of the lookups hot, then most of them cold.
#
#   bash benchmarks/stages/run.sh      # from the repository root, after `make setup`
#
# A few minutes on 2 cores; run it on an otherwise idle machine (the report records the load
# average). The report goes to benchmarks/stages (the scratch repository and row store are deleted
# afterwards). The python stages against the compiled ones: benchmarks/stages/python-vs-compiled.
set -euo pipefail
cd "$(dirname "$0")/../.."
export PATH="$PWD/.venv/bin:$PATH"
mkdir -p artifacts/stages
python -m lab stage-speed --batch-size 1,64,1024 --requests 200 --rounds 5 \
  --log-file artifacts/stages/stage-speed-tritonserver.log --out benchmarks/stages
