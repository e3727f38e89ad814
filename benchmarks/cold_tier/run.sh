#!/usr/bin/env bash
# Cold rows at the disk's speed: a hot/cold DLRM whose row store is really read from disk, with an
# FP16 and an int8 row store side by side.
#
# The set-up: an untrained DLRM with the Criteo Terabyte preset's layers and its table sizes divided
# by 6 (31.3M rows, D 128: an 8.0 GB FP16 row store, 4.3 GB in int8), 1 GiB of hot rows chosen from a
# profile of 4M rows of skewed synthetic traffic, and 6M held-out rows of the same hidden model as
# requests.
#
#   1. python -m criteo synth (train and held-out), python -m criteo profile,
#      python -m export synthetic-hot-cold twice, --store-dtype float16 and int8 (a store is reused
#      when WORK already holds it);
#   2. python -m lab cold-reads: the stage's ways of reading cold rows, in one process, six
#      rounds, on the FP16 store evicted from the page cache, beside the disk's own random-read rate
#      (cold_reads.md);
#   3. python -m lab cold-tier: both models served by the local tritonserver, reading cold rows
#      the default way (io_uring), at batch 64 and 1024, concurrency 1 and 4, with the store evicted
#      (cold) and in memory (warm), the held-out rows sent in order, each once per step, three rounds
#      (cold_tier.md). The stage runs two instances, so one request's reads overlap another's
#      work, and the dense model two instances of one intra-op thread each: on two cores that
#      leaves the cold reads room, where one instance of two threads stalls whenever a read takes
#      one of its cores (at concurrency 1 the exported config, one instance of two threads, is
#      faster, cold and warm alike).
#
#   4. python -m lab cold-tier again, at concurrency 4, with the stage's own cache of cold rows
#      (cold_cache_bytes, 2 GiB) in front of io_uring beside io_uring alone, both warmed by a
#      cycled pool of held-out rows (a cache is filled by requests), two rounds (row_cache/).
#
#   bash benchmarks/cold_tier/run.sh        # from the repository root, after `make setup`
#
# About 15 GB of disk in WORK and, on a 2-core machine, about 75 minutes (12 for the data and the
# models, 2 for cold-reads, about 32 for cold-tier and 25 for the cache: every step reloads the
# stage, whose load reads the whole store to verify it, and a resident warm step reads all of it
# into memory).
set -euo pipefail
cd "$(dirname "$0")/../.."
export PYTHONPATH="$PWD" PATH="$PWD/.venv/bin:$PATH"

WORK=${WORK:-artifacts/cold}
OUT=${OUT:-benchmarks/cold_tier}
SIZES=$(python -c "from criteo.tables import CRITEO_TERABYTE as T; print(','.join(str(max(2, s // 6)) for s in T))")
mkdir -p "$WORK" "$OUT"

synth=(--vocabulary "$SIZES" --max-vocabulary 4000000 --exponent 1.05)
[[ -f $WORK/train.tsv ]] || python -m criteo synth --rows 4000000 --seed 1 --out "$WORK/train.tsv" "${synth[@]}"
[[ -f $WORK/heldout.tsv ]] || python -m criteo synth --rows 6000000 --seed 2 --out "$WORK/heldout.tsv" "${synth[@]}"
python -m criteo profile --data "$WORK/train.tsv" --out "$WORK/profile" --table-sizes "$SIZES"
for dtype in float16 int8; do
  rm -rf "$WORK/repo-$dtype"
  python -m export synthetic-hot-cold --preset criteo-terabyte --table-sizes "$SIZES" \
    --repository "$WORK/repo-$dtype" --store-dir "$WORK/rows-$dtype" --store-dtype "$dtype" --hot-budget 1G \
    --profile-data "$WORK/profile" --heldout-data "$WORK/heldout.tsv" --seed 0 2>&1 | tee "$OUT/export-$dtype.log"
done

python -m lab cold-reads --repository "$WORK/repo-float16" --data "$WORK/heldout.tsv" --batch-size 64,256,1024 --rounds 6 \
  --out "$OUT"
python -m lab cold-tier --repository "$WORK/repo-float16" --repository "$WORK/repo-int8" \
  --data "$WORK/heldout.tsv" --way io_uring --rounds 3 \
  --stage-instances 2 --dense-instances 2 --dense-threads 1 --out "$OUT"
python -m lab cold-tier --repository "$WORK/repo-float16" --repository "$WORK/repo-int8" \
  --data "$WORK/heldout.tsv" --way io_uring --way io_uring+cache --cold-cache 2G --warm cycled --rounds 2 \
  --batch-size 64,1024 --concurrency 4 --stage-instances 2 --dense-instances 2 --dense-threads 1 \
  --out "$OUT/row_cache"
