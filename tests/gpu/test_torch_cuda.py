"""The export's checks on a GPU: ``dlrm_torch`` (FP16 TorchScript) on CUDA, and the FP16 ONNX on
ONNX Runtime's CUDA provider (GPU only; each test skips cleanly where its half is missing).

Exports the tiny DLRM with ``--profile gpu`` in this process: the TorchScript
variant is gated on the CPU and on CUDA, the FP16 ONNX on the CPU and, with
onnxruntime-gpu, on CUDA; each report's ``cuda_check`` says how far the GPU's
answers are from the CPU's.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch

from bundle.repository import TORCHSCRIPT_FILE, ServingConfig, torch_model_name, version_dir
from criteo.synth import SynthConfig, write_tsv
from criteo.tsv import Batch, read_batch
from export.engines.torchscript import run_torchscript
from export.graphs.parity import extreme_id_rows
from export.importers.onnx_dlrm import DLRMExporter
from export.options import ExportOptions
from export.pipeline import export_family
from models.config import DLRMConfig, TrainConfig
from models.train_dlrm import train_dlrm

pytestmark = pytest.mark.gpu

NAME = torch_model_name("dlrm")
#: Bound on |CUDA - CPU| for the same FP16 model (different kernels, FP32 accumulation on both).
CUDA_VS_CPU = 2e-3


@pytest.fixture(scope="module")
def exported(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """``(repository, labeled rows)``: the tiny DLRM exported with --profile gpu."""
    root = tmp_path_factory.mktemp("gpu-checks")
    write_tsv(SynthConfig(rows=4000, seed=21), root / "rows.tsv")
    train_dlrm(root / "rows.tsv", root / "dlrm", DLRMConfig.preset("tiny", table_size=500), TrainConfig())
    options = ExportOptions(
        repository=root / "repo",
        serving=ServingConfig(profile="gpu", max_queue_delay_us=0),
        check_data=root / "rows.tsv",
        check_rows=2048,
        torch=True,
    )
    export_family(DLRMExporter(root / "dlrm"), options)
    return root / "repo", root / "rows.tsv"


def _cuda_check(repository: Path, name: str) -> dict:  # type: ignore[type-arg]
    return json.loads((repository / name / "export_report.json").read_text())["cuda_check"]


def test_torchscript_is_checked_on_cuda(exported: tuple[Path, Path]) -> None:
    if not torch.cuda.is_available():
        pytest.skip(f"torch {torch.__version__} sees no CUDA device")
    repository, data = exported
    check = _cuda_check(repository, NAME)
    assert check["status"] == "passed", check
    assert 0 <= check["max_abs_diff_vs_cpu"] <= CUDA_VS_CPU
    assert abs(check["parity"]["auc_delta"]) <= 1e-3
    path = version_dir(repository, NAME) / TORCHSCRIPT_FILE
    rows = read_batch(data, 512)
    extreme = extreme_id_rows(rows, 64)
    reduced = Batch(extreme.dense, np.mod(extreme.categorical, 500), None)
    on_cuda = run_torchscript(path, extreme, "cuda")
    np.testing.assert_array_equal(on_cuda, run_torchscript(path, reduced, "cuda"))
    np.testing.assert_allclose(on_cuda, run_torchscript(path, extreme, "cpu"), atol=CUDA_VS_CPU, rtol=0)


def test_fp16_onnx_is_gated_on_the_cuda_provider(exported: tuple[Path, Path]) -> None:
    import onnxruntime as ort

    if "CUDAExecutionProvider" not in ort.get_available_providers():
        pytest.skip(f"onnxruntime {ort.__version__} has no CUDAExecutionProvider (install onnxruntime-gpu)")
    repository, _ = exported
    check = _cuda_check(repository, "dlrm_onnx_fp16")
    if check["status"] == "skipped":
        pytest.skip(check["reason"])
    assert check["status"] == "passed" and check["provider"] == "CUDAExecutionProvider"
    assert 0 <= check["max_abs_diff_vs_cpu"] <= CUDA_VS_CPU
    assert abs(check["parity"]["auc_delta"]) <= 1e-3
