#!/usr/bin/env bash
# Tables larger than memory, served with their cold tier on disk: an FP16 and an int8 row store, each
# larger than this machine's RAM (23 GiB), sent fresh traffic.
#
# Two untrained DLRMs with the Criteo Terabyte preset's layers (D 128, bottom 512-256-128, top
# 1024-1024-512-256-1), written by `python -m export synthetic-hot-cold` without ever holding their
# tables:
#   - FP16 store: the Terabyte table sizes x FP16_SCALE (0.55: 103.3M rows, a 26.4 GB store);
#   - int8 store: the full Terabyte table sizes (187.8M rows, a 25.5 GB store; 48.1 GB in FP16).
# One model with both stores would take 73.6 GB of disk, more than this machine has free. Each keeps
# HOT_BUDGET of FP32 hot rows, chosen from a profile of skewed synthetic traffic with the Terabyte
# vocabulary (capped at MAX_VOCABULARY ids a table).
#
#   1. python -m criteo synth: a training file (its profile chooses the hot rows) and a held-out file
#      of the same hidden model (another seed), whose rows are the requests;
#   2. python -m criteo profile for each model's table sizes; python -m export synthetic-hot-cold
#      (a store already in WORK with the same sizes, dtype and seed is reused);
#   3. python -m lab cold-tier --warm cycled: both models served by the local tritonserver,
#      batch 64 and 1024, concurrency 1 and 4: cold steps with the store evicted and the held-out rows
#      sent in order, each once (fresh traffic); warm steps cycling a pool of 32,768 rows sent once
#      before (their pages cached: what a load test that cycles a pool measures). It reports the
#      hot-hit rate's complement (cold lookups per request), the pages read from disk per request,
#      p50/p99 and the disk's own random-read rate measured in the same run.
#
#   bash benchmarks/large_tables/run.sh          # from the repository root, after `make setup`
#
# About 60 GB of disk in WORK and, on a 2-core machine, about 70 minutes (the stores about 25, the
# dense models and checks about 10, the data and profiles 5, cold-tier about 30).
set -euo pipefail
cd "$(dirname "$0")/../.."
export PYTHONPATH="$PWD" PATH="$PWD/.venv/bin:$PATH"

WORK=${WORK:-artifacts/large-tables}
OUT=${OUT:-benchmarks/large_tables}
FP16_SCALE=${FP16_SCALE:-0.55}
MAX_VOCABULARY=${MAX_VOCABULARY:-4000000}
TRAIN_ROWS=${TRAIN_ROWS:-4000000}
HELDOUT_ROWS=${HELDOUT_ROWS:-2000000}
HOT_BUDGET=${HOT_BUDGET:-2G}
ROUNDS=${ROUNDS:-2}
mkdir -p "$WORK" "$OUT"

FULL=$(python -c "from criteo.tables import CRITEO_TERABYTE as T; print(','.join(map(str, T)))")
SCALED=$(python -c "
from criteo.tables import CRITEO_TERABYTE as T
print(','.join(str(max(2, round(s * $FP16_SCALE))) for s in T))")
synth=(--vocabulary "$FULL" --max-vocabulary "$MAX_VOCABULARY" --exponent 1.05)
[[ -f $WORK/train.tsv ]] || python -m criteo synth --rows "$TRAIN_ROWS" --seed 1 --out "$WORK/train.tsv" "${synth[@]}"
[[ -f $WORK/heldout.tsv ]] || python -m criteo synth --rows "$HELDOUT_ROWS" --seed 2 --out "$WORK/heldout.tsv" "${synth[@]}"

# The data files and profiles are reused when present: delete them after changing the vocabulary or rows.
export_model() {  # dtype sizes
  [[ -f $WORK/profile-$1/profile.json ]] ||
    python -m criteo profile --data "$WORK/train.tsv" --out "$WORK/profile-$1" --table-sizes "$2"
  rm -rf "$WORK/repo-$1"
  /usr/bin/time -v -o "$OUT/export-$1-time.txt" \
    python -m export synthetic-hot-cold --preset criteo-terabyte --table-sizes "$2" --repository "$WORK/repo-$1" \
      --store-dir "$WORK/rows-$1" --store-dtype "$1" --hot-budget "$HOT_BUDGET" --profile-data "$WORK/profile-$1" \
      --heldout-data "$WORK/heldout.tsv" --seed 0 2>&1 | tee "$OUT/export-$1.log"
  cp "$WORK/repo-$1/dlrm_onnx/export_report.json" "$OUT/export-$1-report.json"
}
export_model float16 "$SCALED"
export_model int8 "$FULL"

python -m lab cold-tier --repository "$WORK/repo-float16" --repository "$WORK/repo-int8" \
  --data "$WORK/heldout.tsv" --warm cycled --way prefetch --batch-size 64,1024 --concurrency 1,4 \
  --rounds "$ROUNDS" --out "$OUT"
