"""The bundle's own DLRM-DCNv2 (``dcnv2-tiny``), trained and exported through the real CLIs with the
default gates, served by the real local tritonserver: FP32 answers PyTorch's own forward, FP16 and
static INT8 pass their AUC gates (the cross net stays FP32), and the report says what was exported."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from clients.triton import TritonClient
from criteo.synth import SynthConfig, write_tsv
from criteo.tsv import read_batch
from models.config import load_config
from models.dlrm import DLRM, WEIGHTS_FILE, predict_probabilities
from server import LocalServer

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
#: FP16 layers around an FP32 cross net and sigmoid move a probability by ~1e-3 at most here.
FP16_TOLERANCE = 5e-3


def _run(*args: str) -> None:
    done = subprocess.run(
        [sys.executable, "-m", *args], capture_output=True, text=True, check=False, cwd=ROOT
    )
    assert done.returncode == 0, f"{' '.join(args)} failed:\n{done.stdout}\n{done.stderr}"


@pytest.fixture(scope="module")
def dcn(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """A dcnv2-tiny trained on 30k synthetic rows (two epochs), exported with the default gates."""
    root = tmp_path_factory.mktemp("dcn")
    data = root / "rows.tsv"
    write_tsv(SynthConfig(rows=30_000, seed=11), data)
    _run("models", "train", "dlrm", "--data", str(data), "--preset", "dcnv2-tiny", "--table-size", "500",
         "--epochs", "2", "--out", str(root / "model"))  # fmt: skip
    _run("export", "dlrm", "--checkpoint", str(root / "model"), "--repository", str(root / "repo"),
         "--check-data", str(data), "--check-rows", "4096", "--int8")  # fmt: skip
    return root, data


@pytest.fixture(scope="module")
def server(start_triton, dcn: tuple[Path, Path]) -> LocalServer:  # type: ignore[no-untyped-def]
    return start_triton(dcn[0] / "repo")


def test_the_config_and_report_say_dcn(dcn: tuple[Path, Path]) -> None:
    root, _ = dcn
    config = load_config(root / "model")
    assert (config.interaction, config.cross_layers, config.cross_rank) == ("dcn", 2, 8)
    report = json.loads((root / "repo" / "dlrm_onnx_int8" / "export_report.json").read_text())
    assert abs(report["parity"]["auc_delta"]) <= report["auc_tolerance"] == 1e-3
    # The cross net's MatMuls stay FP32; the MLPs' Gemms are INT8.
    assert any("/interaction/" in name for name in report["fp32_matmul_nodes"])
    assert any("/top_mlp/" in name for name in report["int8_nodes"])


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_served_dcn_answers_pytorchs_own_forward(
    server: LocalServer, dcn: tuple[Path, Path], protocol: str
) -> None:
    root, data = dcn
    config = load_config(root / "model")
    model = DLRM(config)
    model.load_state_dict(torch.load(root / "model" / WEIGHTS_FILE, weights_only=True))
    batch = read_batch(data, 512)
    expected = predict_probabilities(model, batch)
    url = server.http_url if protocol == "http" else server.grpc_url
    with TritonClient(url, protocol) as client:  # type: ignore[arg-type]
        fp32 = client.infer("dlrm_onnx", batch.inputs())
        fp16 = client.infer("dlrm_onnx_fp16", batch.inputs())
        int8 = client.infer("dlrm_onnx_int8", batch.inputs())
    np.testing.assert_allclose(fp32, expected, atol=1e-5, rtol=0)
    assert float(np.std(expected)) > 1e-2
    np.testing.assert_allclose(fp16, expected, atol=FP16_TOLERANCE, rtol=0)
    assert int8.shape == expected.shape and np.all((int8 >= 0) & (int8 <= 1))
