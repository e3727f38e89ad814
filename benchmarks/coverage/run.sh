#!/usr/bin/env bash
# Reproduces benchmarks/coverage: how many held-out lookups the hot rows of a hot/cold model serve.
#
#   1. a skewed synthetic training file and a held-out file of the same hidden model (another
#      --seed), with the Criteo Kaggle vocabulary per table: --max-vocabulary is the largest
#      Kaggle table, so no table is capped and every table's vocabulary is its real size;
#   2. profile.json, coverage.png: the training file's access skew, ids reduced into the Kaggle
#      table sizes (python -m criteo profile);
#   3. result.{json,md}, hit_rate.png: hot rows chosen from that profile (DLRM Kaggle config:
#      dimension 16, FP32, 64 bytes a row) at budgets of 1..50 % of the table bytes, scored on the
#      held-out file's lookups (python -m criteo coverage; the same choice as export.tables.hot_rows).
#
#   bash benchmarks/coverage/run.sh        # from the repository root, after `make setup`
#
# Reading the result: fractions are of the real Kaggle table bytes (33,762,577 rows x 64 B), and
# since no table is capped they are also fractions of the synthetic vocabulary. Two things make the
# "of the table bytes" curve easier than it looks: the training file touches only part of the
# vocabulary (ids are power-law distributed; result.md gives the share), so a large enough budget
# holds every profiled row and the held-out hit rate stops at the share of held-out lookups on
# profiled rows; and synthetic ids are random 32-bit values reduced modulo the table size, so even
# an endless file would leave about 1/e of a big table's rows unused. The "of the profiled rows'
# bytes" curve in result.md is the stricter reading. The skew is the generator's (EXPONENT), not
# Criteo's own.
#
# About 5 minutes on a 2-core machine, 3.5 GB of memory (the generator holds the 33.8 million
# ids of the vocabulary). Data and the full counts go to artifacts/coverage-bench (not committed;
# existing files are reused: delete them after changing TRAIN_ROWS, HELDOUT_ROWS, VOCABULARY or
# EXPONENT, which override the sizes).
set -euo pipefail
cd "$(dirname "$0")/../.."
export PYTHONPATH="$PWD" PATH="$PWD/.venv/bin:$PATH"

WORK=${WORK:-artifacts/coverage-bench}
OUT=${OUT:-benchmarks/coverage}
TRAIN_ROWS=${TRAIN_ROWS:-4000000}
HELDOUT_ROWS=${HELDOUT_ROWS:-1000000}
VOCABULARY=${VOCABULARY:-10131227}
EXPONENT=${EXPONENT:-1.05}

synth=(--vocabulary criteo-kaggle --max-vocabulary "$VOCABULARY" --exponent "$EXPONENT")
[[ -f $WORK/train.tsv ]] || python -m criteo synth --rows "$TRAIN_ROWS" --seed 1 --out "$WORK/train.tsv" "${synth[@]}"
[[ -f $WORK/heldout.tsv ]] || python -m criteo synth --rows "$HELDOUT_ROWS" --seed 2 --out "$WORK/heldout.tsv" "${synth[@]}"

python -m criteo profile --data "$WORK/train.tsv" --out "$WORK/profile" --table-sizes criteo-kaggle
python -m criteo coverage --profile "$WORK/profile" --data "$WORK/heldout.tsv" --out "$OUT" \
  --table-sizes criteo-kaggle --row-bytes 64 --fractions 0.01,0.02,0.05,0.1,0.2,0.5
cp "$WORK/profile/profile.json" "$WORK/profile/coverage.png" "$OUT/"
