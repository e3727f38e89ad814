#!/usr/bin/env bash
# Entrypoint of the compose `trt-build` service (nvcr.io/nvidia/tensorrt:<release>-py3):
# builds and checks the FP16 TensorRT plans of the repository mounted at /models.
# Extra arguments go to the command: `docker compose run --rm trt-build --force`.
#
# The image brings TensorRT, its Python bindings and CUDA. The bundle's own Python
# dependencies of `python -m export tensorrt` are installed into a named volume, once (again
# only when requirements.txt, the image's Python or the wheel source changes), at the versions
# requirements.txt pins (used as constraints, so the pins live in one place), as wheels only:
# nothing is compiled in the image.
#
# Where from: the wheels in deploy/trt-build/wheels/ when that folder holds any (no network),
# else the package index PIP_INDEX_URL names (compose: https://pypi.org/simple unless .env
# names a mirror).
# `build.sh download-wheels`, run in the same image on a machine with network, fills that
# folder with the wheels for the image's own Python:
#
#   docker run --rm -v "$PWD:/bundle" nvcr.io/nvidia/tensorrt:26.11-py3 \
#       bash /bundle/deploy/trt-build/build.sh download-wheels
#
# requirements.txt is resolved for Python 3.11; the image's Python may differ (NGC 25.01's is
# 3.12, 26.11's is not known here). A pinned version with no wheel for it stops the install with
# pip's own line naming the package.
set -euo pipefail

PACKAGES=(numpy onnx onnxruntime protobuf "tritonclient[grpc]" typer rich psutil)
# The service's mounts: the checkout, the packages' volume, the repository (other folders only
# where tests/unit/test_compose.py runs this script outside a container).
BUNDLE=${TRT_BUILD_BUNDLE:-/bundle}
DEPS=${TRT_BUILD_DEPS:-/opt/bundle-deps}
MODELS=${TRT_BUILD_MODELS:-/models}
WHEELS=$BUNDLE/deploy/trt-build/wheels
PYTHON_VERSION=$(python3 -c 'import sys; print("%d.%d" % sys.version_info[:2])')
PIP=(python3 -m pip --disable-pip-version-check)

if [ "${1:-}" = "download-wheels" ]; then
    echo "trt-build: downloading the wheels of ${PACKAGES[*]} for Python $PYTHON_VERSION into $WHEELS"
    mkdir -p "$WHEELS"
    "${PIP[@]}" download --only-binary=:all: --dest "$WHEELS" \
        --constraint "$BUNDLE/requirements.txt" "${PACKAGES[@]}"
    # The container runs as root: hand the wheels to the owner of the checkout.
    chown -R "$(stat -c '%u:%g' "$BUNDLE")" "$WHEELS"
    exit 0
fi

if compgen -G "$WHEELS/*.whl" >/dev/null; then
    SOURCE=(--no-index --find-links "$WHEELS")
    FROM="$WHEELS (no network)"
else
    SOURCE=()
    FROM="the package index ${PIP_INDEX_URL:-https://pypi.org/simple}"
fi
STAMP="$DEPS/.installed-$({ sha1sum <"$BUNDLE/requirements.txt"; echo "$PYTHON_VERSION ${SOURCE[*]}"; } | sha1sum | cut -c1-12)"

if [ ! -f "$STAMP" ]; then
    echo "trt-build: installing ${PACKAGES[*]} for Python $PYTHON_VERSION into $DEPS from $FROM" \
        "(constraints: requirements.txt)"
    mkdir -p "$DEPS"
    find "$DEPS" -mindepth 1 -delete
    # --target installs beside the image's packages, untouched by PEP 668's system-wide lock.
    if ! "${PIP[@]}" install --quiet --no-cache-dir --only-binary=:all: "${SOURCE[@]}" \
        --target "$DEPS" --constraint "$BUNDLE/requirements.txt" "${PACKAGES[@]}"; then
        echo "trt-build: error: pip could not install the pinned packages for the image's Python" \
            "$PYTHON_VERSION from $FROM (requirements.txt is resolved for Python 3.11; see" \
            "docs/serving/compose.md, \"What the first start downloads\")" >&2
        exit 1
    fi
    touch "$STAMP"
fi

export PYTHONPATH="$BUNDLE:$DEPS"
cd "$BUNDLE"
python3 -m export tensorrt \
    --repository "$MODELS" \
    --min-batch "${TRT_MIN_BATCH:-1}" \
    --opt-batch "${TRT_OPT_BATCH:-0}" \
    --max-batch "${TRT_MAX_BATCH:-0}" \
    "$@"

# The container runs as root: hand what it wrote to the owner of the repository folder.
chown -R "$(stat -c '%u:%g' "$MODELS")" "$MODELS"/*_trt
