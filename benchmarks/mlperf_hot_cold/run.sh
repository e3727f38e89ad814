#!/usr/bin/env bash
# MLPerf's DLRM-DCNv2 at its own table sizes (204,184,588 rows, D 128: 104.5 GB in FP32, a 52 GB FP16
# row store), untrained, served hot/cold with MLPerf's hotness on this machine.
set -euo pipefail
cd "$(dirname "$0")/../.."
export PYTHONPATH="$PWD" PATH="$PWD/.venv/bin:$PATH"
WORK=${WORK:-artifacts/mlperf}
OUT=${OUT:-benchmarks/mlperf_hot_cold}
HOT_BUDGET=${HOT_BUDGET:-2G}
mkdir -p "$WORK" "$OUT"
synth=(--hotness mlperf --vocabulary mlperf-dcnv2 --max-vocabulary 4000000 --exponent 1.05)
[[ -f $WORK/train.tsv ]] || python -m criteo synth --rows 200000 --seed 1 --out "$WORK/train.tsv" "${synth[@]}"
[[ -f $WORK/heldout.tsv ]] || python -m criteo synth --rows 50000 --seed 2 --out "$WORK/heldout.tsv" "${synth[@]}"
[[ -f $WORK/profile/profile.json ]] ||
  python -m criteo profile --bags --data "$WORK/train.tsv" --out "$WORK/profile" --table-sizes mlperf-dcnv2
rm -rf "$WORK/repo"
/usr/bin/time -v -o "$OUT/export-time.txt" \
  python -m export synthetic-hot-cold --preset mlperf-dcnv2 --hotness mlperf --repository "$WORK/repo" \
    --store-dir "$WORK/rows-float16" --store-dtype float16 --hot-budget "$HOT_BUDGET" \
    --profile-data "$WORK/profile" --heldout-data "$WORK/heldout.tsv" --seed 0 2>&1 | tee "$OUT/export.log"
cp "$WORK/repo/dlrm_onnx/export_report.json" "$OUT/export_report.json"
python -m loadtest sweep --model dlrm_onnx --model dlrm_small --repository "$WORK/repo" --engine driver \
  --batch-size 1024 --concurrency 1,2,4 --duration 10 --rounds 2 --no-baseline --out "$OUT/sweep"
