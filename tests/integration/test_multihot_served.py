"""A multi-hot DLRM-DCNv2 (MLPerf's hotness, 214 ids per sample, at small table sizes), built with the
real ``torchrec`` package, exported with ``--hotness mlperf`` and served by the real local tritonserver:
its answers are TorchRec's own forward on the same bags, over HTTP and gRPC; a request whose rows
have another number of ids gets one error line and the server stays up."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
import tritonclient.http as triton_http

from bundle.errors import ClientError
from bundle.schema import CATEGORICAL_INPUT, DENSE_INPUT, NUM_CATEGORICAL, NUM_DENSE
from clients.triton import TritonClient
from criteo.multihot import MLPERF_HOTNESS, expand
from server import LocalServer
from tests.byom_torch import TABLE_SIZES
from tests.torchrec_dcn import dcn_logits, make_dcn, train_state

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
WIDTH = sum(MLPERF_HOTNESS)
#: FP16 tables, bags and MLPs around an FP32 cross net and sigmoid.
FP16_TOLERANCE = 5e-3


@pytest.fixture(scope="module")
def exported(tmp_path_factory: pytest.TempPathFactory):  # type: ignore[no-untyped-def]
    root = tmp_path_factory.mktemp("multihot")
    model = make_dcn(seed=31)
    torch.save(train_state(model), root / "dlrm_dcn.pt")
    done = subprocess.run(
        [sys.executable, "-m", "export", "dlrm", "--checkpoint", str(root / "dlrm_dcn.pt"),
         "--hotness", "mlperf", "--repository", str(root / "repo"), "--no-int8", "--check-rows", "1024"],
        capture_output=True, text=True, check=False, cwd=ROOT,
    )  # fmt: skip
    assert done.returncode == 0, f"export failed:\n{done.stdout}\n{done.stderr}"
    return model, root / "repo"


@pytest.fixture(scope="module")
def server(start_triton, exported) -> LocalServer:  # type: ignore[no-untyped-def]
    return start_triton(exported[1])


def _request(rows: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    dense = np.log1p(rng.integers(0, 1000, (rows, NUM_DENSE))).astype(np.float32)
    single = rng.integers(-(2**62), 2**62, (rows, NUM_CATEGORICAL), dtype=np.int64)
    return dense, expand(single, MLPERF_HOTNESS, seed=seed)


def test_the_config_and_report_record_the_hotness(exported) -> None:  # type: ignore[no-untyped-def]
    repository = exported[1]
    config = (repository / "dlrm_onnx" / "config.pbtxt").read_text()
    assert f"dims: {WIDTH}" in config and ",".join(map(str, MLPERF_HOTNESS)) in config
    report = json.loads((repository / "dlrm_onnx" / "export_report.json").read_text())
    assert report["source"]["hotness"] == list(MLPERF_HOTNESS)
    assert report["source"]["format"] == "torchrec_dlrm_dcn_state_dict"
    assert not (repository / "dlrm_onnx_raw").exists()  # raw Criteo rows carry one id per table


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_served_bags_answer_torchrecs_own_forward(server: LocalServer, exported, protocol: str) -> None:  # type: ignore[no-untyped-def]
    model = exported[0]
    dense, ids = _request(200, seed=3)
    reduced = np.mod(ids, np.repeat(np.asarray(TABLE_SIZES, dtype=np.int64), MLPERF_HOTNESS)[None, :])
    logits = dcn_logits(model, dense, reduced, MLPERF_HOTNESS).astype(np.float64)
    expected = (1 / (1 + np.exp(-logits))).astype(np.float32)
    assert float(np.std(expected)) > 1e-3
    url = server.http_url if protocol == "http" else server.grpc_url
    with TritonClient(url, protocol) as client:  # type: ignore[arg-type]
        fp32 = client.infer("dlrm_onnx", {DENSE_INPUT: dense, CATEGORICAL_INPUT: ids})
        fp16 = client.infer("dlrm_onnx_fp16", {DENSE_INPUT: dense, CATEGORICAL_INPUT: ids})
    np.testing.assert_allclose(fp32, expected, atol=1e-5, rtol=0)
    np.testing.assert_allclose(fp16, expected, atol=FP16_TOLERANCE, rtol=0)


def test_rows_with_another_number_of_ids_get_one_error_line(server: LocalServer) -> None:
    dense, ids = _request(4, seed=4)
    with TritonClient(server.grpc_url, "grpc") as client, pytest.raises(ClientError) as error:
        client.infer("dlrm_onnx", {DENSE_INPUT: dense, CATEGORICAL_INPUT: ids[:, :-1]})
    assert "\n" not in str(error.value) and CATEGORICAL_INPUT in str(error.value)
    # Sent as it is, past the client's checks: the server refuses it and stays up.
    raw = triton_http.InferenceServerClient(server.http_url)
    inputs = [triton_http.InferInput(DENSE_INPUT, list(dense.shape), "FP32"),
              triton_http.InferInput(CATEGORICAL_INPUT, [4, WIDTH - 1], "INT64")]  # fmt: skip
    inputs[0].set_data_from_numpy(dense)
    inputs[1].set_data_from_numpy(np.ascontiguousarray(ids[:, :-1]))
    with pytest.raises(Exception, match=str(WIDTH)):
        raw.infer("dlrm_onnx", inputs)
    assert raw.is_server_live() and raw.is_model_ready("dlrm_onnx")
    raw.close()


def test_clients_evaluate_sends_fixed_bags_and_names_a_bag_of_another_size(
    server: LocalServer, exported, tmp_path: Path
) -> None:  # type: ignore[no-untyped-def]
    """``criteo synth --hotness mlperf`` rows scored through the server, and in-process by the
    graph itself (``--reference``, which reads the bags its hotness record names); a file whose
    bags have other sizes gets one line naming the row and table."""
    cli = [sys.executable, "-m"]
    data, other = tmp_path / "mlperf.tsv", tmp_path / "three.tsv"
    for path, hotness in ((data, "mlperf"), (other, "3")):
        made = subprocess.run(
            [*cli, "criteo", "synth", "--rows", "300", "--hotness", hotness, "--out", str(path)],
            capture_output=True, text=True, check=False, cwd=ROOT,
        )  # fmt: skip
        assert made.returncode == 0, made.stderr
    args = ["clients", "evaluate", "--url", server.grpc_url, "--model", "dlrm_onnx", "--json", "--input"]
    reference = ["--reference", str(exported[1] / "dlrm_onnx" / "1" / "model.onnx")]
    done = subprocess.run(
        [*cli, *args, str(data), *reference], capture_output=True, text=True, check=False, cwd=ROOT
    )
    assert done.returncode == 0, done.stderr
    evaluation = json.loads(done.stdout)
    assert evaluation["scores"][0]["rows"] == evaluation["reference"]["rows"] == 300
    assert evaluation["scores"][0]["max_abs_diff"] <= 1e-6
    refused = subprocess.run([*cli, *args, str(other)], capture_output=True, text=True, check=False, cwd=ROOT)
    assert refused.returncode != 0
    assert "row 1, table C1: 3 ids, the model's bags hold 3" not in refused.stderr
    assert "row 1, table C2: 3 ids, the model's bags hold 2" in refused.stderr
