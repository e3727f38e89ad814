#!/usr/bin/env bash
# The Python wheels and Wide & Deep models that benchmarks/gpu/run.sh needs on a GPU host without
# network access: made on a machine that has network access and TensorFlow, copied over as a few
# checksummed parts, joined and installed on the GPU host.
#
# What run.sh needs on the GPU host (its header has the rest):
#   - an NVIDIA GPU and driver that the host's CUDA build of PyTorch uses (`nvidia-smi` answers);
#     the committed results come from an H100 80GB HBM3 with driver 580.159.04 (their record);
#   - PYTHON (python3) at GPU_PYTHON_VERSION (3.12: the wheels below are downloaded for it), with a
#     CUDA build of torch and the rest of the bundle's requirements (requirements.txt);
#   - these wheels in that interpreter's own site-packages: nvidia-pytriton 0.7.0 (tritonserver
#     2.51), numpy 1.26.4, onnxruntime-gpu 1.31.1 (run with CUDA 13's cuBLAS and cuDNN on the
#     system library path),
#     tritonclient 2.73.0 and what its clients import (LARGE_WHEELS and SMALL_WHEELS below);
#   - the Wide & Deep models, exported on a machine with TensorFlow (`wide-deep` below), since a
#     GPU host often has none; run.sh trains and exports the DLRM on the GPU host itself.
#
# On the machine with network access and TensorFlow, in the checkout:
#   bash benchmarks/gpu/transfer.sh prepare
# downloads the wheels, exports the Wide & Deep models (reference layers, WD_TABLE_SIZE rows per
# table: 1000), packs both into PACK_DIR/part.NN (PART_MIB MiB each) with their checksums in
# PACK_DIR/parts.sha256, and prints what to copy. With the defaults that is about 400 MB.
# On the GPU host, in a copy of the same checkout:
#   copy every part.NN and parts.sha256 into PARTS (by default PACK_DIR, artifacts/gpu-payload), or
#   copy them anywhere and move them there with `bash benchmarks/gpu/transfer.sh stash FILE...`;
#   then `bash benchmarks/gpu/run.sh 2>&1 | tee run.log`: it checks every part against
#   parts.sha256, joins them into PAYLOAD, installs the wheels and takes every figure.
# A GPU host with network access needs no parts: pip-install the wheels below into PYTHON (numpy and
# onnxruntime-gpu in place of the versions it has), make the Wide & Deep models with
# `transfer.sh wide-deep DIR` on a machine with TensorFlow, copy DIR over and run
#   SKIP=install WIDE_DEEP_GPU_REPO=DIR/gpu WIDE_DEEP_CPU_REPO=DIR/cpu bash benchmarks/gpu/run.sh
#
# The commands:
#   transfer.sh prepare         download the wheels, export Wide & Deep, then pack
#   transfer.sh pack            PACK_DIR/stage/{wheels,wide_deep} -> PACK_DIR/part.NN, parts.sha256
#   transfer.sh stash FILE...   move copied parts (and parts.sha256) into PARTS
#   transfer.sh join            check the parts that parts.sha256 lists, unpack them into PAYLOAD
#   transfer.sh install         pip-install PAYLOAD's wheels into PYTHON's own site-packages: the
#                               python backend's stub ignores PYTHONPATH, so onnxruntime-gpu must
#                               replace onnxruntime there (or no KIND_GPU model loads), and numpy
#                               1.26.4 must replace a numpy 2.x (with which every response came
#                               back with an empty output tensor)
#   transfer.sh wide-deep DIR   train and export the Wide & Deep models into DIR/{gpu,cpu} (needs
#                               TensorFlow; run.sh --cpu calls it too)
set -euo pipefail
cd "$(dirname "$0")/../.."
PYTHON=${PYTHON:-python3}
PACK_DIR=${PACK_DIR:-artifacts/gpu-payload}
PARTS=${PARTS:-$PACK_DIR}
PAYLOAD=${PAYLOAD:-/tmp/gpu-bench-payload}
PART_MIB=${PART_MIB:-50}
GPU_PYTHON_VERSION=${GPU_PYTHON_VERSION:-3.12}
# The wheels for the GPU host's Python (manylinux x86_64), pinned as the bundle's results used them.
LARGE_WHEELS=(nvidia-pytriton==0.7.0 numpy==1.26.4 onnxruntime-gpu==1.31.1)
SMALL_WHEELS=(tritonclient==2.73.0 python-rapidjson geventhttpclient gevent zope.event zope.interface greenlet
  brotli)
PLATFORMS=(--platform manylinux_2_35_x86_64 --platform manylinux_2_31_x86_64 --platform manylinux_2_28_x86_64
  --platform manylinux_2_27_x86_64 --platform manylinux_2_24_x86_64 --platform manylinux_2_17_x86_64
  --platform manylinux2014_x86_64 --platform manylinux1_x86_64)

download() {  # download DIR SPEC...: manylinux wheels for GPU_PYTHON_VERSION, no dependencies (each is named)
  local dir=$1
  shift
  python3 -m pip download -q --no-deps --only-binary=:all: --python-version "$GPU_PYTHON_VERSION" \
    --implementation cp "${PLATFORMS[@]}" -d "$dir" "$@"
}

wide_deep() {  # wide_deep DIR: Wide & Deep trained and exported into DIR/gpu and DIR/cpu
  local dir=$1 data=$1/data
  mkdir -p "$data"
  [[ -f $data/check.tsv ]] || {
    "$PYTHON" -m criteo synth --rows "${WD_ROWS:-100000}" --seed 1 --out "$data/train.tsv"
    "$PYTHON" -m criteo synth --rows 20000 --seed 2 --out "$data/check.tsv"
  }
  [[ -f $dir/model/config.json ]] || "$PYTHON" -m models train wide-deep --preset "${WD_PRESET:-reference}" \
    --table-size "${WD_TABLE_SIZE:-1000}" --data "$data/train.tsv" --out "$dir/model"
  local common=(--saved-model "$dir/model" --check-data "$data/check.tsv" --check-rows "${CHECK_ROWS:-4096}"
    --max-batch-size "${MAX_BATCH_SIZE:-16384}")
  # shellcheck disable=SC2086  # WD_EXPORT_ARGS: extra options, split on purpose
  "$PYTHON" -m export wide-deep "${common[@]}" --profile "${WD_GPU_PROFILE:-gpu}" --repository "$dir/gpu" \
    ${WD_EXPORT_ARGS:-}
  # The CPU side needs only the CPU default, INT8: the FP32 and FP16 files stay behind.
  # shellcheck disable=SC2086
  "$PYTHON" -m export wide-deep "${common[@]}" --profile cpu --repository "$dir/cpu.full" ${WD_EXPORT_ARGS:-}
  rm -rf "$dir/cpu" && mkdir -p "$dir/cpu" && mv "$dir/cpu.full/wide_deep_onnx_int8" "$dir/cpu/"
  rm -rf "$dir/cpu.full" "$dir/model" "$data"
}

case ${1:-} in
  prepare)
    rm -rf "$PACK_DIR" && mkdir -p "$PACK_DIR/stage/wheels"
    download "$PACK_DIR/stage/wheels" "${LARGE_WHEELS[@]}" "${SMALL_WHEELS[@]}"
    PYTHON=${PREPARE_PYTHON:-python} wide_deep "$PACK_DIR/stage/wide_deep"
    bash "$0" pack
    ;;
  pack)
    # PACK_DIR/stage/{wheels,wide_deep} -> PACK_DIR/part.NN of PART_MIB MiB, their checksums beside
    rm -f "$PACK_DIR"/part.* "$PACK_DIR/parts.sha256"
    tar -cf - -C "$PACK_DIR/stage" wheels wide_deep | split -b "${PART_MIB}M" -d - "$PACK_DIR/part."
    rm -rf "$PACK_DIR/stage"
    (cd "$PACK_DIR" && sha256sum part.* >parts.sha256)
    parts=("$PACK_DIR"/part.*)
    echo "copy these to the GPU host, into $PARTS (from the checkout there; or anywhere, then" \
      "bash benchmarks/gpu/transfer.sh stash FILE... moves them there):"
    for file in "${parts[@]}" "$PACK_DIR/parts.sha256"; do
      echo "  $file"
    done
    echo "then run there: bash benchmarks/gpu/run.sh 2>&1 | tee run.log"
    du -shc "${parts[@]}" | tail -1
    ;;
  stash)
    shift
    mkdir -p "$PARTS"
    for file in "$@"; do
      [[ $(realpath -m "$file") == "$(realpath -m "$PARTS")/$(basename "$file")" ]] || mv -f "$file" "$PARTS/"
    done
    ls -l "$PARTS"
    ;;
  join)
    [[ -f $PAYLOAD/.joined ]] && exit 0
    [[ -f $PARTS/parts.sha256 ]] || { echo "no $PARTS/parts.sha256: copy the parts and it there first" >&2 && exit 1; }
    (cd "$PARTS" && sha256sum -c --quiet parts.sha256)
    mapfile -t listed < <(awk '{print $2}' "$PARTS/parts.sha256")
    rm -rf "$PAYLOAD" && mkdir -p "$PAYLOAD"
    (cd "$PARTS" && cat "${listed[@]}") | tar -xf - -C "$PAYLOAD"
    touch "$PAYLOAD/.joined"
    ;;
  install)
    # Into the interpreter's own site-packages, never --target: the python backend's stub ignores
    # PYTHONPATH. onnxruntime goes first: onnxruntime-gpu installs the same module files.
    [[ -f $PAYLOAD/.installed ]] && exit 0  # installed already by an earlier run
    "$PYTHON" -m pip uninstall -q -y onnxruntime || true
    "$PYTHON" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --force-reinstall \
      "$PAYLOAD"/wheels/*.whl
    # both traps fail here, loudly, rather than as KIND_GPU models that do not load or empty outputs
    "$PYTHON" -c 'import sys, numpy, onnxruntime as ort; found = (numpy.__version__, ort.get_available_providers())
print("numpy", found[0], "onnxruntime", ort.__version__, found[1])
sys.exit(found[0] != "1.26.4" or "CUDAExecutionProvider" not in found[1])'
    touch "$PAYLOAD/.installed"
    ;;
  wide-deep)
    wide_deep "$2"
    ;;
  *)
    echo "usage: transfer.sh prepare | pack | stash FILE... | join | install | wide-deep DIR" >&2
    exit 2
    ;;
esac
