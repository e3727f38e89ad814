#!/usr/bin/env bash
# FP32, FP16 and INT8 of one hot/cold model, served side by side on this CPU (export.tables.hot_cold_variants).
#
# The reference DLRM (D 128, bottom 512-256-128, top 1024-1024-512-256-1, 26 tables of 100,000 rows:
# 1.33 GB of FP32 tables) trained on 200,000 skewed synthetic rows, exported with a hot budget of
# HOT_BUDGET (about a tenth of the table bytes): `python -m export dlrm --hot-budget` writes the
# row store, the one embedding stage, and three dense models (FP32, FP16, INT8 static calibrated on
# training rows), each under its own ensemble (dlrm_onnx, dlrm_onnx_fp16, dlrm_onnx_int8), each
# variant gated on AUC against the FP32 pair. Then one `python -m loadtest sweep` loads the three
# ensembles in one local tritonserver and measures them side by side at batch 1024 over gRPC,
# concurrency 1, 2, 4, with held-out rows as payload.
#
#   bash benchmarks/hot_cold/run.sh        # from the repository root, after `make setup`
#
# About 25 minutes on a 2-core machine (training about 10, export about 5, sweep about 5). The
# machine may be shared: the sweep takes /tmp/bench.lock and starts once the 1-minute load average
# is below 1.0. Models and data go to WORK (not committed); OUT gets the export reports, the file
# sizes and the sweep's report (sweep/report.{md,json,png}).
set -euo pipefail
cd "$(dirname "$0")/../.."
export PYTHONPATH="$PWD" PATH="$PWD/.venv/bin:$PATH"

WORK=${WORK:-artifacts/hot-cold-bench}
OUT=${OUT:-benchmarks/hot_cold}
HOT_BUDGET=${HOT_BUDGET:-128M}
DURATION=${DURATION:-20}
mkdir -p "$WORK" "$OUT"

quiet() {  # run "$@" holding the benchmark lock, once the machine is idle
  flock /tmp/bench.lock sh -c 'while awk "{exit !(\$1 >= 1.0)}" /proc/loadavg; do sleep 10; done; exec "$@"' quiet "$@"
}

if [[ ! -f $WORK/data/heldout.tsv ]]; then
  python -m criteo synth --rows 200000 --seed 1 --out "$WORK/data/train.tsv"
  python -m criteo synth --rows 20000 --seed 2 --out "$WORK/data/check.tsv"
  python -m criteo synth --rows 20000 --seed 3 --out "$WORK/data/heldout.tsv"
fi
[[ -f $WORK/dlrm/model.pt ]] || python -m models train dlrm --preset reference --table-size 100000 \
  --data "$WORK/data/train.tsv" --valid "$WORK/data/check.tsv" --max-rows 200000 --out "$WORK/dlrm"

rm -rf "$WORK/repo"
python -m export dlrm --checkpoint "$WORK/dlrm" --repository "$WORK/repo" --hot-budget "$HOT_BUDGET" \
  --profile-data "$WORK/data/train.tsv" --check-data "$WORK/data/check.tsv" --check-rows 4096 \
  --calibration-data "$WORK/data/train.tsv" 2>&1 | tee "$OUT/export.log"
for model in dlrm_onnx dlrm_onnx_fp16 dlrm_onnx_int8; do
  cp "$WORK/repo/$model/export_report.json" "$OUT/$model.export_report.json"
done
(cd "$WORK/repo" && du -b dlrm_embedding/rows/* dlrm_dense*/1/*) > "$OUT/model_files.txt"

quiet python -m loadtest sweep --repository "$WORK/repo" --model dlrm_onnx --model dlrm_onnx_fp16 \
  --model dlrm_onnx_int8 --protocol grpc --batch-size 1024 --concurrency 1,2,4 --duration "$DURATION" \
  --data "$WORK/data/heldout.tsv" --out "$OUT/sweep" --raw "$WORK/sweep-raw" \
  --title "Reference DLRM served hot/cold ($HOT_BUDGET of hot rows): FP32, FP16 and INT8 dense models over one stage"
