#!/usr/bin/env bash
# MLPerf's DLRM-DCNv2 served on this machine: the dlrm-v2 layers and hotness (214 ids per user-item
# pair) at reduced table sizes, as a user brings it from TorchRec.
#
#   1. python -m models torchrec-dcn: DLRMTrain(DLRM_DCN) built with TorchRec, MLPerf's layers
#      (D 128, bottom 512-256-128, 3 cross layers of rank 512, top 1024-1024-512-256-1), its 26 table
#      sizes capped at 200,000 rows (1.72M rows, 0.88 GB of FP32 tables), untrained;
#   2. python -m export dlrm --checkpoint ... --hotness mlperf: FP32, FP16 and static INT8 (the cross
#      net stays FP32), each checked against TorchRec's forward and its AUC gate;
#   3. python -m lab precision: every variant served over gRPC at batch 1024 (pairs per request),
#      concurrency 1, 2 and 4, and in-process, as samples/s (one sample = one user-item pair) and as
#      fractions of this machine's FP32 GEMM ceiling, with ONNX Runtime's INT8 GEMM rate measured in
#      the same run (precision.md);
#   4. python -m loadtest sweep: FP32 and INT8 over gRPC at batch 1024, concurrency 1, 2 and 4, the
#      closed-loop driver, two rounds: pairs/s and p50/p99 latency per step (sweep/report.md).
#
#   bash benchmarks/dcnv2/run.sh        # from the repository root, after `make setup`
#
# About 1.5 GB of disk in WORK and 15 minutes on a 2-core machine.
set -euo pipefail
cd "$(dirname "$0")/../.."
export PYTHONPATH="$PWD" PATH="$PWD/.venv/bin:$PATH"

WORK=${WORK:-artifacts/dcnv2}
OUT=${OUT:-benchmarks/dcnv2}
mkdir -p "$WORK" "$OUT"

python -m models torchrec-dcn --out "$WORK/dlrm_dcn.pt" --max-rows 200000
rm -rf "$WORK/repo"
python -m export dlrm --checkpoint "$WORK/dlrm_dcn.pt" --hotness mlperf --repository "$WORK/repo" \
  --check-rows 4096 --no-raw-rows 2>&1 | tee "$OUT/export.log"
python -m lab precision --repository "$WORK/repo" --batch-size 1024 --concurrency 1,2,4 --rounds 3 \
  --out "$OUT"
python -m loadtest sweep --repository "$WORK/repo" --model dlrm_onnx --model dlrm_onnx_int8 --protocol grpc \
  --engine driver --batch-size 1024 --concurrency 1,2,4 --duration 10 --warmup 2 --rounds 2 --no-baseline \
  --out "$OUT/sweep"
