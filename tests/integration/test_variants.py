"""INT8 variants served by the real local tritonserver answer as ONNX Runtime in-process does."""

from __future__ import annotations

import asyncio
import json
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from bundle.repository import ServingConfig, add_model, version_dir
from clients.aio import AsyncTritonClient
from clients.triton import TritonClient
from clients.verify import in_process
from criteo.tsv import Batch, read_batch
from export.graphs.quantize import QuantizeOptions, quantized_op_counts
from export.importers.onnx_dlrm import DLRMExporter
from export.options import ExportOptions
from export.pipeline import export_family
from loadtest.roofline import RooflineOptions, count_flops, report_lines, run_roofline
from models.config import DLRMConfig, TrainConfig
from models.train_dlrm import train_dlrm
from server import LocalServer

pytestmark = pytest.mark.integration

STATIC = "dlrm_onnx_int8"
#: The dynamic variant, copied into the same repository under its own name.
DYNAMIC = "dlrm_onnx_int8_dynamic"


@pytest.fixture(scope="module")
def int8_repository(tmp_path_factory: pytest.TempPathFactory, labeled_file: Path) -> Path:
    """A repository with the tiny DLRM's FP32 model and its static and dynamic INT8 variants.

    The accuracy gate is opened wide: the tiny model is there to check serving, not accuracy.
    """
    root = tmp_path_factory.mktemp("int8")
    train_dlrm(labeled_file, root / "dlrm", DLRMConfig.preset("tiny"), TrainConfig(batch_size=256))
    exporter = DLRMExporter(root / "dlrm")
    repository = root / "model_repository"
    common = {"fp16": False, "int8": True, "check_data": labeled_file, "check_rows": 2048}
    export_family(
        exporter,
        ExportOptions(
            repository=root / "dynamic",
            quantize=QuantizeOptions(method="dynamic"),
            int8_auc_tolerance=1.0,
            **common,
        ),
    )
    export_family(
        exporter,
        ExportOptions(
            repository=repository, quantize=QuantizeOptions(method="static"), int8_auc_tolerance=1.0, **common
        ),
    )
    target = version_dir(repository, DYNAMIC) / "model.onnx"
    target.parent.mkdir(parents=True)
    shutil.copy(version_dir(root / "dynamic", STATIC) / "model.onnx", target)
    add_model(repository, DYNAMIC, ServingConfig())
    return repository


@pytest.fixture(scope="module")
def int8_server(start_triton, int8_repository: Path) -> LocalServer:  # type: ignore[no-untyped-def]
    return start_triton(int8_repository)


@pytest.fixture(scope="module")
def rows(labeled_file: Path) -> Batch:
    return read_batch(labeled_file, 512)


def _model_file(repository: Path, name: str) -> Path:
    return version_dir(repository, name) / "model.onnx"


def test_variants_hold_quantized_ops(int8_repository: Path) -> None:
    import onnx

    static = quantized_op_counts(onnx.load(str(_model_file(int8_repository, STATIC))))
    dynamic = quantized_op_counts(onnx.load(str(_model_file(int8_repository, DYNAMIC))))
    assert static.get("QuantizeLinear", 0) > 0 and static.get("DequantizeLinear", 0) > 0
    assert dynamic.get("MatMulInteger", 0) > 0


@pytest.mark.parametrize("protocol", ["grpc", "http"])
@pytest.mark.parametrize("model", [STATIC, DYNAMIC])
def test_served_equals_in_process(
    int8_server: LocalServer, int8_repository: Path, rows: Batch, protocol: str, model: str
) -> None:
    url = int8_server.grpc_url if protocol == "grpc" else int8_server.http_url
    with TritonClient(url, protocol) as client:  # type: ignore[arg-type]
        served = client.infer(model, rows.inputs())
    expected = in_process(_model_file(int8_repository, model), rows)
    assert served.shape == expected.shape == (len(rows), 1)
    np.testing.assert_allclose(served, expected, atol=1e-6, rtol=0)


def test_static_answers_do_not_depend_on_the_batch(
    int8_server: LocalServer, int8_repository: Path, rows: Batch
) -> None:
    """Requests sent together, which the dynamic batcher may run as one batch, each get what
    in-process ONNX Runtime gives for that request alone: static scales are fixed per model."""
    parts = [rows.slice(start, start + 64) for start in range(0, len(rows), 64)]

    async def send_all() -> list[np.ndarray]:
        async with AsyncTritonClient(int8_server.grpc_url, "grpc") as client:
            return await asyncio.gather(*(client.infer(STATIC, part.inputs()) for part in parts))

    served = asyncio.run(send_all())
    model_file = _model_file(int8_repository, STATIC)
    for part, answer in zip(parts, served, strict=True):
        np.testing.assert_allclose(answer, in_process(model_file, part), atol=1e-6, rtol=0)


def test_roofline_reports_served_and_in_process_fractions(
    int8_server: LocalServer, int8_repository: Path
) -> None:
    model_file = _model_file(int8_repository, DYNAMIC)
    options = RooflineOptions(
        model_file=model_file,
        model=DYNAMIC,
        url=int8_server.grpc_url,
        batch_size=64,
        concurrency=(1, 2),
        seconds=0.3,
        repeats=2,
        gemm_size=512,
    )
    result = run_roofline(options)
    flops = count_flops(model_file)
    assert result["flops"]["per_sample"] == flops.per_sample > flops.int8_per_sample > 0
    ceiling = result["ceiling"]["gflops"]
    assert ceiling > 0
    assert result["ceiling_samples_per_s"] == pytest.approx(ceiling * 1e9 / flops.per_sample)
    assert [p["what"] for p in result["probes"]] == [
        "onnxruntime MatMulInteger u8s8",
        "onnxruntime MatMul bfloat16",
    ]
    local = result["in_process"]
    assert local["samples_per_s"] > 0
    assert local["fraction_of_ceiling"] == pytest.approx(
        local["samples_per_s"] * flops.per_sample / (ceiling * 1e9)
    )
    assert [s["concurrency"] for s in result["served"]] == [1, 2]
    assert all(s["samples_per_s"] > 0 and s["fraction_of_ceiling"] > 0 for s in result["served"])
    text = "\n".join(report_lines(result))
    assert "FP32 ceiling" in text and "in-process" in text and "served (grpc dlrm_onnx_int8_dynamic" in text


def test_roofline_cli_prints_fractions_and_writes_json(
    int8_server: LocalServer, int8_repository: Path, tmp_path: Path
) -> None:
    out = tmp_path / "roofline.json"
    base = [
        sys.executable,
        "-m",
        "loadtest",
        "roofline",
        "--model-file",
        str(_model_file(int8_repository, STATIC)),
    ]
    args = [
        "--batch-size",
        "64",
        "--concurrency",
        "1",
        "--seconds",
        "0.2",
        "--repeats",
        "1",
        "--gemm-size",
        "256",
    ]
    served = [*base, "--model", STATIC, "--url", int8_server.grpc_url, *args, "--out", str(out)]
    completed = subprocess.run(served, capture_output=True, text=True, timeout=300, check=False)
    assert completed.returncode == 0, completed.stderr
    assert "FP32 ceiling" in completed.stdout and f"served (grpc {STATIC}, B=64" in completed.stdout
    result = json.loads(out.read_text())
    assert result["command"].startswith("python -m loadtest roofline") and len(result["served"]) == 1

    alone = subprocess.run([*base, "--url", int8_server.grpc_url, *args], capture_output=True, text=True,
                           timeout=120, check=False)  # fmt: skip
    assert alone.returncode == 1
    assert alone.stderr.strip().splitlines() == [
        "error: --url and --model go together: the served model at that address"
    ]
