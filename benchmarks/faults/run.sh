#!/usr/bin/env bash
# Reproduces benchmarks/faults/result.{json,md}: the fault table. On tiny DLRMs trained and exported
# for it (two checkpoints; in-graph FP32/FP16/INT8/TorchScript, and hot/cold with FP16/INT8 variants),
# the local tritonserver meets each fault: a python-backend stub SIGKILL under load (plain model and
# hot/cold dense step), tritonserver SIGKILL under load, a server crash and a stage crash under
# `python -m server serve` (tritonserver SIGKILLed; SIGSEGV sent to it while the compiled raw-row
# stage serves), each damaged file, an export and a rollout killed at six points each, and an export
# out of space (a file-size limit). Targets: 0 wrong answers, every model that was loadable before
# loads, recovery within 15 s of a crash.
#
#   bash benchmarks/faults/run.sh        # from the repository root, after `make setup`
#
# About 10 minutes on 2 cores. The code is lab/faults/ (`python -m lab faults`).
set -euo pipefail
cd "$(dirname "$0")/../.."
export PYTHONPATH="$PWD" PATH="$PWD/.venv/bin:$PATH"

python -m lab faults --out benchmarks/faults
