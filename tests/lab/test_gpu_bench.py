"""The GPU benchmark's pieces that need no GPU: spreading load over client processes, the
accuracy gate read from export reports, the verdicts, the report files, the kernel listing."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from bundle.errors import ConfigError
from lab.gpu import DLRM_TARGET, GpuOptions, best_served, gate, verdicts, write_gpu_report
from lab.kernels import KernelTime, describe
from loadtest.engine.served import spread


def test_spread_divides_concurrency_over_processes() -> None:
    assert spread(1, 8) == (1, 1)
    assert spread(4, 8) == (4, 1)
    assert spread(16, 8) == (8, 2)
    assert spread(12, 8) == (6, 2)
    assert spread(7, 4) == (1, 7)
    with pytest.raises(ConfigError):
        spread(0, 8)


def _report(repository: Path, name: str, **fields: Any) -> None:
    (repository / name).mkdir(parents=True)
    (repository / name / "export_report.json").write_text(json.dumps(fields))


def test_gate_reads_the_export_report(tmp_path: Path) -> None:
    _report(tmp_path, "dlrm_onnx", checked_against="framework", parity={"auc_delta": 0.0, "rows": 4160})
    _report(tmp_path, "dlrm_onnx_fp16", parity={"auc_delta": 2e-3}, auc_tolerance=1e-3)
    assert gate(tmp_path, "dlrm_onnx")["passes"] is True  # FP32: the default gate
    assert gate(tmp_path, "dlrm_onnx_fp16")["passes"] is False
    assert gate(tmp_path, "absent")["passes"] is None


def _result(model: str, precision: str, served: dict[int, dict[int, float]], local: dict[int, float]) -> dict:
    return {
        "model": model,
        "family": "wide_deep" if model.startswith("wide_deep") else "dlrm",
        "file": "model.onnx",
        "precision": precision,
        "serving": {"instances": 1},
        "gate": {"auc_delta": 1e-6, "passes": True},
        "in_process": {str(b): {"samples_per_s": v} for b, v in local.items()},
        "served": [
            {
                "batch_size": b,
                "concurrency": c,
                "samples_per_s": v,
                "p99_ms": 5.0,
                "server": {"queue_ms": 1.0, "compute_ms": 2.0, "rows_per_execution": float(b)},
            }
            for b, by_c in served.items()
            for c, v in by_c.items()
        ],
        "profile": {},
    }


def test_verdicts_answer_the_issue_from_the_results() -> None:
    results = [
        _result("dlrm_onnx", "FP32", {8192: {1: 3e6, 16: 4e6}}, {8192: 8e6}),
        _result("dlrm_onnx_fp16", "FP16", {8192: {1: 3e6, 16: 6e6}}, {8192: 9e6}),
        _result("dlrm_torch_x4", "FP16", {8192: {4: 10.5e6, 16: 11e6}}, {8192: 8e6}),
    ]
    assert best_served(results[0], 8192)["concurrency"] == 16
    found = verdicts(results, 8192)
    assert found["served_over_in_process"]["dlrm_onnx"] == pytest.approx(0.5)
    assert found["ratio_met"] == {"dlrm_onnx": False, "dlrm_onnx_fp16": False, "dlrm_torch_x4": True}
    fastest = found["fastest_dlrm_passing_gate"]
    assert fastest["model"] == "dlrm_torch_x4" and fastest["met"] and fastest["target"] == DLRM_TARGET
    assert found["fp16_over_fp32"]["dlrm_onnx_fp16"]["served"] == pytest.approx(1.5)
    results[2]["gate"]["passes"] = False  # a variant failing the AUC gate is never the answer
    assert verdicts(results, 8192)["fastest_dlrm_passing_gate"]["model"] == "dlrm_onnx_fp16"


def test_report_files(tmp_path: Path) -> None:
    results = [_result("dlrm_onnx", "FP32", {1024: {1: 1e6}, 8192: {1: 3e6}}, {1024: 2e6, 8192: 8e6})]
    options = GpuOptions(repository=tmp_path, out=tmp_path, steps=((1024, 1), (8192, 1)))
    document = {
        "command": "python -m lab gpu",
        "started": "2026-11-22T00:00:00Z",
        "finished": "2026-11-22T00:01:00Z",
        "machine": {"cpu": "x", "cores": 16, "memory_gib": 128},
        "gpu": {"name": "NVIDIA H100 80GB HBM3"},
        "options": {**options.__dict__, "repository": str(tmp_path), "out": str(tmp_path), "log_file": "x"},
        "results": results,
        "verdicts": verdicts(results, 8192),
    }
    paths = write_gpu_report(document, tmp_path)
    text = paths["markdown"].read_text()
    assert "NVIDIA H100 80GB HBM3" in text and "`dlrm_onnx`" in text and "0.38" in text
    assert paths["png"].stat().st_size > 0
    assert json.loads(paths["json"].read_text())["verdicts"]["batch_size"] == 8192


def test_options_refuse_bad_steps(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="BATCHxCONCURRENCY"):
        GpuOptions(repository=tmp_path, out=tmp_path, steps=((0, 1),))
    with pytest.raises(ConfigError, match="shared memory"):
        GpuOptions(repository=tmp_path, out=tmp_path, shared_memory="cuda")


def test_kernel_listing() -> None:
    lines = describe("m", [KernelTime("gemm", 0.3, 2), KernelTime("cast", 0.1, 4)])
    assert lines[0] == "== m: 0.400 ms of kernels per call"
    assert "75.0%" in lines[1] and "x2" in lines[1] and "gemm" in lines[1]
