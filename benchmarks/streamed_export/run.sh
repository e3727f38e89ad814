#!/usr/bin/env bash
# A trained-model-shaped DLRM checkpoint larger than this machine's memory, exported hot/cold with
# `python -m export dlrm --stream-tables` and served.
#
# The checkpoint (`python -m models random-dlrm`: config.json + model.pt as `models train dlrm`
# writes them, untrained) has the Criteo Terabyte preset's layers (D 128, bottom 512-256-128, top
# 1024-1024-512-256-1) and its table sizes capped at CAP rows (54,063,992 rows at 10M: 27.7 GB of FP32
# tables, more than the 23.5 GiB of RAM here). The export loads it memory-mapped, writes the row store
# straight from its tables (STORE_DTYPE), keeps HOT_BUDGET of hot rows in the dense model, checks the
# two stages against the checkpoint's own PyTorch model, and writes the FP16 and INT8 variants. Its
# peak memory is measured twice: /usr/bin/time's maximum resident set (which counts the mapped
# checkpoint's and store's pages) and the export's own split into anonymous memory and mapped files
# (bundle.memory.PeakMemory). Then one sweep serves dlrm_onnx and dlrm_onnx_int8 at batch 1024.
#
#   bash benchmarks/streamed_export/run.sh        # from the repository root, after `make setup`
#
# Disk: twice the tables while model.pt is written (55 GB at the default CAP), then the checkpoint and
# the store (about 42 GB); WORK is removed at the end unless KEEP=1. About 30 minutes on 2 cores.
set -euo pipefail
cd "$(dirname "$0")/../.."
export PYTHONPATH="$PWD" PATH="$PWD/.venv/bin:$PATH"

WORK=${WORK:-artifacts/streamed-export}
OUT=${OUT:-benchmarks/streamed_export}
CAP=${CAP:-10000000}
HOT_BUDGET=${HOT_BUDGET:-1G}
STORE_DTYPE=${STORE_DTYPE:-float16}
TRAIN_ROWS=${TRAIN_ROWS:-1000000}
HELDOUT_ROWS=${HELDOUT_ROWS:-100000}
DURATION=${DURATION:-20}
COMMAND="${COMMAND_LINE:-bash benchmarks/streamed_export/run.sh}"
MACHINE=$(python -m bundle.records)  # CPU, cores, memory and CPU flags, as the load-test reports name them
mkdir -p "$WORK" "$OUT"
SIZES=$(python -c "from criteo.tables import CRITEO_TERABYTE as T; print(','.join(str(min(s, $CAP)) for s in T))")

[[ -f $WORK/dlrm/model.pt ]] || /usr/bin/time -v -o "$OUT/checkpoint_time.txt" \
  python -m models random-dlrm --preset criteo-terabyte --table-sizes "$SIZES" --out "$WORK/dlrm"
synth=(--vocabulary "$SIZES" --max-vocabulary 4000000 --exponent 1.05)
[[ -f $WORK/train.tsv ]] || python -m criteo synth --rows "$TRAIN_ROWS" --seed 1 --out "$WORK/train.tsv" "${synth[@]}"
[[ -f $WORK/heldout.tsv ]] || python -m criteo synth --rows "$HELDOUT_ROWS" --seed 2 --out "$WORK/heldout.tsv" "${synth[@]}"

rm -rf "$WORK/repo"
/usr/bin/time -v -o "$OUT/export_time.txt" \
  python -m export dlrm --checkpoint "$WORK/dlrm" --repository "$WORK/repo" --stream-tables \
    --embeddings hot-cold --hot-budget "$HOT_BUDGET" --store-dtype "$STORE_DTYPE" \
    --profile-data "$WORK/train.tsv" --check-data "$WORK/heldout.tsv" --check-rows 4096 \
    --calibration-data "$WORK/train.tsv" 2>&1 | tee "$OUT/export.log"
cp "$WORK/repo/dlrm_onnx/export_report.json" "$OUT/export_report.json"
du -b "$WORK/dlrm/model.pt" "$WORK"/repo/dlrm_embedding/rows/rows.bin "$WORK"/repo/dlrm_dense*/1/* > "$OUT/files.txt"

python -m loadtest sweep --repository "$WORK/repo" --model dlrm_onnx --model dlrm_onnx_int8 --protocol grpc \
  --batch-size 1024 --concurrency 1,2 --duration "$DURATION" --data "$WORK/heldout.tsv" \
  --out "$OUT/sweep" --raw "$WORK/sweep-raw" \
  --title "DLRM from a 27.7 GB checkpoint (tables larger than memory), exported with --stream-tables"

python - "$OUT" "$COMMAND" "$HOT_BUDGET" "$CAP" "$MACHINE" <<'PY'
import json
import re
import sys
from pathlib import Path

from bundle.snippets import section_end, section_start
from loadtest.sweeps.runs import SERVER_ANON, SERVER_RSS

out, command, budget, cap, machine = Path(sys.argv[1]), sys.argv[2], sys.argv[3], int(sys.argv[4]), sys.argv[5]
timing = (out / "export_time.txt").read_text()
wall = re.search(r"Elapsed \(wall clock\) time.*: (.*)", timing).group(1)
max_rss = int(re.search(r"Maximum resident set size \(kbytes\): (\d+)", timing).group(1)) * 1024
log = (out / "export.log").read_text()
peak = re.search(r"peak memory: (.*) anonymous, (.*) of mapped files", log)
made = json.loads((out / "export_report.json").read_text())
files = dict(reversed(line.split("\t")) for line in (out / "files.txt").read_text().splitlines())
checkpoint = next(int(size) for name, size in files.items() if name.endswith("model.pt"))
report = json.loads((out / "sweep" / "report.json").read_text())
steps = {(s["model"], s["concurrency"]): s for s in report["steps"]}
rows = ["| model | concurrency | samples/s | p50 / p99 ms | errors |", "|---|---:|---:|---:|---:|"]
for (model, c), s in sorted(steps.items()):
    rows.append(f"| {model} | {c} | {s['samples_per_s']:,.0f} | {s['p50_ms']:.1f} / {s['p99_ms']:.1f} | {s['errors']} |")
store = made["row_store"]
lines = [
    "# A DLRM checkpoint larger than memory, exported with --stream-tables",
    "",
    section_start("results"),  # what the documentation includes
    f"- command: `{command}`; date {report['started']}",
    f"- machine: {machine}",
    f"- checkpoint: untrained DLRM (`python -m models random-dlrm`), Criteo Terabyte layers, table sizes capped "
    f"at {cap:,} rows: {made['table_rows']:,} rows x D 128, model.pt {checkpoint / 1e9:.1f} GB "
    f"({checkpoint / 2**30:.1f} GiB) on a machine with {report['machine']['memory_gib']} GiB of RAM",
    f"- **export peak memory: {peak[1]} anonymous** (what the machine must hold; hot rows {made['hot_bytes'] / 1e9:.2f} GB "
    f"of the {budget} budget), plus {peak[2]} of mapped files (the checkpoint's and the store's pages: page cache); "
    f"/usr/bin/time's maximum resident set, which counts both: {max_rss / 2**30:.1f} GiB; wall {wall}",
    f"- row store: {store['dtype']}, {store['bytes'] / 1e9:.1f} GB, written from the checkpoint's tables; "
    f"hot rows {made['hot_rows']:,}, expected hit rate {made['expected_hit_rate']:.1%}, "
    f"on the check rows {made['measured_hit_rate']['hit_rate']:.1%}",
    f"- check: the two stages in-process vs the checkpoint's own PyTorch model, {made['parity']['rows']} rows "
    f"(check rows and out-of-range ids): max abs diff {made['parity']['max_abs_diff']:.2g}, "
    f"AUC delta {made['parity']['auc_delta']:+.1e} (gate: {made['tolerance']})",
    f"- served (tritonserver + stubs after the sweep): RSS {report['settings'][SERVER_RSS] / 1024:.2f} GiB, "
    f"of which {report['settings'][SERVER_ANON] / 1024:.2f} GiB anonymous",
    "",
    *rows,
    "",
    "Files: export.log, export_time.txt, export_report.json, files.txt, checkpoint_time.txt, sweep/.",
    section_end("results"),
]
(out / "summary.md").write_text("\n".join(lines) + "\n")
print("\n".join(lines))
PY
[[ -n ${KEEP:-} ]] || rm -rf "$WORK"
