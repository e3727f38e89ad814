"""``python -m lab gpu`` end to end through the real local tritonserver (on the CPU here):
served steps from several client processes over system shared memory, the in-process figures,
the report files; and one clear error for a batch larger than the models take."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]


def _loadtest(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "lab", "gpu", *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
    )


def test_gpu_bench_measures_every_step(exported_repository: Path, labeled_file: Path, tmp_path: Path) -> None:
    out = tmp_path / "out"
    run = _loadtest(
        "--repository", str(exported_repository), "--data", str(labeled_file), "--out", str(out),
        "--model", "dlrm_onnx", "--model", "dlrm_onnx_fp16", "--step", "64x1", "--step", "256x4",
        "--seconds", "0.3", "--repeats", "2", "--processes", "2", "--profile-calls", "3",
    )  # fmt: skip
    assert run.returncode == 0, run.stderr[-2000:]
    result = json.loads((out / "result.json").read_text())
    assert [r["model"] for r in result["results"]] == ["dlrm_onnx", "dlrm_onnx_fp16"]
    for model in result["results"]:
        assert [(s["batch_size"], s["concurrency"]) for s in model["served"]] == [(64, 1), (256, 4)]
        for step in model["served"]:
            assert step["samples_per_s"] > 0 and step["errors"] == 0
            assert len(step["repeats"]) == 2
            assert step["server"]["compute_ms"] > 0
        assert set(model["in_process"]) == {"64", "256"}
        assert model["in_process"]["256"]["provider"] == "CPUExecutionProvider"
        assert model["profile"]["device_resident"]["resident_ms"] > 0
        assert model["gate"]["passes"] is True
    assert "dlrm_onnx_fp16" in result["verdicts"]["fp16_over_fp32"]
    assert (out / "result.md").is_file() and (out / "result.png").is_file()
    assert not (out / "partial.json").exists()


def test_a_batch_over_max_batch_size_is_one_error(exported_repository: Path, tmp_path: Path) -> None:
    run = _loadtest("--repository", str(exported_repository), "--out", str(tmp_path), "--model", "dlrm_onnx",
                    "--step", "8192x1")  # fmt: skip
    assert run.returncode != 0
    lines = [line for line in run.stderr.splitlines() if line.strip()]
    assert lines[-1].startswith("error:") and "max_batch_size" in lines[-1], run.stderr[-1000:]
