#!/usr/bin/env bash
# A Criteo Kaggle-size DLRM brought as a facebookresearch/dlrm checkpoint: export it and serve it.
#
# The model is facebookresearch/dlrm's Kaggle configuration (dlrm_s_pytorch.py
# --arch-sparse-feature-size=16 --arch-mlp-bot=13-512-256-64-16 --arch-mlp-top=512-256-1
# --arch-interaction-op=dot on the Kaggle data set's 26 table sizes): 33.8M embedding rows,
# 2.2 GB of FP32 tables. Its weights are random (training it needs the Kaggle data set, which
# is not here); export, parity checks and serving do not depend on their values. The checkpoint
# is written the way `dlrm_s_pytorch.py --save-model` writes one: a torch.save dict whose
# "state_dict" holds emb_l.<k>.weight, bot_l.<n>.*, top_l.<n>.*.
#
# Writes benchmarks/byom/kaggle/: export.log (the export's table), export_time.txt (GNU time -v
# of the export: wall time, peak RSS), export_report.json (dlrm_onnx's, with the detected format),
# sweep/ (python -m loadtest sweep: samples/s at batch 1024, server RSS, PNG curves), summary.md.
set -euo pipefail
cd "$(dirname "$0")/../.."
export PYTHONPATH="$PWD" PATH="$PWD/.venv/bin:$PATH"
WORK=${WORK:-artifacts/byom-kaggle}
OUT=benchmarks/byom/kaggle
DURATION=${DURATION:-20}
mkdir -p "$WORK" "$OUT"

if [ ! -f "$WORK/kaggle.pt" ]; then
  python - "$WORK/kaggle.pt" <<'EOF'
import sys

import torch

from criteo.tables import CRITEO_KAGGLE

# Shapes as DLRM_Net builds them: EmbeddingBag tables uniform(-sqrt(1/n), sqrt(1/n)),
# Linear layers at the even indices of bot_l/top_l (ReLU, and the final Sigmoid, between).
torch.manual_seed(0)
dim, bottom, top = 16, (13, 512, 256, 64, 16), (512, 256, 1)
state = {}
for k, rows in enumerate(CRITEO_KAGGLE):
    bound = (1.0 / rows) ** 0.5
    state[f"emb_l.{k}.weight"] = torch.empty(rows, dim).uniform_(-bound, bound)
vectors = len(CRITEO_KAGGLE) + 1
widths = {"bot_l": bottom, "top_l": (dim + vectors * (vectors - 1) // 2, *top)}
for name, layers in widths.items():
    for i, (fan_in, fan_out) in enumerate(zip(layers[:-1], layers[1:])):
        state[f"{name}.{2 * i}.weight"] = torch.randn(fan_out, fan_in) * (2.0 / (fan_in + fan_out)) ** 0.5
        state[f"{name}.{2 * i}.bias"] = torch.randn(fan_out) * (1.0 / fan_out) ** 0.5
torch.save({"epoch": 0, "nepochs": 1, "nbatches": 0, "iter": 0, "state_dict": state,
            "train_acc": 0.0, "train_loss": 0.0, "test_acc": 0.0}, sys.argv[1])
print(f"wrote {sys.argv[1]}: {sum(v.numel() for v in state.values()) * 4 / 1e9:.2f} GB of FP32 weights")
EOF
fi

python -m criteo synth --rows 8192 --out "$WORK/check.tsv" --seed 5 --vocabulary criteo-kaggle

rm -rf "$WORK/repo"
/usr/bin/time -v -o "$OUT/export_time.txt" \
  python -m export dlrm --checkpoint "$WORK/kaggle.pt" --repository "$WORK/repo" \
    --check-data "$WORK/check.tsv" --check-rows 4096 --no-int8 2>&1 | tee "$OUT/export.log"
cp "$WORK/repo/dlrm_onnx/export_report.json" "$OUT/export_report.json"
cp "$WORK/repo/dlrm_onnx_fp16/export_report.json" "$OUT/export_report_fp16.json"
du -b "$WORK"/repo/*/1/* > "$OUT/model_files.txt"

python -m loadtest sweep --repository "$WORK/repo" --model dlrm_onnx --model dlrm_onnx_fp16 --protocol grpc \
  --batch-size 1024 --concurrency 1,2,4 --duration "$DURATION" --data "$WORK/check.tsv" \
  --out "$OUT/sweep" --raw "$WORK/sweep-raw" \
  --title "Criteo Kaggle-size DLRM (facebookresearch/dlrm checkpoint), served locally"

python - "$OUT" <<'EOF'
import json
import re
import sys
from pathlib import Path

from bundle.snippets import section_end, section_start
from loadtest.sweeps.runs import SERVER_RSS

out = Path(sys.argv[1])
timing = (out / "export_time.txt").read_text()
wall = re.search(r"Elapsed \(wall clock\) time.*: (.*)", timing).group(1)
peak = int(re.search(r"Maximum resident set size \(kbytes\): (\d+)", timing).group(1))
report = json.loads((out / "sweep" / "report.json").read_text())
rows = ["| model | concurrency | samples/s | p50 ms | p99 ms |", "|---|---:|---:|---:|---:|"]
for step in report["steps"]:
    rows.append(
        f"| {step['model']} | {step['concurrency']} | {step['samples_per_s']:,.0f} | "
        f"{step['p50_ms']:.1f} | {step['p99_ms']:.1f} |"
    )
export = json.loads((out / "export_report.json").read_text())
files = (out / "model_files.txt").read_text().split("\n")
lines = [
    "# Criteo Kaggle-size DLRM, brought as a facebookresearch/dlrm checkpoint",
    "",
    section_start("results"),  # what the documentation includes
    f"- command: `bash benchmarks/byom/run.sh`; date {report['started']}",
    f"- detected format: {export['source']['format']}; table sizes from: {export['source'].get('table_sizes_from')}",
    f"- export (FP32 + FP16, checks included): wall {wall}, peak RSS {peak / 2**20:.1f} GiB",
    f"- FP32 parity vs the checkpoint's own computation: max abs diff {export['parity']['max_abs_diff']:.2g} "
    f"on {export['parity']['rows']} rows",
    f"- server RSS after the sweep (tritonserver + stubs, both models loaded): "
    f"{report['settings'][SERVER_RSS] / 1024:.2f} GiB",
    "- model files: " + "; ".join(f.replace("\t", " bytes: ") for f in files if f),
    "",
    *rows,
    section_end("results"),
    "",
]
(out / "summary.md").write_text("\n".join(lines))
print("\n".join(lines))
EOF
