#!/usr/bin/env bash
# The in-graph export of a DLRM with more than 4 GB of FP32 tables: its peak memory against the
# tables' bytes, and its time.
#
# The checkpoint (`python -m models random-dlrm`: config.json + model.pt as `models train dlrm`
# writes them, untrained) has the reference preset's layers (D 128, bottom 512-256-128, top
# 1024-1024-512-256-1) and 26 tables of ROWS rows (330,000: 8.58M rows, 4.39 GB of FP32 tables).
# `python -m export dlrm` loads it memory-mapped and writes everything into the graphs (no hot/cold
# split), once per profile: cpu (dlrm_onnx, dlrm_onnx_fp16, dlrm_onnx_int8) and gpu (dlrm_onnx,
# dlrm_onnx_fp16, dlrm_torch). Each model's export_report.json holds its own peak memory (sampled by
# a child process, split into anonymous memory and mapped files) and seconds; /usr/bin/time gives the
# whole run's.
#
#   bash benchmarks/in_graph_export/run.sh        # from the repository root, after `make setup`
#
# Disk: about 9 GB for the checkpoint while it is written, then 4.4 GB, and up to 11 GB per
# repository; WORK is removed at the end unless KEEP=1. About 10 minutes on 2 cores.
set -euo pipefail
cd "$(dirname "$0")/../.."
export PYTHONPATH="$PWD" PATH="$PWD/.venv/bin:$PATH"

WORK=${WORK:-artifacts/in-graph-export}
OUT=${OUT:-benchmarks/in_graph_export}
ROWS=${ROWS:-330000}
COMMAND="${COMMAND_LINE:-bash benchmarks/in_graph_export/run.sh}"
MACHINE=$(python -m bundle.records)  # CPU, cores, memory and CPU flags, as the load-test reports name them
mkdir -p "$WORK" "$OUT"

[[ -f $WORK/dlrm/model.pt ]] || python -m models random-dlrm --preset reference --table-size "$ROWS" --out "$WORK/dlrm"
[[ -f $WORK/check.tsv ]] || python -m criteo synth --rows 20000 --seed 2 --out "$WORK/check.tsv"

for profile in cpu gpu; do
  rm -rf "$WORK/repo-$profile"
  /usr/bin/time -v -o "$OUT/$profile-time.txt" \
    python -m export dlrm --checkpoint "$WORK/dlrm" --repository "$WORK/repo-$profile" --profile "$profile" \
      --check-data "$WORK/check.tsv" --check-rows 4096 2>&1 | tee "$OUT/$profile-export.log"
  python - "$WORK/repo-$profile" "$OUT/$profile-reports.json" <<'PY'
import json
import sys
from pathlib import Path

repository, out = Path(sys.argv[1]), Path(sys.argv[2])
reports = {p.parent.name: json.loads(p.read_text()) for p in sorted(repository.glob("*/export_report.json"))}
out.write_text(json.dumps(reports, indent=2) + "\n")
PY
  rm -rf "$WORK/repo-$profile"
done

python - "$WORK/dlrm/config.json" "$OUT" "$COMMAND" "$MACHINE" <<'PY'
import json
import re
import sys
from datetime import datetime, timezone
from pathlib import Path

from bundle.snippets import section_end, section_start

config_path, out, command, machine = Path(sys.argv[1]), Path(sys.argv[2]), sys.argv[3], sys.argv[4]
model = json.loads(config_path.read_text())["model"]
sizes, dim = model["table_sizes"], model["embedding_dim"]
tables = sum(sizes) * dim * 4
GB = 1e9
lines = [
    "# In-graph export of a DLRM with more than 4 GB of tables: peak memory and time",
    "",
    section_start("results"),  # what the documentation includes
    f"- command: `{command}`; date {datetime.now(timezone.utc).strftime('%Y-%m-%dT%H:%M:%SZ')}",
    f"- machine: {machine}",
    f"- checkpoint: untrained DLRM (`python -m models random-dlrm --preset reference`), 26 tables of "
    f"{sizes[0]:,} rows x D {dim}: **{tables / GB:.2f} GB of FP32 tables**, "
    "loaded memory-mapped (their pages count as mapped files, not anonymous memory)",
    "- peak memory: anonymous resident bytes of the export's process (a child process samples "
    "/proc every 20 ms), what the machine must hold; mapped files are page cache. Per model: "
    "`peak_memory` of its export_report.json (written and checked); whole run: the figure "
    "`python -m export` prints (to 0.1 GiB) and /usr/bin/time's wall clock",
    "",
    section_start("runs"),
    "| profile | model | seconds | peak anonymous GB | / table bytes | peak mapped files GB |",
    "|---|---|---:|---:|---:|---:|",
]
notes = []
for profile in ("cpu", "gpu"):
    reports = json.loads((out / f"{profile}-reports.json").read_text())
    for name, report in reports.items():
        peak = report.get("peak_memory", {})
        if "anon_bytes" not in peak:
            continue
        lines.append(
            f"| {profile} | {name} | {report['seconds']:.0f} | {peak['anon_bytes'] / GB:.2f} | "
            f"{peak['anon_bytes'] / tables:.2f}x | {peak['file_bytes'] / GB:.2f} |"
        )
    log = (out / f"{profile}-export.log").read_text()
    timing = (out / f"{profile}-time.txt").read_text()
    wall = re.search(r"Elapsed \(wall clock\) time.*: (.*)", timing).group(1)
    found = re.search(r"peak memory: ([\d.]+) (GiB|MiB) anonymous", log)
    whole = float(found[1]) * (2**30 if found[2] == "GiB" else 2**20)
    lines.append(f"| {profile} | **whole run** | {wall} | {whole / GB:.2f} | **{whole / tables:.2f}x** | |")
    skipped = [line.split(": ", 1)[1] for line in log.splitlines() if "not written" in line]
    notes += [f"- {profile}: {line}" for line in skipped]
lines += [section_end("runs"), ""]
if notes:
    lines += ["Models the export attempted and left out:", "", *notes, ""]
lines.append("Files: cpu-/gpu-export.log, -time.txt (/usr/bin/time -v), -reports.json (each model's export_report.json).")
lines.append(section_end("results"))
(out / "summary.md").write_text("\n".join(lines) + "\n")
print("\n".join(lines))
PY
[[ -n ${KEEP:-} ]] || rm -rf "$WORK"
