"""A DLRM-DCNv2 built with the real ``torchrec`` package, exported with ``--hotness variable`` (bags of
any size, empty ones included) and served by the real local tritonserver: its answers are TorchRec's
own forward on the same KeyedJaggedTensor, over HTTP and gRPC; lengths that do not fit the values get
one error line naming the row and table, and the server stays up."""

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
from bundle.schema import DENSE_INPUT, LENGTHS_INPUT, NUM_CATEGORICAL, NUM_DENSE, VALUES_INPUT
from clients.triton import TritonClient
from criteo.multihot import BagBatch, draw_bags
from criteo.tsv import Batch
from server import LocalServer
from tests.byom_torch import TABLE_SIZES
from tests.torchrec_dcn import dcn_bag_logits, make_dcn, train_state

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
#: FP16 tables and MLPs around FP32 bag sums, cross net and sigmoid.
FP16_TOLERANCE = 1e-2


@pytest.fixture(scope="module")
def exported(tmp_path_factory: pytest.TempPathFactory):  # type: ignore[no-untyped-def]
    root = tmp_path_factory.mktemp("bags")
    model = make_dcn(seed=31)
    torch.save(train_state(model), root / "dlrm_dcn.pt")
    done = subprocess.run(
        [sys.executable, "-m", "export", "dlrm", "--checkpoint", str(root / "dlrm_dcn.pt"),
         "--hotness", "variable", "--repository", str(root / "repo"), "--no-int8", "--check-rows", "1024"],
        capture_output=True, text=True, check=False, cwd=ROOT,
    )  # fmt: skip
    assert done.returncode == 0, f"export failed:\n{done.stdout}\n{done.stderr}"
    return model, root / "repo"


@pytest.fixture(scope="module")
def server(start_triton, exported) -> LocalServer:  # type: ignore[no-untyped-def]
    return start_triton(exported[1])


def _bags(rows: int, seed: int) -> BagBatch:
    rng = np.random.default_rng(seed)
    dense = np.log1p(rng.integers(0, 1000, (rows, NUM_DENSE))).astype(np.float32)
    single = rng.integers(-(2**62), 2**62, (rows, NUM_CATEGORICAL), dtype=np.int64)
    bags = draw_bags(Batch(dense, single, None), seed=seed)
    lengths = bags.lengths.copy()
    lengths[1] = 0  # a row of empty bags only
    starts = bags.row_starts()
    values = np.concatenate([bags.values[: starts[1]], bags.values[starts[2] :]])
    return BagBatch(dense, values, None, lengths)


def _expected(model, bags: BagBatch) -> np.ndarray:  # type: ignore[no-untyped-def]
    columns = bags.value_columns()
    in_range = np.mod(bags.values, np.asarray(TABLE_SIZES, dtype=np.int64)[columns])
    logits = dcn_bag_logits(model, bags.dense, in_range, bags.lengths).astype(np.float64)
    return (1 / (1 + np.exp(-logits))).astype(np.float32)


def test_the_config_and_report_record_bags_of_any_size(exported) -> None:  # type: ignore[no-untyped-def]
    repository = exported[1]
    config = (repository / "dlrm_onnx" / "config.pbtxt").read_text()
    assert 'string_value: "variable"' in config and "max_batch_size" not in config
    assert VALUES_INPUT in config and LENGTHS_INPUT in config
    report = json.loads((repository / "dlrm_onnx" / "export_report.json").read_text())
    assert report["source"]["hotness"] == "variable"
    assert not (repository / "dlrm_onnx_raw").exists() and not (repository / "dlrm_torch").exists()


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_served_bags_answer_torchrecs_own_forward(server: LocalServer, exported, protocol: str) -> None:  # type: ignore[no-untyped-def]
    model = exported[0]
    bags = _bags(200, seed=3)
    assert (bags.lengths == 0).sum() > 200
    expected = _expected(model, bags)
    assert float(np.std(expected)) > 1e-3
    url = server.http_url if protocol == "http" else server.grpc_url
    with TritonClient(url, protocol) as client:  # type: ignore[arg-type]
        fp32 = client.infer("dlrm_onnx", bags.inputs())
        fp16 = client.infer("dlrm_onnx_fp16", bags.inputs())
        one = client.infer("dlrm_onnx", bags.slice(1, 2).inputs())  # one row, every bag empty
    np.testing.assert_allclose(fp32, expected, atol=1e-5, rtol=0)
    np.testing.assert_allclose(fp16, expected, atol=FP16_TOLERANCE, rtol=0)
    np.testing.assert_allclose(one, expected[1:2], atol=1e-5, rtol=0)


def test_lengths_that_do_not_fit_get_one_error_line(server: LocalServer) -> None:
    bags = _bags(4, seed=4)
    negative = bags.lengths.copy()
    negative[2, 5], negative[2, 6] = -1, negative[2, 6] + 1  # same sum, one length negative
    more = bags.lengths.copy()
    more[0, 0] += 1
    cases = {
        "row 2, table C6 has a negative bag length (-1)": negative,
        f"adds up to {bags.values.size + 1} ids, but 'categorical_values' holds {bags.values.size}": more,
    }
    raw = triton_http.InferenceServerClient(server.http_url)
    for message, lengths in cases.items():
        inputs = {DENSE_INPUT: bags.dense, VALUES_INPUT: bags.values, LENGTHS_INPUT: lengths}
        with TritonClient(server.grpc_url, "grpc") as client, pytest.raises(ClientError) as error:
            client.infer("dlrm_onnx", inputs)
        assert "\n" not in str(error.value) and message in str(error.value)
        # Sent as it is, past the client's checks: the server refuses it in one line and stays up.
        tensors = []
        for name, array, dtype in (
            (DENSE_INPUT, bags.dense, "FP32"),
            (VALUES_INPUT, bags.values, "INT64"),
            (LENGTHS_INPUT, lengths, "INT64"),
        ):
            tensors.append(triton_http.InferInput(name, list(array.shape), dtype))
            tensors[-1].set_data_from_numpy(np.ascontiguousarray(array))
        with pytest.raises(Exception, match=message.replace("(", r"\(").replace(")", r"\)")):
            raw.infer("dlrm_onnx", tensors)
    assert raw.is_server_live() and raw.is_model_ready("dlrm_onnx")
    raw.close()


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", *args], capture_output=True, text=True, check=False, cwd=ROOT
    )


def test_clients_evaluate_reads_the_multi_hot_text_format(
    server: LocalServer, exported, tmp_path: Path
) -> None:  # type: ignore[no-untyped-def]
    """``criteo synth --hotness variable`` writes bags of any size; ``clients evaluate`` and
    ``clients infer`` send them as values and lengths, answered as TorchRec answers them."""
    from criteo.multihot import read_bags

    data = tmp_path / "bags.tsv"
    made = _cli(
        "criteo", "synth", "--rows", "700", "--seed", "5", "--hotness", "variable", "--out", str(data)
    )
    assert made.returncode == 0, made.stderr
    bags = read_bags(data)
    assert (bags.lengths == 0).any() and bags.labels is not None
    evaluated = _cli(
        "clients", "evaluate", "--url", server.grpc_url, "--input", str(data), "--model", "dlrm_onnx",
        "--batch-size", "256", "--json", "--reference", str(exported[1] / "dlrm_onnx" / "1" / "model.onnx"),
    )  # fmt: skip
    assert evaluated.returncode == 0, evaluated.stderr
    evaluation = json.loads(evaluated.stdout)
    scores = evaluation["scores"]
    assert scores[0]["name"] == "dlrm_onnx" and scores[0]["rows"] == evaluation["reference"]["rows"] == 700
    # The graph run in-process on the same bags (values and lengths) answers as the server does.
    assert scores[0]["max_abs_diff"] <= 1e-6
    out = tmp_path / "p.csv"
    inferred = _cli(
        "clients", "infer", "--url", server.http_url, "--protocol", "http", "--input", str(data),
        "--model", "dlrm_onnx", "--batch-size", "300", "--output", str(out),
    )  # fmt: skip
    assert inferred.returncode == 0, inferred.stderr
    served = np.loadtxt(out, delimiter=",", skiprows=1, dtype=np.float32).reshape(-1, 1)
    np.testing.assert_allclose(served, _expected(exported[0], bags), atol=1e-5, rtol=0)


def test_a_sweep_sends_bags_of_any_size_with_every_engine(
    server: LocalServer, exported, tmp_path: Path
) -> None:  # type: ignore[no-untyped-def]
    """locust, the driver and (where installed) perf_analyzer send each request's values and
    lengths over gRPC and HTTP (bags drawn from a Criteo file's ids), the in-process baseline runs
    the graph on the same requests, and a streamed run sends the rows of a file of the multi-hot
    text format once each, with their own bags: every request answered, none refused."""
    from loadtest.sweeps.perf_analyzer import UNSTABLE
    from loadtest.sweeps.perf_analyzer_install import locate

    engines = "locust,driver" + (",perf_analyzer" if locate()[0] is not None else "")
    data = tmp_path / "rows.tsv"
    assert _cli("criteo", "synth", "--rows", "3000", "--seed", "9", "--out", str(data)).returncode == 0
    common = ["loadtest", "sweep", "--model", "dlrm_onnx", "--url", server.grpc_url, "--url", server.http_url,
              "--protocol", "grpc", "--protocol", "http", "--batch-size", "16", "--concurrency", "1",
              "--duration", "1", "--warmup", "0.3", "--data", str(data)]  # fmt: skip
    failed_before = _failed(server)
    cycled = _cli(
        *common, "--engine", engines, "--repository", str(exported[1]), "--out", str(tmp_path / "cycled")
    )
    assert cycled.returncode == 0, cycled.stdout[-2000:] + cycled.stderr[-3000:]
    report = json.loads((tmp_path / "cycled" / "report.json").read_text())
    steps = report["steps"]
    assert {(s["protocol"], s["engine"]) for s in steps} == {
        (p, e) for p in ("grpc", "http") for e in engines.split(",")
    }
    for step in steps:
        if step["failure"]:
            # On a busy machine perf_analyzer's windows may never agree: its step says so, with no
            # figure; locust and the driver always report what they measured.
            assert step["engine"] == "perf_analyzer" and UNSTABLE in step["failure"], step
            assert step["requests"] == 0 and step["samples_per_s"] is None, step
            continue
        assert step["requests"] > 0 and step["errors"] == 0 and step["samples_per_s"] > 0, step
    assert report["baselines"]["dlrm_onnx"][0]["samples_per_s"] > 0
    bags = tmp_path / "bags.tsv"
    assert (
        _cli("criteo", "synth", "--rows", "2000", "--hotness", "variable", "--out", str(bags)).returncode == 0
    )
    streamed = _cli(
        *common[:-1],
        str(bags),
        "--engine",
        "driver",
        "--stream",
        "--no-baseline",
        "--out",
        str(tmp_path / "streamed"),
    )
    assert streamed.returncode == 0, streamed.stdout[-2000:] + streamed.stderr[-3000:]
    for step in json.loads((tmp_path / "streamed" / "report.json").read_text())["steps"]:
        assert step["requests"] > 0 and step["errors"] == 0, step
    assert _failed(server) == failed_before


def _failed(server: LocalServer) -> int:
    import tritonclient.grpc as triton_grpc

    with triton_grpc.InferenceServerClient(server.grpc_url) as client:
        stats = client.get_inference_statistics("dlrm_onnx", as_json=True)
    return int(stats["model_stats"][0]["inference_stats"].get("fail", {}).get("count", 0))
