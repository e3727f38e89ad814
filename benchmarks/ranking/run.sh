#!/usr/bin/env bash
# Ranking requests against flat ones: an untrained `small` DLRM exported INT8 (the cpu profile) with
# its ranking variant (half of the features the user's: I1-I6 and C1-C13), served by one local
# tritonserver; at 16, 128 and 1,024 candidates per user and concurrency 1 and 4, the same users'
# candidates sent as one ranking request a user and as one flat request of the tiled rows a user,
# back to back in each round: candidates/s, p50 and p99 per user request, bytes and client CPU per
# candidate.
#
#   bash benchmarks/ranking/run.sh      # from the repository root, after `make setup`
#
# About ten minutes on 2 cores (the export included); run it on an otherwise idle machine (the
# report records the load average). The model and the data go to artifacts/ranking (not committed).
set -euo pipefail
cd "$(dirname "$0")/../.."
export PATH="$PWD/.venv/bin:$PATH"
mkdir -p artifacts/ranking
python -m lab ranking-speed --candidates 16,128,1024 --concurrency 1,4 --duration 5 --rounds 3 \
  --user-features I1-I6,C1-C13 --log-file artifacts/ranking/ranking-speed-tritonserver.log \
  --out benchmarks/ranking
