#!/usr/bin/env bash
# Every GPU figure of the bundle in one run on a GPU host, written under OUT; `--cpu` runs the same
# path on a CPU machine at a tiny size (tests/lab/test_gpu_run_script.py runs it in make test, so the
# script cannot rot).
#
# What the GPU host needs:
#   - an NVIDIA GPU and driver that a CUDA build of PyTorch uses (`nvidia-smi` answers);
#   - PYTHON (python3): Python 3.12 with a CUDA build of torch and the rest of requirements.txt;
#   - nvidia-pytriton 0.7.0, numpy 1.26.4, onnxruntime-gpu 1.31.1 and tritonclient 2.73.0 in that
#     interpreter's own site-packages, and the Wide & Deep models (they need TensorFlow to export):
#     benchmarks/gpu/transfer.sh makes both on a machine with network access and TensorFlow, and
#     its header says what to copy over and how this script installs it (the install step);
#   - make, cmake and a C++17 compiler, for the compiled stages (`make stages`) that the hot/cold
#     model is served with, unless build/stages holds them already;
#   - a few GB free under WORK (/tmp/gpu-bench): a reference DLRM's FP32 ONNX file alone is 1.3 GB.
#
#   bash benchmarks/gpu/run.sh 2>&1 | tee run.log   # on the GPU host, from a copy of the checkout
#   bash benchmarks/gpu/run.sh --cpu                 # on a CPU machine: tiny models, cpu profile
#
# The steps, each timed into OUT/steps.tsv:
#   1. what needs only the host's own PyTorch: synthetic data, a reference-size DLRM trained there
#      (26 tables of TABLE_SIZE rows, D 128, bottom 512-256-128, top 1024-1024-512-256-1; once more
#      after step 2 should it have failed before);
#   2. the parts from transfer.sh joined and installed into the interpreter (transfer.sh join,
#      install); on the GPU host, the compiled stages built unless build/stages holds them;
#   3. the DLRM exported three ways at once: the gpu profile as shipped (dlrm_onnx FP32,
#      dlrm_onnx_fp16, dlrm_torch; KIND_GPU instances) with dlrm_aoti, its AOTInductor package
#      compiled for the GPU and checked against eager, the cpu profile's INT8 (the CPU default), and
#      hot/cold in the gpu profile (hot rows in the dense model on the GPU, the stage on the CPU,
#      checked against the all-in-graph model); Wide & Deep's gpu and INT8 variants from the payload;
#   4. lab gpu on the gpu profile: every DLRM and Wide & Deep variant at batch 1 (p50), 1024 and 8192,
#      system shared memory, in-process beside it; the verdicts: the fastest variant passing the AUC
#      gate against lab gpu's 15M samples/s target with its p99, FP16 against FP32 for both families;
#   5. lab gpu on the cpu profile's INT8 models (DLRM's FP32 should its INT8 gate refuse it), served on
#      the same host's cores; then lab gpu-vs-cpu:
#      batch-1 p50 and best throughput, GPU against CPU, per family;
#   6. lab gpu on the hot/cold model (an ensemble, served only) at 1024 and 8192;
#   7. lab gpu on dlrm_aoti (an ensemble around the package, served only), on its own.
# Not yet timed on an H100 as a whole: steps.tsv gives each step's seconds (GPU_STEPS and LAB_ARGS
# weigh most: about 5 steps of 1 + 2 x 1 s and a model load per variant).
# OUT stays small, at most 9 files: run.log (from the tee above), steps.tsv, results.tar.gz (every
# result file, the export reports and the server logs; rewritten after each step and every 20 s, so
# a run cut short still leaves what it measured), gpu.md, cpu.md, gpu_vs_cpu.md, hot_cold.md, aoti.md.
#
# The committed results of earlier GPU runs (result.*, instances/, fp16/, kernels.txt) came from this
# script's previous version (git history); this one writes nothing under benchmarks/.
#
# Knobs (environment): PYTHON, WORK (models and data), OUT, PAYLOAD (the joined parts), ROWS,
# TABLE_SIZE, PRESET, HOT_BUDGET, AOTI_ARGS (--aoti, or empty to leave dlrm_aoti out),
# GPU_STEPS / CPU_STEPS / HOT_COLD_STEPS (BATCHxCONCURRENCY lists),
# LAB_ARGS (options of every lab gpu call), SKIP (step names not to run: train install stages export
# gpu cpu hot_cold aoti), WIDE_DEEP_GPU_REPO and WIDE_DEEP_CPU_REPO (repositories holding the Wide & Deep models).
set -euo pipefail
cd "$(dirname "$0")/../.."
MODE=gpu
case ${1:-} in
  --cpu | --dry-run) MODE=cpu ;;
  "") ;;
  *) echo "usage: run.sh [--cpu]" >&2 && exit 2 ;;
esac
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1

if [[ $MODE == gpu ]]; then
  PYTHON=${PYTHON:-python3}
  WORK=${WORK:-/tmp/gpu-bench}
  PAYLOAD=${PAYLOAD:-/tmp/gpu-bench-payload}
  : "${PRESET:=reference}" "${TABLE_SIZE:=100000}" "${ROWS:=100000}" "${CHECK_ROWS:=4096}"
  : "${PROFILE:=gpu}" "${MAX_BATCH_SIZE:=16384}" "${HOT_BUDGET:=512M}"
  : "${GPU_STEPS:=1x1 1024x16 8192x16 8192x32}" "${CPU_STEPS:=1x1 1024x4 1024x16}"
  : "${HOT_COLD_STEPS:=1024x16 8192x16}"
  # dlrm_aoti: the AOTInductor package compiled for the host's GPU, checked against eager by the export
  : "${AOTI_ARGS=--aoti}"
  : "${LAB_ARGS:=--seconds 1 --repeats 2 --warmup 1 --baseline-seconds 0.5 --baseline-repeats 2 --processes 12 --profile-calls 10}"
else
  PYTHON=${PYTHON:-python}
  WORK=${WORK:-artifacts/gpu-bench-cpu}
  PAYLOAD=${PAYLOAD:-$WORK/payload}
  # KIND_GPU instances need a GPU: the same path with the cpu profile's configs
  : "${PRESET:=tiny}" "${TABLE_SIZE:=500}" "${ROWS:=4000}" "${CHECK_ROWS:=1024}"
  : "${PROFILE:=cpu}" "${MAX_BATCH_SIZE:=512}" "${HOT_BUDGET:=8K}"
  : "${GPU_STEPS:=1x1 256x2}" "${CPU_STEPS:=1x1 64x2}" "${HOT_COLD_STEPS:=64x1 256x2}"
  : "${LAB_ARGS:=--seconds 0.5 --repeats 1 --warmup 0.5 --baseline-seconds 0.1 --baseline-repeats 1 --processes 2 --profile-calls 2}"
  # the tiny, barely trained models check the path, not accuracy: INT8's gate opened wide
  : "${EXPORT_ARGS:=--int8-auc-tolerance 1.0}"
  : "${AOTI_ARGS=--aoti}"  # a tiny package compiles for the CPU in about half a minute
  export WD_PRESET=tiny WD_TABLE_SIZE=$TABLE_SIZE WD_ROWS=$ROWS CHECK_ROWS WD_GPU_PROFILE=$PROFILE \
    MAX_BATCH_SIZE WD_EXPORT_ARGS=${EXPORT_ARGS}
fi
# the interpreter's own bin first: the python backend's stub imports numpy from it
PATH="$("$PYTHON" -c 'import os, sys; print(os.path.dirname(sys.executable))'):$PATH"
OUT=${OUT:-$WORK/out}
RESULTS=$WORK/results
WIDE_DEEP_GPU_REPO=${WIDE_DEEP_GPU_REPO:-$PAYLOAD/wide_deep/gpu}
WIDE_DEEP_CPU_REPO=${WIDE_DEEP_CPU_REPO:-$PAYLOAD/wide_deep/cpu}
mkdir -p "$WORK/data" "$RESULTS" "$OUT" "$WORK/logs"
printf 'step\tseconds\tstatus\n' >"$OUT/steps.tsv"

pack() {  # every result file into OUT/results.tar.gz, the reports' markdown beside it
  # written beside, then moved: the packer in the background and a step's end may pack at once
  tar -czf "$WORK/results.$BASHPID.tar.gz" -C "$RESULTS" . && mv "$WORK/results.$BASHPID.tar.gz" "$OUT/results.tar.gz"
  local name
  for name in gpu cpu hot_cold aoti; do
    [[ -f $RESULTS/$name/result.md ]] && cp "$RESULTS/$name/result.md" "$OUT/$name.md"
  done
  [[ -f $RESULTS/gpu_vs_cpu.md ]] && cp "$RESULTS/gpu_vs_cpu.md" "$OUT/gpu_vs_cpu.md"
  return 0
}

step() {  # step NAME COMMAND...: run, time and record one step unless SKIP names it; pack after it
  local name=$1 start=$SECONDS status=ok
  shift
  if [[ " ${SKIP:-} " == *" $name "* ]]; then
    printf '%s\t0\tskipped\n' "$name" >>"$OUT/steps.tsv"
    return 0
  fi
  echo "== $name ($(date -u +%H:%M:%S))"
  # in the background, so that set -e holds inside the step (a function called in an || list runs
  # with errexit ignored)
  "$@" &
  wait $! || status="failed ($?)"
  printf '%s\t%d\t%s\n' "$name" $((SECONDS - start)) "$status" >>"$OUT/steps.tsv"
  pack
  [[ $status == ok ]]
}

lab_gpu() {  # lab_gpu NAME REPOSITORY "STEPS" MODEL...: python -m lab gpu into RESULTS/NAME
  # MODEL may be A|B: A if the export wrote it, else B (INT8 refused by its gate: the CPU's FP32).
  # A model no export wrote is left out (the export step has failed already): the others are measured.
  local name=$1 repository=$2 steps=() step
  for step in $3; do steps+=(--step "$step"); done
  shift 3
  local models=() choice model
  for choice in "$@"; do
    for model in ${choice//|/ }; do
      if [[ -f $repository/$model/config.pbtxt ]]; then
        models+=(--model "$model")
        break
      fi
      echo "no $model in $repository"
    done
  done
  ((${#models[@]})) || { echo "no model to measure in $repository" && return 1; }
  # shellcheck disable=SC2086  # LAB_ARGS: options, split on purpose
  "$PYTHON" -m lab gpu --repository "$repository" --data "$WORK/data/check.tsv" --out "$RESULTS/$name" \
    "${models[@]}" "${steps[@]}" $LAB_ARGS
}

machine() {
  {
    date -u +%FT%TZ
    nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>&1 || echo "no nvidia-smi"
    "$PYTHON" -c 'import torch; print("torch", torch.__version__, "cuda", torch.cuda.is_available())'
    nproc
  } >"$RESULTS/machine.txt"
  cat "$RESULTS/machine.txt"
}

train() {  # PyTorch only: runs before anything is installed
  "$PYTHON" -m criteo synth --rows "$ROWS" --seed 1 --out "$WORK/data/train.tsv"
  "$PYTHON" -m criteo synth --rows 20000 --seed 2 --out "$WORK/data/check.tsv"
  "$PYTHON" -m models train dlrm --preset "$PRESET" --table-size "$TABLE_SIZE" --data "$WORK/data/train.tsv" \
    --out "$WORK/dlrm"
}

install() {
  if [[ $MODE == gpu ]]; then
    bash benchmarks/gpu/transfer.sh join
    PYTHON=$PYTHON bash benchmarks/gpu/transfer.sh install
  elif [[ ! -d $WIDE_DEEP_GPU_REPO ]]; then  # here: the payload's Wide & Deep, made as prepare makes it
    PYTHON=$PYTHON bash benchmarks/gpu/transfer.sh wide-deep "$PAYLOAD/wide_deep"
  fi
}

stages() {  # the compiled stages (the hot/cold model is served with them), unless build/stages holds them
  [[ -f build/stages/embedding/libtriton_embedding.so && -f build/stages/raw_rows/libtriton_raw_rows.so ]] ||
    make stages
}

export_all() {  # the three DLRM exports at once (each its own log), then Wide & Deep beside them
  local common=(--checkpoint "$WORK/dlrm" --check-data "$WORK/data/check.tsv" --check-rows "$CHECK_ROWS"
    --max-batch-size "$MAX_BATCH_SIZE")
  rm -rf "$WORK/repo-gpu" "$WORK/repo-cpu" "$WORK/repo-hot-cold"
  # shellcheck disable=SC2086  # EXPORT_ARGS: extra options, split on purpose
  # shellcheck disable=SC2086  # AOTI_ARGS: --aoti by default, empty to leave dlrm_aoti out
  "$PYTHON" -m export dlrm "${common[@]}" --profile "$PROFILE" --torch $AOTI_ARGS --repository "$WORK/repo-gpu" \
    ${EXPORT_ARGS:-} >"$WORK/logs/export-gpu.log" 2>&1 &
  local gpu=$!
  # shellcheck disable=SC2086
  "$PYTHON" -m export dlrm "${common[@]}" --profile cpu --no-fp16 --repository "$WORK/repo-cpu" \
    ${EXPORT_ARGS:-} >"$WORK/logs/export-cpu.log" 2>&1 &
  local cpu=$!
  # shellcheck disable=SC2086
  "$PYTHON" -m export dlrm "${common[@]}" --profile "$PROFILE" --no-fp16 --no-int8 --no-raw-rows --embeddings hot-cold \
    --hot-budget "$HOT_BUDGET" --profile-data "$WORK/data/train.tsv" --repository "$WORK/repo-hot-cold" \
    ${EXPORT_ARGS:-} >"$WORK/logs/export-hot-cold.log" 2>&1 &
  local hot_cold=$! failed=0
  wait $gpu || { echo "gpu-profile export failed" && failed=1; }
  wait $cpu || { echo "cpu-profile export failed" && failed=1; }
  wait $hot_cold || { echo "hot/cold export failed" && failed=1; }
  mkdir -p "$RESULTS/exports"
  cp "$WORK"/logs/export-*.log "$RESULTS/exports/"
  for repository in repo-gpu repo-cpu repo-hot-cold; do
    for report in "$WORK/$repository"/*/export_report.json; do
      [[ -f $report ]] && cp "$report" "$RESULTS/exports/$repository-$(basename "$(dirname "$report")").json"
    done
  done
  cp -r "$WIDE_DEEP_GPU_REPO"/wide_deep_onnx "$WIDE_DEEP_GPU_REPO"/wide_deep_onnx_fp16 "$WORK/repo-gpu/"
  cp -r "$WIDE_DEEP_CPU_REPO"/wide_deep_onnx_int8 "$WORK/repo-cpu/"
  return $failed
}

gpu_vs_cpu() {
  "$PYTHON" -m lab gpu-vs-cpu --gpu "$RESULTS/gpu" --cpu "$RESULTS/cpu" --out "$RESULTS"
}

status=0
# what a run cut short (killed, or out of time) has measured is in OUT already
(while sleep 20; do pack; done) >/dev/null 2>&1 &
packer=$!
trap 'kill $packer 2>/dev/null || true' EXIT
step machine machine || status=1
step train train || status=1
step install install || status=1
if [[ $MODE == gpu ]]; then
  step stages stages || status=1
fi
# should training have needed what the install brings (numpy 1.26.4), once more after it
[[ -f $WORK/dlrm/model.pt ]] || step train_again train || status=1
step export export_all || status=1
step gpu lab_gpu gpu "$WORK/repo-gpu" "$GPU_STEPS" dlrm_onnx dlrm_onnx_fp16 dlrm_torch wide_deep_onnx \
  wide_deep_onnx_fp16 || status=1
step cpu lab_gpu cpu "$WORK/repo-cpu" "$CPU_STEPS" "dlrm_onnx_int8|dlrm_onnx" "wide_deep_onnx_int8" || status=1
step gpu_vs_cpu gpu_vs_cpu || status=1
step hot_cold lab_gpu hot_cold "$WORK/repo-hot-cold" "$HOT_COLD_STEPS" dlrm_onnx || status=1
# last and on its own: a package that fails to load on the GPU costs only its own figures
if [[ -n $AOTI_ARGS ]]; then
  step aoti lab_gpu aoti "$WORK/repo-gpu" "$GPU_STEPS" dlrm_aoti || status=1
fi
cp -r logs/loadtest-gpu-tritonserver.log "$RESULTS/" 2>/dev/null || true
pack
cat "$OUT/steps.tsv"
exit $status
