#!/usr/bin/env bash
# The server-side stages, python and compiled, side by side in one local tritonserver: the
# raw-row stage (criteo_rows) and the hot/cold embedding stage (dlrm_embedding), each served by
# the python backend and by its C++ backend with the same config; the server's time per request
# (Triton's statistics), warm, at batch 1, 64 and 1024; 5 rounds that alternate which goes first.
#
# The python stages are gone since the compiled ones replaced them, so this runs the measurement
# at the last commit that had both (COMMIT below): a git worktree of it under WORK, its compiled
# stages built there (`make stages`), this checkout's venv, the report written here.
#
#   bash benchmarks/stages/python-vs-compiled/run.sh      # from the repository root, after `make setup`
#
# A few minutes on 2 cores; run it on an otherwise idle machine. The report goes to
# benchmarks/stages/python-vs-compiled (the scratch repository and row store are deleted afterwards).
set -euo pipefail
cd "$(dirname "$0")/../../.."
ROOT=$PWD
COMMIT=5f39447
WORK=${WORK:-artifacts/stages}
TREE="$ROOT/$WORK/at-$COMMIT"
mkdir -p "$WORK"
[[ -d $TREE ]] || git worktree add --detach "$TREE" "$COMMIT"
make -C "$TREE" stages
cd "$TREE"
PATH="$ROOT/.venv/bin:$PATH" PYTHONPATH="$TREE" python -m lab stage-times --batch-size 1,64,1024 \
  --requests 200 --rounds 5 --log-file "$ROOT/$WORK/tritonserver.log" --out "$ROOT/benchmarks/stages/python-vs-compiled"
