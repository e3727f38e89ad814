"""Both trained-and-exported models served by the real local tritonserver over HTTP and gRPC."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from bundle.errors import ClientError
from bundle.repository import read_config
from bundle.schema import CATEGORICAL_INPUT, DENSE_INPUT, INPUTS, OUTPUTS
from clients.triton import TritonClient
from clients.verify import in_process, repository_models, verify_repository
from criteo.tsv import Batch, read_batch
from server import LocalServer

pytestmark = pytest.mark.integration

# The cpu profile writes FP32, FP16 and INT8 (static) variants of both families.
MODELS = [f"{family}_onnx{suffix}" for family in ("dlrm", "wide_deep") for suffix in ("", "_fp16", "_int8")]


@pytest.fixture(scope="module")
def rows(labeled_file: Path) -> Batch:
    return read_batch(labeled_file, 100)


def test_repository_holds_every_cpu_model_and_configs_parse(exported_repository: Path) -> None:
    assert repository_models(exported_repository) == MODELS
    for name in MODELS:
        config = read_config(exported_repository / name / "config.pbtxt")
        assert config.name == name and config.backend == "onnxruntime"
        assert [t.name for t in config.input] == [s.name for s in INPUTS]
        assert [t.name for t in config.output] == [s.name for s in OUTPUTS]
        assert config.max_batch_size > 0 and config.HasField("dynamic_batching")


def test_served_equals_in_process_over_http_and_grpc(
    exported_server: LocalServer, exported_repository: Path, rows: Batch
) -> None:
    results = verify_repository(exported_repository, exported_server.http_url, exported_server.grpc_url, rows)
    assert [r.model for r in results] == MODELS
    for result in results:
        assert result.rows == 100
        assert result.http_max_abs_diff <= 1e-6, result
        assert result.grpc_max_abs_diff <= 1e-6, result


@pytest.mark.parametrize("protocol", ["http", "grpc"])
@pytest.mark.parametrize("model", MODELS)
def test_out_of_range_ids_give_valid_probabilities(
    exported_server: LocalServer, exported_repository: Path, rows: Batch, protocol: str, model: str
) -> None:
    info = np.iinfo(np.int64)
    ids = np.resize(np.array([info.min, info.max, -1, -(10**15), 2**62 + 5, 10**12]), (16, 26))
    batch = Batch(rows.dense[:16], ids.astype(np.int64), None)
    url = exported_server.http_url if protocol == "http" else exported_server.grpc_url
    with TritonClient(url, protocol) as client:  # type: ignore[arg-type]
        served = client.infer(model, batch.inputs())
    assert served.shape == (16, 1) and served.dtype == np.float32
    assert np.all((served >= 0) & (served <= 1))
    np.testing.assert_allclose(
        served, in_process(exported_repository / model / "1" / "model.onnx", batch), atol=1e-6
    )


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_bad_input_gets_one_error_and_the_server_stays_up(
    exported_server: LocalServer, rows: Batch, protocol: str
) -> None:
    url = exported_server.http_url if protocol == "http" else exported_server.grpc_url
    with TritonClient(url, protocol) as client:  # type: ignore[arg-type]
        wrong_shape = {DENSE_INPUT: rows.dense[:4, :5], CATEGORICAL_INPUT: rows.categorical[:4]}
        with pytest.raises(ClientError, match="dlrm_onnx"):
            client.infer("dlrm_onnx", wrong_shape)
        with pytest.raises(ClientError, match="no_such_model"):
            client.infer("no_such_model", rows.slice(0, 4).inputs())
        assert client.is_ready()
        served = client.infer("dlrm_onnx", rows.slice(0, 4).inputs())
    assert served.shape == (4, 1)
