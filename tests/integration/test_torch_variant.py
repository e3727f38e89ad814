"""``dlrm_torch`` served by the real local tritonserver through the Python-based ``pytorch`` backend.

The tiny DLRM is exported with the TorchScript variant on KIND_CPU instances
(``--profile cpu --torch``): the config is the one the NGC image's PyTorch
backend serves (``platform: "pytorch_libtorch"``), here taken by
``backends/pytorch/model.py``. Served answers must be what the same
TorchScript file gives in this process, over HTTP and gRPC, ids far outside the
tables included; a request of the wrong dtype gets one clear error and the
server keeps answering.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from bundle.repository import TORCHSCRIPT_FILE, torch_model_name, version_dir
from bundle.schema import DENSE_INPUT, OUTPUT
from clients.triton import TritonClient
from criteo.tsv import Batch, read_batch
from export.engines.torchscript import run_torchscript
from export.graphs.parity import extreme_id_rows
from export.importers.onnx_dlrm import DLRMExporter
from export.options import ExportOptions
from export.pipeline import export_family
from models.config import DLRMConfig, TrainConfig
from models.train_dlrm import train_dlrm
from server import LocalServer

pytestmark = pytest.mark.integration

MODEL = torch_model_name("dlrm")


@pytest.fixture(scope="module")
def torch_repository(tmp_path_factory: pytest.TempPathFactory, labeled_file: Path) -> Path:
    """The tiny DLRM's dlrm_onnx and dlrm_torch (KIND_CPU), checked by the export."""
    root = tmp_path_factory.mktemp("torch-variant")
    train_dlrm(
        labeled_file, root / "dlrm", DLRMConfig.preset("tiny", table_size=500), TrainConfig(batch_size=256)
    )
    repository = root / "model_repository"
    options = ExportOptions(
        repository=repository, check_data=labeled_file, check_rows=2048, fp16=False, int8=False, torch=True
    )
    export_family(DLRMExporter(root / "dlrm"), options)
    return repository


@pytest.fixture(scope="module")
def torch_server(start_triton, torch_repository: Path) -> LocalServer:  # type: ignore[no-untyped-def]
    return start_triton(torch_repository)


@pytest.fixture(scope="module")
def rows(labeled_file: Path) -> Batch:
    return read_batch(labeled_file, 300)


def _script(repository: Path) -> Path:
    return version_dir(repository, MODEL) / TORCHSCRIPT_FILE


@pytest.mark.parametrize("protocol", ["grpc", "http"])
def test_served_equals_the_torchscript_in_process(
    torch_server: LocalServer, torch_repository: Path, rows: Batch, protocol: str
) -> None:
    url = torch_server.grpc_url if protocol == "grpc" else torch_server.http_url
    with TritonClient(url, protocol) as client:  # type: ignore[arg-type]
        served = client.infer(MODEL, rows.inputs())
    expected = run_torchscript(_script(torch_repository), rows)
    assert served.dtype == np.float32 and served.shape == expected.shape == (len(rows), 1)
    np.testing.assert_allclose(served, expected, atol=1e-6, rtol=0)


@pytest.mark.parametrize("protocol", ["grpc", "http"])
def test_out_of_range_ids_are_answered_as_their_reduced_ids(
    torch_server: LocalServer, torch_repository: Path, rows: Batch, protocol: str
) -> None:
    extreme = extreme_id_rows(rows, 64)
    sizes = np.asarray(DLRMConfig.preset("tiny", table_size=500).table_sizes)
    reduced = Batch(extreme.dense, np.mod(extreme.categorical, sizes), None)
    url = torch_server.grpc_url if protocol == "grpc" else torch_server.http_url
    with TritonClient(url, protocol) as client:  # type: ignore[arg-type]
        served = client.infer(MODEL, extreme.inputs())
    assert np.all(np.isfinite(served)) and np.all((served >= 0) & (served <= 1))
    np.testing.assert_allclose(served, run_torchscript(_script(torch_repository), reduced), atol=1e-6, rtol=0)


def test_a_wrong_dtype_gets_one_clear_error_and_the_server_keeps_serving(
    torch_server: LocalServer, torch_repository: Path, rows: Batch
) -> None:
    batch = rows.slice(0, 4).inputs()
    bad = {**batch, DENSE_INPUT: batch[DENSE_INPUT].astype(np.float64)}

    def inputs(arrays: dict[str, np.ndarray]) -> list[httpclient.InferInput]:
        tensors = []
        for name, array in arrays.items():
            kind = {"float32": "FP32", "float64": "FP64", "int64": "INT64"}[array.dtype.name]
            tensor = httpclient.InferInput(name, list(array.shape), kind)
            tensor.set_data_from_numpy(array)
            tensors.append(tensor)
        return tensors

    client = httpclient.InferenceServerClient(torch_server.http_url)
    try:
        with pytest.raises(InferenceServerException, match=rf"FP64.*'{DENSE_INPUT}'|'{DENSE_INPUT}'.*FP64"):
            client.infer(MODEL, inputs(bad))
        assert client.is_server_ready() and client.is_model_ready(MODEL)
        answer = client.infer(MODEL, inputs(batch)).as_numpy(OUTPUT)
    finally:
        client.close()
    np.testing.assert_allclose(
        answer, run_torchscript(_script(torch_repository), rows.slice(0, 4)), atol=1e-6
    )
