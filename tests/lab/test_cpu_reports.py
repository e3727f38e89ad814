"""The CPU benchmarks' result files, written from known measurements (no server, no model)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from bundle.records import RunRecord
from lab.precision import write_precision
from lab.serving_defaults import CURRENT_DEFAULT, write_serving


def _record() -> dict[str, Any]:
    return RunRecord.begin("python -m lab precision --repository r").finish().to_json()


def _row(
    precision: str, model: str, served: float, in_process: float, gate: dict[str, Any]
) -> dict[str, Any]:
    return {
        "family": "dlrm",
        "precision": precision,
        "model": model,
        "flops_per_sample": 4.92e6,
        "ceiling_samples_per_s": 34_640.0,
        "served": {"samples_per_s": served, "concurrency": 4, "repeats": [served], "p50_ms": 40.0},
        "served_fraction_of_ceiling": served / 34_640.0,
        "in_process": {"samples_per_s": in_process},
        "in_process_fraction_of_ceiling": in_process / 34_640.0,
        "served_over_in_process": served / in_process,
        "gate": gate,
        "serving": "1 instance(s), intra-op threads default, queue delay 100 us, preferred none",
    }


def test_the_precision_report_names_the_fastest_variant_that_passes_the_gate(tmp_path: Path) -> None:
    rows = [
        _row("FP32", "dlrm_onnx", 22_475.0, 21_069.0, {}),
        _row("INT8 static", "dlrm_onnx_int8", 48_239.0, 45_463.0,
             {"auc_delta": -1.1e-4, "auc_tolerance": 1e-3, "max_abs_diff": 0.051,
              "max_abs_diff_between_batch_sizes": 0.0}),
        _row("INT8 dynamic", "dlrm_onnx_int8_dynamic", 52_157.0, 52_758.0,
             {"auc_delta": -3.1e-4, "auc_tolerance": 1e-3, "max_abs_diff": 0.051,
              "max_abs_diff_between_batch_sizes": 0.054}),
        _row("FP16", "dlrm_onnx_fp16", 60_000.0, 20_707.0, {"auc_delta": 5e-3, "auc_tolerance": 1e-3}),
    ]  # fmt: skip
    ceiling = {"size": 4096, "what": "numpy sgemm", "gflops": 170.3, "repeats": [170.3], "note": ""}
    result = {
        **_record(),
        "options": {"batch_size": 1024, "concurrency": [1, 2, 4], "seconds": 2.0},
        "ceiling_gflops": 170.3,
        "ceiling_start": ceiling,
        "ceiling_end": ceiling,
        "probes": [
            {"size": 2048, "what": "onnxruntime MatMulInteger u8s8", "gflops": 1000.0, "note": ""},
            {"size": 0, "what": "onnxruntime MatMul bfloat16", "gflops": None, "note": "not available"},
        ],
        "results": rows,
    }
    paths = write_precision(result, tmp_path)
    text = paths["markdown"].read_text()

    assert "- **Command**: `python -m lab precision --repository r`" in text
    # x INT8 GEMM: 48,239 samples/s x 4.92 MFLOP / 1000 GOP/s = 0.24.
    assert "| INT8 static (`dlrm_onnx_int8`) | 48,239 | **1.39** | 0.24 | 4 | 45,463 |" in text
    # FP16 is the fastest here but misses the AUC gate; dynamic INT8 passes but moves rows with the batch.
    assert "fastest served variant that passes the gate: INT8 dynamic (`dlrm_onnx_int8_dynamic`)" in text
    assert "same answer in any batch: INT8 static (`dlrm_onnx_int8`), 48,239 samples/s" in text
    assert json.loads(paths["json"].read_text())["results"][0]["model"] == "dlrm_onnx"


def test_the_serving_report_ranks_candidates_against_the_current_default(tmp_path: Path) -> None:
    def steps(rate: float) -> dict[str, dict[str, float]]:
        return {
            "B=1024 c=1": {"samples_per_s": rate, "p50_ms": 40.0, "p99_ms": 50.0},
            "B=1 c=1": {"samples_per_s": rate / 20, "p50_ms": 1.0, "p99_ms": 2.0},
        }

    result = {
        **_record(),
        "options": {"seconds": 3.0, "rounds": 2},
        "candidates": {},
        "results": {
            "dlrm_onnx_int8": {CURRENT_DEFAULT: steps(40_000.0), "2 inst x 1 thread": steps(30_000.0)}
        },
        "graph_levels_in_process": {"dlrm_onnx_int8": dict.fromkeys(
            ("ORT_ENABLE_BASIC", "ORT_ENABLE_EXTENDED", "ORT_ENABLE_ALL"), 45_000.0)},
    }  # fmt: skip
    text = write_serving(result, tmp_path, "defaults")["markdown"].read_text()

    assert f"| {CURRENT_DEFAULT} | 40,000 (50.0) | 2,000 (2.0) |" in text
    ranking = text[text.index("## Ranking") :]
    assert ranking.index(CURRENT_DEFAULT) < ranking.index("2 inst x 1 thread")
    assert "| 2 inst x 1 thread | 0.75 | 0.75 | 0.75 |" in ranking
    assert (tmp_path / "defaults.json").is_file()


def test_the_serving_report_gives_each_candidates_concurrency_scaling(tmp_path: Path) -> None:
    def steps(c1: float, c2: float, c4: float) -> dict[str, dict[str, float]]:
        return {
            "B=1024 c=1": {"samples_per_s": c1, "p50_ms": 16.0, "p99_ms": 20.0},
            "B=1024 c=2": {"samples_per_s": c2, "p50_ms": 89.0, "p99_ms": 95.0},
            "B=1024 c=4": {"samples_per_s": c4, "p50_ms": 120.0, "p99_ms": 130.0},
        }

    result = {
        **_record(),
        "options": {"seconds": 3.0, "rounds": 3},
        "candidates": {},
        "results": {
            "dlrm_onnx_int8": {
                "spin on": steps(58_000, 23_200, 31_900),
                "spin off": steps(50_000, 50_000, 55_000),
            }
        },
    }
    text = write_serving(result, tmp_path, "concurrency")["markdown"].read_text()

    scaling = text[text.index("## dlrm_onnx_int8: concurrency scaling") :]
    assert "| candidate | B=1024 c=2 / c=1 | B=1024 c=4 / c=1 |" in scaling
    assert "| spin on | 0.40 (p50 16 -> 89 ms) | 0.55 (p50 16 -> 120 ms) |" in scaling
    assert "| spin off | 1.00 (p50 16 -> 89 ms) | 1.10 (p50 16 -> 120 ms) |" in scaling


def _precision_result(cpu_flags: dict[str, bool] | None, bf16_probe: dict[str, Any]) -> dict[str, Any]:
    record = _record()
    if cpu_flags is None:
        record["machine"].pop("cpu_flags", None)
    else:
        record["machine"]["cpu_flags"] = cpu_flags
    ceiling = {"size": 4096, "what": "numpy sgemm", "gflops": 170.3, "repeats": [170.3], "note": ""}
    return {
        **record,
        "options": {"batch_size": 1024, "concurrency": [1, 2, 4], "seconds": 2.0},
        "ceiling_gflops": 170.3,
        "ceiling_start": ceiling,
        "ceiling_end": ceiling,
        "probes": [bf16_probe],
        "results": [_row("FP32", "dlrm_onnx", 22_475.0, 21_069.0, {})],
    }


NO_BF16_KERNEL = {
    "size": 0,
    "what": "onnxruntime MatMul bfloat16",
    "gflops": None,
    "note": "not available: [ONNXRuntimeError] : 9 : NOT_IMPLEMENTED : Could not find an implementation",
}


def test_the_precision_report_names_only_the_bf16_features_its_own_record_shows(tmp_path: Path) -> None:
    def bf16_line(flags: dict[str, bool] | None) -> str:
        text = write_precision(_precision_result(flags, NO_BF16_KERNEL), tmp_path)["markdown"].read_text()
        return next(line for line in text.splitlines() if line.startswith("- BF16"))

    amd = {"avx512f": True, "avx512_bf16": True, "amx_int8": False, "amx_bf16": False}
    xeon = {"avx512f": True, "avx512_bf16": True, "amx_int8": True, "amx_bf16": True}
    avx2 = {"avx2": True, "avx512f": False, "avx512_bf16": False, "amx_bf16": False}

    assert "found no kernel" in bf16_line(amd)
    assert bf16_line(amd).endswith("The run's CPU has AVX512-BF16, not AMX-BF16.")
    assert bf16_line(xeon).endswith("The run's CPU has AVX512-BF16 and AMX-BF16.")
    assert bf16_line(avx2).endswith("The run's CPU has neither AVX512-BF16 nor AMX-BF16.")
    assert bf16_line(None).endswith("The run's record names no CPU flags.")


def test_the_precision_report_says_a_bf16_probe_that_ran(tmp_path: Path) -> None:
    probe = {"size": 2048, "what": "onnxruntime MatMul bfloat16", "gflops": 900.0, "note": ""}
    text = write_precision(_precision_result(None, probe), tmp_path)["markdown"].read_text()

    assert "the bundle exports no BF16 graph (the bfloat16 MatMul probe above ran at 900 GOP/s)" in text
    assert "found no kernel" not in text
