"""INT8 variants: ONNX Runtime quantization of the MLP layers of a tiny DLRM (seconds)."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import numpy as np
import onnx
import pytest

from bundle.errors import ConfigError, ExportError
from bundle.repository import ServingConfig, read_config
from criteo.synth import SynthConfig, write_tsv
from criteo.tsv import read_batch
from export.graphs.parity import run_onnx
from export.graphs.quantize import (
    QuantizeOptions,
    gemm_as_matmul,
    int8_nodes,
    quantize_int8,
    quantized_op_counts,
)
from export.importers.onnx_dlrm import DLRMExporter
from export.options import ExportOptions
from export.pipeline import calibration_rows, export_family
from loadtest.roofline import count_flops
from models.config import DLRMConfig, TrainConfig
from models.train_dlrm import train_dlrm

TINY = DLRMConfig.preset("tiny")


@pytest.fixture(scope="module")
def data(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("data") / "rows.tsv"
    write_tsv(SynthConfig(rows=4000, seed=5, max_vocabulary=2000), path)
    return path


@pytest.fixture(scope="module")
def exporter(tmp_path_factory: pytest.TempPathFactory, data: Path) -> DLRMExporter:
    out = tmp_path_factory.mktemp("dlrm")
    train_dlrm(data, out, TINY, TrainConfig(batch_size=256, learning_rate=3e-3))
    return DLRMExporter(out)


@pytest.fixture(scope="module")
def fp32_file(tmp_path_factory: pytest.TempPathFactory, exporter: DLRMExporter) -> Path:
    path = tmp_path_factory.mktemp("onnx") / "model.onnx"
    exporter.to_onnx(path, 17)
    return path


def test_only_mlp_layers_are_chosen(exporter: DLRMExporter, fp32_file: Path) -> None:
    model = onnx.load(str(fp32_file))
    quantized, kept = int8_nodes(model, exporter.fp32_nodes(model))
    # tiny: bottom 16-8, top 32-16-1 -> 4 layers; the 1-wide output layer and the interaction stay FP32.
    assert quantized == [
        "/bottom_mlp/bottom_mlp.0/Gemm",
        "/bottom_mlp/bottom_mlp.2/Gemm",
        "/top_mlp/top_mlp.0/Gemm",
        "/top_mlp/top_mlp.2/Gemm",
    ]
    assert kept == ["/interaction/MatMul", "/top_mlp/top_mlp.4/Gemm"]


def test_gemm_rewritten_as_matmul_computes_the_same(fp32_file: Path, data: Path, tmp_path: Path) -> None:
    model = onnx.load(str(fp32_file))
    gemms = [n.name for n in model.graph.node if n.op_type == "Gemm"]
    renamed = gemm_as_matmul(model, gemms)
    assert sorted(renamed.values()) == sorted(gemms)
    assert not [n for n in model.graph.node if n.op_type == "Gemm"]
    onnx.save(model, str(tmp_path / "matmul.onnx"))
    batch = read_batch(data, 256)
    np.testing.assert_allclose(
        run_onnx(tmp_path / "matmul.onnx", batch), run_onnx(fp32_file, batch), atol=1e-6
    )


@pytest.mark.parametrize("method", ["static", "dynamic"])
def test_quantize_int8_writes_quantized_ops(
    exporter: DLRMExporter, fp32_file: Path, data: Path, tmp_path: Path, method: str
) -> None:
    out = tmp_path / "int8.onnx"
    calibration = read_batch(data, 512)
    options = QuantizeOptions(method=method, calibration_rows=512)  # type: ignore[arg-type]
    keep = exporter.fp32_nodes(onnx.load(str(fp32_file)))
    graph = quantize_int8(fp32_file, out, keep, options, calibration, "rows.tsv")
    assert len(graph.quantized_nodes) == 4
    ops = quantized_op_counts(onnx.load(str(out)))
    if method == "static":
        assert ops.get("QuantizeLinear", 0) >= 4 and ops.get("DequantizeLinear", 0) >= 8
        assert graph.settings["calibration_rows"] == 512
    else:
        assert ops == {"DynamicQuantizeLinear": 4, "MatMulInteger": 4}
    flops = count_flops(out)
    assert flops.per_sample == pytest.approx(count_flops(fp32_file).per_sample)
    assert 0 < flops.int8_per_sample < flops.per_sample  # the interaction and the output layer stay FP32
    probabilities = run_onnx(out, read_batch(data, 1024))
    assert probabilities.shape == (1024, 1) and np.all((probabilities >= 0) & (probabilities <= 1))


def test_static_quantization_needs_calibration_rows(
    exporter: DLRMExporter, fp32_file: Path, tmp_path: Path
) -> None:
    with pytest.raises(ExportError, match="calibration"):
        quantize_int8(fp32_file, tmp_path / "x.onnx", [], QuantizeOptions(method="static"))
    with pytest.raises(ConfigError):
        QuantizeOptions(method="fp8")  # type: ignore[arg-type]


def test_export_reports_the_int8_gate(exporter: DLRMExporter, data: Path, tmp_path: Path) -> None:
    # The tiny model's AUC moves by about 2e-3 under INT8: the gate is opened for this test of the report.
    options = ExportOptions(
        repository=tmp_path / "repo",
        fp16=False,
        int8=True,
        check_data=data,
        check_rows=2048,
        int8_auc_tolerance=0.02,
        quantize=QuantizeOptions(method="static", calibration_rows=1024),
    )
    results = export_family(exporter, options)
    assert [r.name for r in results] == ["dlrm_onnx", "dlrm_onnx_int8"]
    report = json.loads((tmp_path / "repo" / "dlrm_onnx_int8" / "export_report.json").read_text())
    assert report["checked_against"] == "onnx_fp32"
    assert report["parity"]["rows"] == 2048
    assert abs(report["parity"]["auc_delta"]) <= report["auc_tolerance"] == 0.02
    assert report["parity"]["max_abs_diff"] > 0
    by_batch = report["parity_by_batch_size"]
    assert sorted(by_batch, key=int) == ["1", "64", "4096"]
    # Static scales are fixed: a row gets the same answer in any batch.
    assert report["max_abs_diff_between_batch_sizes"] <= 1e-6
    assert report["quantization"]["method"] == "static"
    assert report["quantization"]["calibration_data"].endswith("rows 2049-3072")
    assert len(report["int8_nodes"]) == 4
    assert report["peak_memory"]["anon_bytes"] > 0 and report["peak_memory"]["file_bytes"] > 0
    config = read_config(tmp_path / "repo" / "dlrm_onnx_int8" / "config.pbtxt")
    assert config.name == "dlrm_onnx_int8" and config.backend == "onnxruntime"


def test_a_variant_failing_the_gate_is_not_written(
    exporter: DLRMExporter, data: Path, tmp_path: Path
) -> None:
    options = ExportOptions(
        repository=tmp_path / "repo",
        fp16=False,
        int8=True,
        check_data=data,
        check_rows=2048,
        int8_auc_tolerance=1e-12,
        quantize=QuantizeOptions(method="dynamic"),
    )
    with pytest.raises(ExportError, match="INT8 AUC differs from FP32"):
        export_family(exporter, options)
    # --int8 makes the gate part of the export: a failed export leaves the repository as it was.
    assert not (tmp_path / "repo").exists()
    # By default (int8=None) the cpu profile leaves a failing variant out and keeps the others.
    results = export_family(exporter, replace(options, int8=None))
    assert [r.name for r in results] == ["dlrm_onnx"]
    assert not (tmp_path / "repo" / "dlrm_onnx_int8").exists()


def test_int8_options(data: Path, tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="cpu"):
        ExportOptions(repository=tmp_path, serving=ServingConfig(profile="gpu"), int8=True)
    with pytest.raises(ConfigError, match="not a file"):
        ExportOptions(repository=tmp_path, int8=True, calibration_data=tmp_path / "missing.tsv")
    given = ExportOptions(
        repository=tmp_path, calibration_data=data, quantize=QuantizeOptions(calibration_rows=100)
    )
    rows, source = calibration_rows(given)
    assert len(rows) == 100 and source.endswith("rows 1-100")
    short = ExportOptions(repository=tmp_path, check_data=data, check_rows=3900)
    rows, source = calibration_rows(short)
    assert len(rows) == 2048 and "shared with the check" in source
    synthetic = ExportOptions(repository=tmp_path)
    rows, source = calibration_rows(synthetic)
    assert len(rows) == 2048 and source.startswith("synthetic")


def test_reduce_range_keeps_weights_to_seven_bits(
    exporter: DLRMExporter, fp32_file: Path, data: Path, tmp_path: Path
) -> None:
    """``--int8-reduce-range`` (CPUs without VNNI): every quantized weight fits in 7 bits."""
    from onnx import TensorProto, numpy_helper

    keep = exporter.fp32_nodes(onnx.load(str(fp32_file)))
    calibration = read_batch(data, 256)
    widest = {}
    for reduce_range in (False, True):
        out = tmp_path / f"int8-{reduce_range}.onnx"
        options = QuantizeOptions(method="static", calibration_rows=256, reduce_range=reduce_range)
        graph = quantize_int8(fp32_file, out, keep, options, calibration, "rows.tsv")
        assert graph.settings["reduce_range"] is reduce_range
        weights = [
            numpy_helper.to_array(t)
            for t in onnx.load(str(out)).graph.initializer
            if t.data_type == TensorProto.INT8
        ]
        assert weights
        widest[reduce_range] = max(int(np.abs(w.astype(np.int32)).max()) for w in weights)
    assert widest[True] <= 64 < widest[False]
