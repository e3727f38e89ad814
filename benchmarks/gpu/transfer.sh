#!/usr/bin/env bash
# What benchmarks/gpu/run.sh needs on a lent GPU machine that the machine lacks, and how it gets there.
#
# The machine (../shared/GPU.md): Python 3.12 with a CUDA torch, numpy 2.x, a CPU-only onnxruntime,
# no TensorFlow, no network; each call of the device tool carries at most 64 MiB (the code is about
# 10 MiB of it) and the machine stays warm only about 30 s after a call. So:
#   - small wheels (tritonclient and what its clients import: about 7 MB) travel with the code, in
#     .gpu-carry/small, in the run's own call;
#   - the large ones (nvidia-pytriton 0.7.0, numpy 1.26.4, onnxruntime-gpu 1.31.1) and the Wide & Deep
#     models (exported here: the machine has no TensorFlow; reference layers, WD_TABLE_SIZE rows per
#     table so that they travel) go into one tar stream cut into parts of PART_MIB MiB
#     (.gpu-carry/part.NN), each carried by one call before the run, back to back, and set aside
#     outside the checkout (PARTS, /tmp/gpu-bench-parts) until the run joins them.
#
# On the CPU machine (network, TensorFlow):
#   bash benchmarks/gpu/transfer.sh prepare        # wheels + Wide & Deep -> .gpu-carry/{small,part.NN}
#   (prepare = download the wheels, `wide-deep .gpu-carry/stage/wide_deep`, then `pack`)
# prints the exact sequence of device calls; it is, for N parts (part.00 .. part.N-1):
#   run(carry=[".gpu-carry/part.00"], command="bash benchmarks/gpu/transfer.sh stash .gpu-carry/part.00", timeout_s=60)
#   ... one call per part, back to back (each within the 30 s the machine stays warm) ...
#   run(carry=[".gpu-carry/small"], timeout_s=540,
#       command="set -o pipefail; bash benchmarks/gpu/run.sh 2>&1 | tee $OUT/run.log")
# (the last part rides with the run's call when it fits: then that call carries it too and stashes
# it first). With the wheels above (about 330 MB) and the Wide & Deep models at 1000 rows per table
# (about 60 MB), that is 8 parts of 50 MiB: 7 calls before the run, the 8th part in the run's call.
# run.sh joins the parts (checksums in .gpu-carry/small/parts.sha256), installs the wheels into the
# interpreter, and takes every figure; then give the machine back. If any part's call failed (a fresh
# machine has none of the earlier parts), start again from part.00.
#
# On the GPU machine (what run.sh calls):
#   transfer.sh stash PART...   move carried parts out of the checkout into PARTS
#   transfer.sh join            check every part against parts.sha256, unpack into PAYLOAD
#   transfer.sh install         pip-install the payload's and the small wheels into PYTHON's own
#                               site-packages (GPU.md's two traps: the python backend's stub ignores
#                               PYTHONPATH, so onnxruntime-gpu must replace onnxruntime there, and
#                               numpy 1.26.4 must replace numpy 2.x)
#   transfer.sh wide-deep DIR   train and export the Wide & Deep models into DIR/{gpu,cpu} (needs
#                               TensorFlow: the CPU machine; run.sh --cpu calls it too)
set -euo pipefail
cd "$(dirname "$0")/../.."
PYTHON=${PYTHON:-python3}
CARRY=${CARRY:-.gpu-carry}
PARTS=${PARTS:-/tmp/gpu-bench-parts}
PAYLOAD=${PAYLOAD:-/tmp/gpu-bench-payload}
PART_MIB=${PART_MIB:-50}
CODE_MIB=${CODE_MIB:-12}  # what the checkout itself weighs in a call (git ls-files -co --exclude-standard)
# The wheels for the machine's Python (cp312, manylinux x86_64), pinned as GPU.md lists them.
LARGE_WHEELS=(nvidia-pytriton==0.7.0 numpy==1.26.4 onnxruntime-gpu==1.31.1)
SMALL_WHEELS=(tritonclient==2.73.0 python-rapidjson geventhttpclient gevent zope.event zope.interface greenlet
  brotli)
PLATFORMS=(--platform manylinux_2_35_x86_64 --platform manylinux_2_31_x86_64 --platform manylinux_2_28_x86_64
  --platform manylinux_2_27_x86_64 --platform manylinux_2_24_x86_64 --platform manylinux_2_17_x86_64
  --platform manylinux2014_x86_64 --platform manylinux1_x86_64)

download() {  # download DIR SPEC...: cp312 manylinux wheels, no dependencies (each is named)
  local dir=$1
  shift
  python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    "${PLATFORMS[@]}" -d "$dir" "$@"
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
    rm -rf "$CARRY" && mkdir -p "$CARRY/small" "$CARRY/stage/wheels"
    download "$CARRY/small" "${SMALL_WHEELS[@]}"
    download "$CARRY/stage/wheels" "${LARGE_WHEELS[@]}"
    PYTHON=${PREPARE_PYTHON:-python} wide_deep "$CARRY/stage/wide_deep"
    bash "$0" pack
    ;;
  pack)
    # CARRY/stage/{wheels,wide_deep} -> CARRY/part.NN of PART_MIB MiB, their checksums in CARRY/small
    rm -f "$CARRY"/part.*
    mkdir -p "$CARRY/small"
    tar -cf - -C "$CARRY/stage" wheels wide_deep | split -b "${PART_MIB}M" -d - "$CARRY/part."
    rm -rf "$CARRY/stage"
    (cd "$CARRY" && sha256sum part.* >small/parts.sha256)
    echo "device calls, back to back (then give the machine back):"
    parts=("$CARRY"/part.*)
    last=${parts[-1]} carried=()
    # the last part rides with the run when it fits beside the code and the small wheels (64 MiB)
    if (($(du -cm "$last" "$CARRY/small" | tail -1 | cut -f1) + CODE_MIB <= 60)); then
      unset 'parts[-1]'
      carried=("$last")
    fi
    for part in "${parts[@]}"; do
      echo "  run(carry=[\"$part\"], command=\"bash benchmarks/gpu/transfer.sh stash $part\", timeout_s=60)"
    done
    if ((${#carried[@]})); then
      echo "  run(carry=[\"$CARRY/small\", \"$last\"], timeout_s=540, command=\"set -o pipefail;" \
        "bash benchmarks/gpu/transfer.sh stash $last && bash benchmarks/gpu/run.sh 2>&1 | tee \$OUT/run.log\")"
    else
      echo "  run(carry=[\"$CARRY/small\"], timeout_s=540, command=\"set -o pipefail;" \
        "bash benchmarks/gpu/run.sh 2>&1 | tee \$OUT/run.log\")"
    fi
    du -sh "$CARRY"/part.* "$CARRY/small"
    ;;
  stash)
    shift
    mkdir -p "$PARTS"
    for part in "$@"; do mv -f "$part" "$PARTS/"; done
    ls -l "$PARTS"
    ;;
  join)
    [[ -f $PAYLOAD/.joined ]] && exit 0
    manifest=$(realpath "$CARRY/small/parts.sha256")
    (cd "$PARTS" && sha256sum -c --quiet "$manifest")
    rm -rf "$PAYLOAD" && mkdir -p "$PAYLOAD"
    cat "$PARTS"/part.* | tar -xf - -C "$PAYLOAD"
    touch "$PAYLOAD/.joined"
    ;;
  install)
    # Into the interpreter's own site-packages, never --target: the python backend's stub ignores
    # PYTHONPATH. onnxruntime goes first: onnxruntime-gpu installs the same module files.
    [[ -f $PAYLOAD/.installed ]] && exit 0  # a rerun on the same warm machine
    "$PYTHON" -m pip uninstall -q -y onnxruntime || true
    "$PYTHON" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --force-reinstall \
      "$PAYLOAD"/wheels/*.whl "$CARRY"/small/*.whl
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
    echo "usage: transfer.sh prepare | pack | stash PART... | join | install | wide-deep DIR" >&2
    exit 2
    ;;
esac
