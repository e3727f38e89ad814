#!/usr/bin/env bash
# Reproduces benchmarks/gpu on a machine with an NVIDIA GPU:
#   1. a reference-size DLRM (26 tables of 100,000 rows, D 128, bottom 512-256-128, top
#      1024-1024-512-256-1) trained on 200,000 synthetic rows, exported in the gpu profile:
#      dlrm_onnx (FP32) and dlrm_onnx_fp16 on ONNX Runtime CUDA, dlrm_torch (TorchScript FP16),
#      each checked by the export (parity, AUC gate, and CUDA against CPU where a GPU is present);
#   2. Wide & Deep's gpu variants beside them: trained and exported here when TensorFlow is
#      installed, else taken from WIDE_DEEP_REPO (a gpu-profile repository exported elsewhere);
#   3. copies of dlrm_torch and dlrm_onnx with two instances on the GPU (<model>_x2; COPIES);
#   4. python -m lab gpu: served (local tritonserver, gRPC, system shared memory, up to 8
#      client processes) and in-process samples/s of every model at batch 1024 and 8192,
#      concurrency 1, 4 and 16 -> result.{json,md,png}.
#
#   bash benchmarks/gpu/run.sh      # from the repository root, after `make setup GPU=1` and a CUDA torch
#   # instances per GPU (benchmarks/gpu/instances), the second run:
#   COPIES="dlrm_torch:4 dlrm_onnx:4 dlrm_onnx_fp16:2 dlrm_onnx_fp16:4 wide_deep_onnx:2 wide_deep_onnx_fp16:2" \
#   MODELS="dlrm_torch_x4 dlrm_onnx_x4 dlrm_onnx_fp16_x2 dlrm_onnx_fp16_x4 wide_deep_onnx_x2 wide_deep_onnx_fp16_x2" \
#   LOADTEST_ARGS="--step 1024x16 --step 8192x4 --step 8192x16 --step 8192x32" OUT=benchmarks/gpu/instances \
#   bash benchmarks/gpu/run.sh
#   # FP16 without FP32 islands against FP32 (benchmarks/gpu/fp16; that run trained on 20,000 rows, checked
#   # on 8,192, and exported with --no-torch), the third run:
#   ROWS=20000 COPIES="" MODELS="dlrm_onnx dlrm_onnx_fp16" LOADTEST_ARGS="--step 8192x4 --step 8192x16" \
#   OUT=benchmarks/gpu/fp16 bash benchmarks/gpu/run.sh
#   # each kernel's GPU time in one call (benchmarks/gpu/kernels.txt; that run's FP16 DLRM kept its FP32 island):
#   python -m lab kernels --repository artifacts/gpu-bench/repo --model dlrm_onnx --model dlrm_onnx_fp16 \
#     --model wide_deep_onnx --model wide_deep_onnx_fp16 --model dlrm_torch --out benchmarks/gpu
#
# PYTHON picks the interpreter (default: python); it needs onnxruntime-gpu in place of onnxruntime and a
# CUDA build of torch. About 15 minutes on an H100 host with 16 cores. Models and data go to WORK
# (artifacts/gpu-bench, not committed); the results to OUT (benchmarks/gpu).
set -euo pipefail
cd "$(dirname "$0")/../.."
PYTHON=${PYTHON:-python}
WORK=${WORK:-artifacts/gpu-bench}
OUT=${OUT:-benchmarks/gpu}
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"

# PRESET, TABLE_SIZE, ROWS, PROFILE and LOADTEST_ARGS are for trying the script out at a small size.
ROWS=${ROWS:-200000}
train=(--preset "${PRESET:-reference}" --table-size "${TABLE_SIZE:-100000}" --data "$WORK/data/train.tsv"
  --valid "$WORK/data/valid.tsv" --max-rows "$ROWS")
export_flags=(--profile "${PROFILE:-gpu}" --max-batch-size 16384 --check-data "$WORK/data/check.tsv"
  --check-rows 4096)
if [[ ! -f $WORK/data/valid.tsv ]]; then
  "$PYTHON" -m criteo synth --rows "$ROWS" --seed 1 --out "$WORK/data/train.tsv"
  "$PYTHON" -m criteo synth --rows 20000 --seed 2 --out "$WORK/data/check.tsv"
  "$PYTHON" -m criteo synth --rows 20000 --seed 3 --out "$WORK/data/valid.tsv"
fi
[[ -f $WORK/dlrm/model.pt ]] || "$PYTHON" -m models train dlrm "${train[@]}" --out "$WORK/dlrm"
if [[ ! -f $WORK/repo/dlrm_torch/1/model.pt ]]; then
  "$PYTHON" -m export dlrm --checkpoint "$WORK/dlrm" --repository "$WORK/repo" --torch "${export_flags[@]}"
fi
if [[ ! -f $WORK/repo/wide_deep_onnx/1/model.onnx ]]; then
  if [[ -n ${WIDE_DEEP_REPO:-} ]]; then
    cp -r "$WIDE_DEEP_REPO"/wide_deep_onnx "$WIDE_DEEP_REPO"/wide_deep_onnx_fp16 "$WORK/repo/"
  else
    [[ -f $WORK/wide_deep/config.json ]] || "$PYTHON" -m models train wide-deep "${train[@]}" --out "$WORK/wide_deep"
    "$PYTHON" -m export wide-deep --saved-model "$WORK/wide_deep" --repository "$WORK/repo" "${export_flags[@]}"
  fi
fi
# COPIES: <model>:<n> -> <model>_x<n>, the same files (hard links) with n instances on the GPU.
for spec in ${COPIES-dlrm_torch:2 dlrm_onnx:2}; do
  model=${spec%:*} count=${spec#*:}
  if [[ ! -d $WORK/repo/${model}_x$count ]]; then
    cp -al "$WORK/repo/$model" "$WORK/repo/${model}_x$count"
    rm "$WORK/repo/${model}_x$count/config.pbtxt"  # a link to the original's: written anew below
    "$PYTHON" - "$WORK/repo" "$model" "$count" <<'PY'
import sys
from pathlib import Path

from bundle.repository import read_config, write_config

repository, model, count = Path(sys.argv[1]), sys.argv[2], int(sys.argv[3])
config = read_config(repository / model / "config.pbtxt")
config.name = f"{model}_x{count}"
config.instance_group[0].count = count
write_config(repository / config.name, config)
PY
  fi
done

models=()
for model in ${MODELS:-dlrm_onnx dlrm_onnx_fp16 dlrm_torch wide_deep_onnx wide_deep_onnx_fp16 dlrm_torch_x2 dlrm_onnx_x2}; do
  models+=(--model "$model")
done
# shellcheck disable=SC2086  # LOADTEST_ARGS: extra options, split on purpose
"$PYTHON" -m lab gpu --repository "$WORK/repo" --data "$WORK/data/check.tsv" --out "$OUT" "${models[@]}" \
  ${LOADTEST_ARGS:-}
