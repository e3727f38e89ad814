#!/usr/bin/env bash
# Entrypoint of the compose `trt-build` service (nvcr.io/nvidia/tensorrt:<release>-py3):
# builds and checks the FP16 TensorRT plans of the repository mounted at /models.
#
# The image brings TensorRT, its Python bindings and CUDA. The bundle's own
# Python dependencies of `python -m export tensorrt` are installed into a named
# volume at the versions pinned in requirements.txt (used as constraints, so
# the pins live in one place), again only when requirements.txt changes.
# Extra arguments go to the command: `docker compose run --rm trt-build --force`.
set -euo pipefail

DEPS=/opt/bundle-deps
PACKAGES=(numpy onnx onnxruntime protobuf "tritonclient[grpc]" typer rich psutil)
STAMP="$DEPS/.installed-$(sha1sum /bundle/requirements.txt | cut -c1-12)"

if [ ! -f "$STAMP" ]; then
    echo "trt-build: installing ${PACKAGES[*]} into $DEPS (constraints: requirements.txt)"
    find "$DEPS" -mindepth 1 -delete
    # --target installs beside the image's packages, untouched by PEP 668's system-wide lock.
    python3 -m pip install --quiet --disable-pip-version-check --no-cache-dir \
        --target "$DEPS" --constraint /bundle/requirements.txt "${PACKAGES[@]}"
    touch "$STAMP"
fi

export PYTHONPATH="/bundle:$DEPS"
cd /bundle
python3 -m export tensorrt \
    --repository /models \
    --min-batch "${TRT_MIN_BATCH:-1}" \
    --opt-batch "${TRT_OPT_BATCH:-0}" \
    --max-batch "${TRT_MAX_BATCH:-0}" \
    "$@"

# The container runs as root: hand what it wrote to the owner of the repository folder.
chown -R "$(stat -c '%u:%g' /models)" /models/*_trt
