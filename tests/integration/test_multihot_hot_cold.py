"""A multi-hot DLRM-DCNv2 with its tables split hot/cold: a TorchRec ``DLRM_DCN`` state dict exported
with ``--hotness`` and ``--hot-budget``, hot rows chosen from a profile of bags, served by the real local
tritonserver as the ensemble of the embedding stage (bags placed id by id) and the dense model. Its
answers are TorchRec's own forward on the same bags, over HTTP and gRPC."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
import tritonclient.http as triton_http

from bundle.schema import CATEGORICAL_INPUT, DENSE_INPUT, NUM_CATEGORICAL, NUM_DENSE
from clients.triton import TritonClient
from criteo.multihot import expand
from server import LocalServer
from tests.byom_torch import TABLE_SIZES
from tests.torchrec_dcn import dcn_logits, make_dcn, train_state

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
#: 1 to 3 ids per bag: 52 ids a row.
HOTNESS = tuple(1 + t % 3 for t in range(NUM_CATEGORICAL))
WIDTH = sum(HOTNESS)
#: The FP16 dense model (FP16 MLPs and hot rows around an FP32 cross net) against TorchRec in FP32.
FP16_TOLERANCE = 5e-3


def _run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", *args], capture_output=True, text=True, check=False, cwd=ROOT
    )


@pytest.fixture(scope="module")
def exported(tmp_path_factory: pytest.TempPathFactory):  # type: ignore[no-untyped-def]
    root = tmp_path_factory.mktemp("multihot_hot_cold")
    model = make_dcn(seed=41)
    torch.save(train_state(model), root / "dlrm_dcn.pt")
    counts = ",".join(map(str, HOTNESS))
    for name, seed in (("profile.tsv", 1), ("check.tsv", 2)):
        made = _run("criteo", "synth", "--rows", "3000", "--seed", str(seed), "--hotness", counts,
                    "--out", str(root / name))  # fmt: skip
        assert made.returncode == 0, made.stderr
    done = _run(
        "export", "dlrm", "--checkpoint", str(root / "dlrm_dcn.pt"), "--hotness", counts,
        "--hot-budget", "24K", "--profile-data", str(root / "profile.tsv"),
        "--check-data", str(root / "check.tsv"), "--check-rows", "1024",
        "--repository", str(root / "repo"), "--no-int8",
    )  # fmt: skip
    assert done.returncode == 0, f"export failed:\n{done.stdout}\n{done.stderr}"
    return model, root


@pytest.fixture(scope="module")
def server(start_triton, exported) -> LocalServer:  # type: ignore[no-untyped-def]
    return start_triton(exported[1] / "repo")


def test_the_ensemble_records_the_bags_and_its_hit_rate(exported) -> None:  # type: ignore[no-untyped-def]
    repository = exported[1] / "repo"
    report = json.loads((repository / "dlrm_onnx" / "export_report.json").read_text())
    assert report["placement"] == "hot-cold" and report["hotness"] == list(HOTNESS)
    # Some lookups of the check rows hit hot rows, some are read from the store.
    assert 0.05 < report["measured_hit_rate"]["hit_rate"] < 0.95, report["measured_hit_rate"]
    # The export checked the stage and the dense model against the all-in-graph graph.
    assert report["parity"]["max_abs_diff"] <= 1e-6
    for name in ("dlrm_onnx", "dlrm_embedding", "dlrm_dense", "dlrm_onnx_fp16"):
        config = (repository / name / "config.pbtxt").read_text()
        assert f"dims: {WIDTH}" in config, name
    assert ",".join(map(str, HOTNESS)) in (repository / "dlrm_embedding" / "config.pbtxt").read_text()


def _request(rows: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    dense = np.log1p(rng.integers(0, 1000, (rows, NUM_DENSE))).astype(np.float32)
    single = rng.integers(-(2**62), 2**62, (rows, NUM_CATEGORICAL), dtype=np.int64)
    ids = expand(single, HOTNESS, seed=seed)
    # Hot ids too: the profile's most looked-up rows are small ids of each table.
    ids[: rows // 2] = np.mod(ids[: rows // 2], 3)
    return dense, ids


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_served_bags_answer_torchrecs_own_forward(server: LocalServer, exported, protocol: str) -> None:  # type: ignore[no-untyped-def]
    model = exported[0]
    dense, ids = _request(200, seed=5)
    reduced = np.mod(ids, np.repeat(np.asarray(TABLE_SIZES, dtype=np.int64), HOTNESS)[None, :])
    logits = dcn_logits(model, dense, reduced, HOTNESS).astype(np.float64)
    expected = (1 / (1 + np.exp(-logits))).astype(np.float32)
    assert float(np.std(expected)) > 1e-3
    url = server.http_url if protocol == "http" else server.grpc_url
    with TritonClient(url, protocol) as client:  # type: ignore[arg-type]
        fp32 = client.infer("dlrm_onnx", {DENSE_INPUT: dense, CATEGORICAL_INPUT: ids})
        fp16 = client.infer("dlrm_onnx_fp16", {DENSE_INPUT: dense, CATEGORICAL_INPUT: ids})
    np.testing.assert_allclose(fp32, expected, atol=1e-5, rtol=0)
    np.testing.assert_allclose(fp16, expected, atol=FP16_TOLERANCE, rtol=0)


def test_rows_of_another_width_get_one_error_and_the_server_stays_up(server: LocalServer) -> None:
    dense, ids = _request(4, seed=6)
    raw = triton_http.InferenceServerClient(server.http_url)
    inputs = [triton_http.InferInput(DENSE_INPUT, list(dense.shape), "FP32"),
              triton_http.InferInput(CATEGORICAL_INPUT, [4, NUM_CATEGORICAL], "INT64")]  # fmt: skip
    inputs[0].set_data_from_numpy(dense)
    inputs[1].set_data_from_numpy(np.ascontiguousarray(ids[:, :NUM_CATEGORICAL]))
    with pytest.raises(Exception, match=str(WIDTH)):
        raw.infer("dlrm_onnx", inputs)
    assert raw.is_server_live() and raw.is_model_ready("dlrm_onnx")
    raw.close()


def test_clients_evaluate_scores_the_bag_file_through_the_ensemble(server: LocalServer, exported) -> None:  # type: ignore[no-untyped-def]
    check = exported[1] / "check.tsv"
    done = _run("clients", "evaluate", "--url", server.grpc_url, "--model", "dlrm_onnx", "--json",
                "--input", str(check))  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["scores"][0]["rows"] == 3000


def test_the_tables_streamed_from_the_checkpoint_split_alike(exported) -> None:  # type: ignore[no-untyped-def]
    """``--stream-tables``: no all-in-graph graph; the row store is written from the state dict's
    tables and the stages are checked against the rebuilt module itself."""
    root = exported[1]
    done = _run(
        "export", "dlrm", "--checkpoint", str(root / "dlrm_dcn.pt"), "--hotness", ",".join(map(str, HOTNESS)),
        "--stream-tables", "--embeddings", "hot-cold", "--hot-budget", "24K",
        "--profile-data", str(root / "profile.tsv"), "--check-data", str(root / "check.tsv"),
        "--check-rows", "1024", "--repository", str(root / "streamed"), "--no-int8", "--no-fp16",
    )  # fmt: skip
    assert done.returncode == 0, f"export failed:\n{done.stdout}\n{done.stderr}"
    report = json.loads((root / "streamed" / "dlrm_onnx" / "export_report.json").read_text())
    assert report["checked_against"] == "framework" and report["hotness"] == list(HOTNESS)
    assert report["parity"]["max_abs_diff"] <= 1e-5
