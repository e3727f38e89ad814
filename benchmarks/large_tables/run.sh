#!/usr/bin/env bash
# Benchmark 1 of the hot/cold embedding placement issue: a DLRM larger than this machine's memory.
#
# A DLRM with the Criteo Terabyte preset's layers (D 128, bottom 512-256-128, top 1024-1024-512-256-1)
# and table sizes (187,767,399 rows): its FP16 row store is 48 GB, twice this machine's RAM. It is
# not trained (training it needs the Terabyte data set): `python -m export synthetic-hot-cold` writes random
# tables straight to the row store (streamed, never all in memory), keeps the hottest rows of a
# measured profile inside the dense model (HOT_BUDGET of FP32 rows) and writes, in the same
# repository, dlrm_small: the same dense layers with small in-graph tables (4096 rows a table).
# Both are served by one local tritonserver and loaded side by side in one sweep.
#
#   1. skewed synthetic traffic with the Terabyte vocabulary, capped at MAX_VOCABULARY distinct ids a
#      table (the generator holds the vocabulary in memory): a training file, whose profile chooses the
#      hot rows, and a held-out file of the same hidden model (another --seed), whose rows the load
#      test sends and whose lookups measure the hot-hit rate;
#   2. python -m criteo profile: lookups per row, ids reduced into the table sizes;
#   3. python -m export synthetic-hot-cold: the row store (in WORK; reused when it already holds this store),
#      the hot set, dlrm_onnx (ensemble: embedding stage + dense model) and dlrm_small, checked
#      against the store (max abs diff within 1e-3 for FP16, 1e-6 for FP32);
#   4. python -m loadtest sweep of both models at batch 1024, concurrency 1,2,4, gRPC, the held-out
#      rows as payload; samples/s, p50/p99 and the server's RSS (tritonserver + python stubs).
#      dlrm_onnx is an ensemble (no model.onnx): the load test gives it no in-process baseline (it
#      says so and goes on); dlrm_small keeps its baseline;
#   5. summary.md: dlrm_onnx / dlrm_small samples/s (target >= 0.8), the held-out hot-hit rate, the
#      server RSS, the command and the date.
#
#   bash benchmarks/large_tables/run.sh          # from the repository root, after `make setup`
#
# Full size: about 53 GB of disk in WORK (the 48 GB store, 2.1 GB of dense model, 1.1 GB of data) and,
# on this 2-core machine, about 15 minutes to write the store (measured here: random_rows makes the
# big tables' FP16 values at about 60 MB/s, their +-sqrt(1/rows) ~ 1.6e-4 being FP16 subnormals, whose
# conversion is slow; small tables go 5x faster), a few minutes for the data, the profile and the dense
# model (its 3.8M hot rows are read from the store), and about 5 minutes of sweep; synthetic-hot-cold's peak
# anonymous memory is about twice the hot rows (its RSS also counts the store's mapped pages). A store
# already in WORK with the same sizes, dtype and seed is
# reused (then the whole run takes about 10 minutes). Every size can be overridden for a small run, e.g.
#
#   SIZES=$(python -c "from criteo.tables import CRITEO_TERABYTE as T; print(','.join(str(min(s, 100000)) for s in T))") \
#   SIZES_LABEL="Terabyte sizes capped at 100k" HOT_BUDGET=64M MAX_VOCABULARY=200000 TRAIN_ROWS=300000 HELDOUT_ROWS=100000 DURATION=10 \
#   WORK=artifacts/large-tables-small OUT=artifacts/large-tables-small/out bash benchmarks/large_tables/run.sh
set -euo pipefail
cd "$(dirname "$0")/../.."
export PYTHONPATH="$PWD" PATH="$PWD/.venv/bin:$PATH"

WORK=${WORK:-artifacts/large-tables}
OUT=${OUT:-benchmarks/large_tables}
PRESET=${PRESET:-criteo-terabyte}
SIZES=${SIZES:-criteo-terabyte}
SIZES_LABEL=${SIZES_LABEL:-$SIZES}
VOCABULARY=${VOCABULARY:-$SIZES}
MAX_VOCABULARY=${MAX_VOCABULARY:-4000000}
EXPONENT=${EXPONENT:-1.05}
TRAIN_ROWS=${TRAIN_ROWS:-4000000}
HELDOUT_ROWS=${HELDOUT_ROWS:-500000}
STORE_DTYPE=${STORE_DTYPE:-float16}
HOT_BUDGET=${HOT_BUDGET:-2G}
SEED=${SEED:-0}
DURATION=${DURATION:-20}
COMMAND="${COMMAND_LINE:-bash benchmarks/large_tables/run.sh}"
mkdir -p "$WORK" "$OUT"

# The data files are reused when present: delete them after changing the vocabulary, rows or exponent.
synth=(--vocabulary "$VOCABULARY" --max-vocabulary "$MAX_VOCABULARY" --exponent "$EXPONENT")
[[ -f $WORK/train.tsv ]] || python -m criteo synth --rows "$TRAIN_ROWS" --seed 1 --out "$WORK/train.tsv" "${synth[@]}"
[[ -f $WORK/heldout.tsv ]] || python -m criteo synth --rows "$HELDOUT_ROWS" --seed 2 --out "$WORK/heldout.tsv" "${synth[@]}"

python -m criteo profile --data "$WORK/train.tsv" --out "$WORK/profile" --table-sizes "$SIZES"

rm -rf "$WORK/repo"
# The synthetic-hot-cold command (python -m export synthetic-hot-cold).
/usr/bin/time -v -o "$OUT/random_dlrm_time.txt" \
  python -m export synthetic-hot-cold --preset "$PRESET" --table-sizes "$SIZES" --repository "$WORK/repo" \
    --store-dir "$WORK/rows-$STORE_DTYPE" --store-dtype "$STORE_DTYPE" --hot-budget "$HOT_BUDGET" \
    --profile-data "$WORK/profile" --heldout-data "$WORK/heldout.tsv" --seed "$SEED" 2>&1 \
  | tee "$OUT/random_dlrm.log"
cp "$WORK/repo/dlrm_onnx/export_report.json" "$OUT/random_dlrm_report.json"
du -b "$WORK/rows-$STORE_DTYPE/rows.bin" "$WORK"/repo/*/1/* > "$OUT/model_files.txt"

python -m loadtest sweep --repository "$WORK/repo" --model dlrm_onnx --model dlrm_small --protocol grpc \
  --batch-size 1024 --concurrency 1,2,4 --duration "$DURATION" --data "$WORK/heldout.tsv" \
  --out "$OUT/sweep" --raw "$WORK/sweep-raw" \
  --title "DLRM with $PRESET layers and $SIZES_LABEL tables ($STORE_DTYPE row store) vs small in-graph tables"

python - "$OUT" "$COMMAND" "$HOT_BUDGET" <<'EOF'
import json
import re
import sys
from pathlib import Path

from loadtest.sweeps.runs import SERVER_ANON, SERVER_RSS

out, command, budget = Path(sys.argv[1]), sys.argv[2], sys.argv[3]
timing = (out / "random_dlrm_time.txt").read_text()
wall = re.search(r"Elapsed \(wall clock\) time.*: (.*)", timing).group(1)
peak = int(re.search(r"Maximum resident set size \(kbytes\): (\d+)", timing).group(1))
made = json.loads((out / "random_dlrm_report.json").read_text())
report = json.loads((out / "sweep" / "report.json").read_text())
steps = {(s["model"], s["concurrency"]): s for s in report["steps"]}
levels = sorted({c for _, c in steps})
rows = [
    "| concurrency | dlrm_onnx samples/s | p50 / p99 ms | dlrm_small samples/s | p50 / p99 ms | ratio |",
    "|---:|---:|---:|---:|---:|---:|",
]
for c in levels:
    big, small = steps[("dlrm_onnx", c)], steps[("dlrm_small", c)]
    rows.append(
        f"| {c} | {big['samples_per_s']:,.0f} | {big['p50_ms']:.1f} / {big['p99_ms']:.1f} | "
        f"{small['samples_per_s']:,.0f} | {small['p50_ms']:.1f} / {small['p99_ms']:.1f} | "
        f"{big['samples_per_s'] / small['samples_per_s']:.2f} |"
    )
best = {m: max(s["samples_per_s"] for (model, _), s in steps.items() if model == m) for m in ("dlrm_onnx", "dlrm_small")}
errors = sum(s["errors"] for s in report["steps"])
ratio = best["dlrm_onnx"] / best["dlrm_small"]
store, hot, model = made["row_store"], made["hot_rows"], made["model"]
exact = made["exactness"]
lines = [
    "# Benchmark 1: a DLRM larger than memory, served hot/cold",
    "",
    f"- command: `{command}`; date {report['started']}",
    f"- model: untrained DLRM, D {model['embedding_dim']}, bottom {model['bottom_mlp']}, top {model['top_mlp']}, "
    f"{sum(model['table_sizes']):,} embedding rows; row store {store['spec']['dtype']}, "
    f"{store['bytes'] / 1e9:.1f} GB ({'written' if store['written'] else 'reused'})",
    f"- hot rows: {hot['rows']:,} ({hot['bytes'] / 2**30:.2f} GiB of FP32 rows in the dense model; budget {budget}); "
    f"expected hit rate (profile) {hot['expected_hit_rate']:.2%}",
    f"- **hot-hit rate on the held-out traffic: {hot['heldout_hit_rate']:.2%}** of its lookups "
    f"(HotSet.hit_rate over every row of {hot['heldout_data']})",
    f"- **throughput ratio dlrm_onnx / dlrm_small: {ratio:.2f}** (best of each over concurrency 1, 2, 4; "
    f"target >= 0.8) at batch 1024, gRPC; {errors} failed requests",
    f"- **server RSS after the sweep** (tritonserver + python stubs, both models loaded): "
    f"{report['settings'][SERVER_RSS] / 1024:.2f} GiB, of which "
    f"{report['settings'][SERVER_ANON] / 1024:.2f} GiB anonymous (the rest: the row store's and the "
    "libraries' mapped pages, and shared memory)",
    f"- exactness of dlrm_onnx vs the store reference (hot, cold, mixed, out-of-range ids): max abs diff "
    f"{exact['max_abs_diff']:.2g} (tolerance {exact['tolerance']:g})",
    f"- synthetic-hot-cold: wall {wall}, peak RSS {peak / 2**20:.1f} GiB; steps (s): "
    + ", ".join(f"{k} {v:.0f}" for k, v in made["seconds"].items()),
    "- synthetic-hot-cold's peak memory by kind (sampled per step, bundle.memory.PeakMemory): "
    + ", ".join(
        f"{k} {m['anon_bytes'] / 2**30:.1f} GiB anonymous + {m['file_bytes'] / 2**30:.1f} GiB mapped files"
        for k, m in made["memory"]["per_step"].items()
        if "anon_bytes" in m and k in ("dense_model", "check")
    )
    + ". The peak RSS above counts both: the mapped files are the row store's pages (page cache, "
    "reclaimable); the anonymous part is what the machine must hold",
    "- payload: the load test sends a pool of the held-out file's rows (at most 32,768, cycled), so after the "
    "first pass their cold rows are in the page cache: the cold tier measured is memory-mapped pages mostly "
    "in memory, not disk reads",
    "",
    *rows,
    "",
    "Files: random_dlrm.log, random_dlrm_report.json, random_dlrm_time.txt, model_files.txt, sweep/.",
    "",
]
(out / "summary.md").write_text("\n".join(lines))
print("\n".join(lines))
EOF
