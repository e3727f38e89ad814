#!/usr/bin/env bash
# Reproduces benchmarks/soak_stages/result.{json,md} (and rss.png): the compiled backends under the
# soak of benchmarks/soak (100 checked requests/s for 10 minutes from 2 client threads, gRPC and
# HTTP, batch sizes 1, 8, 64 and 256), beside a plain model on the same local tritonserver:
#
#   dlrm_onnx      the hot/cold ensemble: the embedding stage (backend embedding, C++) and the dense model;
#   dlrm_onnx_raw  the raw-row ensemble over it: rows' text parsed by criteo_rows (backend raw_rows, C++);
#   dlrm_plain     the same untrained `small` DLRM exported in-graph (the Python-based onnxruntime backend).
#
# Every answer is compared with ONNX Runtime in process running dlrm_plain's model.onnx (the
# ensembles equal the in-graph model within 1e-6; dlrm_onnx_raw on the parsed rows). Targets: 0
# failed and 0 wrong answers, RSS growth after the 60 s warm-up < 5 %.
#
#   bash benchmarks/soak_stages/run.sh        # from the repository root, after `make setup`
#
# About 12 minutes on 2 cores. Models go to artifacts/soak_stages (not committed).
set -euo pipefail
cd "$(dirname "$0")/../.."
export PYTHONPATH="$PWD" PATH="$PWD/.venv/bin:$PATH"

WORK=${WORK:-artifacts/soak_stages}
REPO=$WORK/model_repository
if [[ ! -f $REPO/dlrm_plain/1/model.onnx || ! -f $REPO/dlrm_embedding/config.pbtxt || -n ${REBUILD:-} ]]; then
  rm -rf "$WORK/plain" "$REPO"
  python -m criteo synth --rows 4000 --out "$WORK/data/valid.tsv" --seed 2
  python -m models random-dlrm --preset small --out "$WORK/dlrm"
  python -m export dlrm --checkpoint "$WORK/dlrm" --repository "$WORK/plain" --no-fp16 --no-int8 \
    --check-data "$WORK/data/valid.tsv" --check-rows 1024
  python -m export dlrm --checkpoint "$WORK/dlrm" --repository "$REPO" --no-fp16 --no-int8 \
    --embeddings hot-cold --hot-budget 64K --profile-data "$WORK/data/valid.tsv" --raw-rows \
    --check-data "$WORK/data/valid.tsv" --check-rows 1024
  # The in-graph export serves beside the ensembles under a name of its own.
  cp -r "$WORK/plain/dlrm_onnx" "$REPO/dlrm_plain"
  sed -i 's/^name: "dlrm_onnx"$/name: "dlrm_plain"/' "$REPO/dlrm_plain/config.pbtxt"
fi

python -m lab soak --repository "$REPO" --model dlrm_plain --model dlrm_onnx --model dlrm_onnx_raw \
  --reference "dlrm_onnx=$REPO/dlrm_plain/1/model.onnx" --duration "${DURATION:-600}" \
  --warmup "${WARMUP:-60}" --log-file "$WORK/soak-tritonserver.log" --out benchmarks/soak_stages
