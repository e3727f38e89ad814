"""The GPU benchmark's pieces that need no GPU: spreading load over client processes, the
accuracy gate read from export reports, the verdicts, the report files, the kernel listing,
GPU against CPU from two results."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from bundle.errors import ConfigError
from lab.devices import compare_devices, read_result, write_devices_report
from lab.gpu import DLRM_TARGET, SERVED_TARGET, GpuOptions, best_served, gate, verdicts, write_gpu_report
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
                "p50_ms": 1.0 if b == 1 else 3.0,
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


def test_the_fastest_model_of_any_family_is_judged_against_the_served_target_with_its_p99() -> None:
    results = [
        _result("dlrm_onnx", "FP32", {1: {1: 900.0}, 8192: {16: 4e6}}, {1: 1e3, 8192: 8e6}),
        _result("wide_deep_onnx_fp16", "FP16", {8192: {16: 16e6}}, {8192: 20e6}),
        _result("dlrm_onnx", "FP32", {8192: {16: 4e6}}, {}),  # an ensemble: served only
    ]
    results[2]["model"] = "dlrm_hot_cold"
    found = verdicts(results, 8192)
    fastest = found["fastest_passing_gate"]
    assert fastest == {"model": "wide_deep_onnx_fp16", "samples_per_s": 16e6, "p99_ms": 5.0,
                       "target": SERVED_TARGET, "met": True}  # fmt: skip
    assert found["batch1_p50_ms"] == {"dlrm_onnx": 1.0}
    assert "dlrm_hot_cold" not in found["served_over_in_process"]


def _document(results: list[dict], name: str | None) -> dict:
    return {
        "command": f"python -m lab gpu ({name or 'cpu'})",
        "started": "2026-11-22T00:00:00Z",
        "machine": {"cpu": "x", "cores": 16, "memory_gib": 128},
        "gpu": {"name": name},
        "results": results,
    }


def test_gpu_against_cpu_per_family(tmp_path: Path) -> None:
    gpu = _document(
        [
            _result("dlrm_onnx", "FP32", {1: {1: 900.0}, 8192: {16: 8e6}}, {}),
            _result("dlrm_onnx_fp16", "FP16", {1: {1: 800.0}, 8192: {16: 12e6}}, {}),
            _result("wide_deep_onnx_fp16", "FP16", {8192: {16: 10e6}}, {}),
        ],
        "NVIDIA H100 80GB HBM3",
    )
    gpu["results"][1]["gate"]["passes"] = False  # the fastest DLRM fails its gate: not the answer
    gpu["results"][0]["served"][0]["p50_ms"] = 0.5
    cpu = _document(
        [
            _result("dlrm_onnx_int8", "INT8", {1: {1: 500.0}, 1024: {4: 4e5, 16: 5e5}}, {}),
            _result("wide_deep_onnx_int8", "INT8", {1024: {16: 2.5e5}}, {}),
        ],
        None,
    )
    (tmp_path / "cpu").mkdir()
    (tmp_path / "cpu" / "result.json").write_text(json.dumps(cpu))
    found = compare_devices(gpu, read_result(tmp_path / "cpu"), "python -m lab gpu-vs-cpu")
    dlrm = found["families"]["dlrm"]
    assert dlrm["gpu"]["latency"]["model"] == "dlrm_onnx"
    assert dlrm["latency_cpu_over_gpu"] == pytest.approx(2.0)
    assert dlrm["gpu"]["throughput"]["model"] == "dlrm_onnx"
    assert dlrm["throughput_gpu_over_cpu"] == pytest.approx(16.0)
    wide_deep = found["families"]["wide_deep"]
    assert wide_deep["latency_cpu_over_gpu"] is None  # no 1x1 step on either side
    assert wide_deep["throughput_gpu_over_cpu"] == pytest.approx(40.0)
    paths = write_devices_report(found, tmp_path)
    text = paths["markdown"].read_text()
    assert "NVIDIA H100 80GB HBM3" in text and "**16.0x**" in text and "- (no 1x1 step)" in text
    with pytest.raises(ConfigError, match="no lab gpu result"):
        read_result(tmp_path / "absent")
