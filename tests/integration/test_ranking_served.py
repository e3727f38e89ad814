"""Ranking requests through the real local tritonserver, over HTTP and gRPC.

Three families exported with ``--user-features`` by the real CLIs: a DLRM (one id per table),
a Wide & Deep (Keras, trained in its own process) and a DLRM-DCNv2 with MLPerf's multi-hot
bags (built with the real ``torchrec``). Each ranking request is one user and its
candidates; its answer must equal the flat model's, served beside it, on the tiled rows,
one user a request and eight clients at once. A request with a part missing, empty,
of another dtype or width, or whose parts disagree gets one error line, and the server
answers the next request.
"""

from __future__ import annotations

import json
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from tritonclient.grpc import model_config_pb2 as mc
from tritonclient.utils import InferenceServerException

from bundle.errors import ClientError
from bundle.repository import read_config
from bundle.schema import (
    CANDIDATE_CATEGORICAL_INPUT,
    CANDIDATE_DENSE_INPUT,
    CATEGORICAL_INPUT,
    DENSE_INPUT,
    NUM_CATEGORICAL,
    NUM_DENSE,
    OUTPUT,
    USER_CATEGORICAL_INPUT,
    USER_DENSE_INPUT,
    USER_FEATURES_PARAMETER,
    FeatureSplit,
    ranking_model_name,
)
from clients.triton import TritonClient
from criteo.multihot import MLPERF_HOTNESS, expand
from criteo.tsv import read_batch
from server import LocalServer
from tests import raw_triton
from tests.torchrec_dcn import make_dcn, train_state

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
#: Half of the features the user's, dense and categorical alike, not in one run.
FEATURES = "I1-I4,I9,I12,C1-C6,C10,C14-C18,C25"
SPLIT = FeatureSplit.parse(FEATURES)
TOLERANCE = 1e-6
#: (model, hotness) of each case; the DCN's server is its own (its family is dlrm too).
CASES = {
    "dlrm": ("flat", "dlrm_onnx", None),
    "wide_deep": ("flat", "wide_deep_onnx", None),
    "dcn_multihot": ("multihot", "dlrm_onnx", MLPERF_HOTNESS),
}


def _run(*args: str) -> None:
    done = subprocess.run(
        [sys.executable, "-m", *args], capture_output=True, text=True, check=False, cwd=ROOT
    )
    assert done.returncode == 0, f"{' '.join(args)} failed:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"


@pytest.fixture(scope="module")
def repositories(tmp_path_factory: pytest.TempPathFactory, labeled_file: Path) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("ranking")
    flat, multihot = root / "flat", root / "multihot"
    check = ["--check-data", str(labeled_file), "--check-rows", "1024", "--no-int8", "--no-fp16",
             "--no-raw-rows", "--user-features", FEATURES]  # fmt: skip
    _run("models", "random-dlrm", "--preset", "tiny", "--out", str(root / "dlrm"))
    _run("export", "dlrm", "--checkpoint", str(root / "dlrm"), "--repository", str(flat), *check)
    _run("models", "train", "wide-deep", "--data", str(labeled_file), "--preset", "tiny",
         "--table-size", "500", "--epochs", "1", "--out", str(root / "wide_deep"))  # fmt: skip
    _run("export", "wide-deep", "--saved-model", str(root / "wide_deep"), "--repository", str(flat), *check)
    torch.save(train_state(make_dcn(seed=5)), root / "dcn.pt")
    # The check rows of a multi-hot export are its own bags, made from the rows' ids.
    dcn_check = [arg for arg in check if arg not in ("--check-data", str(labeled_file))]
    _run("export", "dlrm", "--checkpoint", str(root / "dcn.pt"), "--hotness", "mlperf",
         "--repository", str(multihot), *dcn_check)  # fmt: skip
    return {"flat": flat, "multihot": multihot}


@pytest.fixture(scope="module")
def servers(start_triton: Any, repositories: dict[str, Path]) -> dict[str, LocalServer]:
    return {name: start_triton(path) for name, path in repositories.items()}


def _rows(count: int, seed: int, hotness: tuple[int, ...] | None) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    dense = np.log1p(rng.integers(0, 1000, (count, NUM_DENSE))).astype(np.float32)
    ids = rng.integers(-(2**40), 2**40, (count, NUM_CATEGORICAL), dtype=np.int64)
    return dense, ids if hotness is None else expand(ids, hotness, seed=seed)


def _client(server: LocalServer, protocol: str) -> Any:
    return raw_triton.client(server, protocol)


def _infer(client: Any, model: str, inputs: dict[str, np.ndarray]) -> np.ndarray:
    return raw_triton.infer(client, model, inputs).as_numpy(OUTPUT)


@pytest.mark.parametrize("protocol", ["http", "grpc"])
@pytest.mark.parametrize("case", list(CASES))
def test_ranking_answers_equal_the_flat_model_on_the_tiled_rows(
    servers: dict[str, LocalServer], case: str, protocol: str
) -> None:
    where, flat, hotness = CASES[case]
    client = _client(servers[where], protocol)
    for seed, candidates in enumerate((1, 5, 128)):
        dense, ids = _rows(candidates, seed, hotness)
        request = SPLIT.split(dense, ids, hotness)
        answer = _infer(client, ranking_model_name(flat), request)
        assert answer.shape == (1, candidates, 1)
        tiled_dense, tiled_ids = SPLIT.tile(request, hotness)
        expected = _infer(client, flat, {DENSE_INPUT: tiled_dense, CATEGORICAL_INPUT: tiled_ids})
        assert float(np.std(expected)) > 0 or candidates == 1
        np.testing.assert_allclose(answer.reshape(-1), expected.reshape(-1), rtol=0, atol=TOLERANCE)


@pytest.mark.parametrize("case", list(CASES))
def test_eight_clients_at_once_each_get_their_own_users_answers(
    servers: dict[str, LocalServer], case: str
) -> None:
    where, flat, hotness = CASES[case]
    server = servers[where]

    def client_run(index: int) -> float:
        client = _client(server, "grpc" if index % 2 else "http")
        worst = 0.0
        for turn in range(6):
            count = int(np.random.default_rng(100 * index + turn).integers(1, 40))
            dense, ids = _rows(count, 1000 + 100 * index + turn, hotness)
            request = SPLIT.split(dense, ids, hotness)
            answer = _infer(client, ranking_model_name(flat), request).reshape(-1)
            tiled_dense, tiled_ids = SPLIT.tile(request, hotness)
            expected = _infer(client, flat, {DENSE_INPUT: tiled_dense, CATEGORICAL_INPUT: tiled_ids}).reshape(
                -1
            )
            assert answer.shape == expected.shape
            worst = max(worst, float(np.max(np.abs(answer - expected))))
        return worst

    with ThreadPoolExecutor(8) as pool:
        assert max(pool.map(client_run, range(8))) <= TOLERANCE


def _bad_requests(hotness: tuple[int, ...] | None) -> dict[str, tuple[dict[str, np.ndarray], str]]:
    dense, ids = _rows(4, 7, hotness)
    good = SPLIT.split(dense, ids, hotness)
    no_user = {k: v for k, v in good.items() if k != USER_CATEGORICAL_INPUT}
    empty = {**good, CANDIDATE_DENSE_INPUT: good[CANDIDATE_DENSE_INPUT][:, :0],
             CANDIDATE_CATEGORICAL_INPUT: good[CANDIDATE_CATEGORICAL_INPUT][:, :0]}  # fmt: skip
    wide = good[CANDIDATE_DENSE_INPUT]
    return {
        "user part missing": (no_user, USER_CATEGORICAL_INPUT),
        "candidate part empty": (empty, "no values"),
        "dtype": ({**good, CANDIDATE_DENSE_INPUT: wide.astype(np.float64)}, CANDIDATE_DENSE_INPUT),
        "width": (
            {**good, CANDIDATE_DENSE_INPUT: np.concatenate([wide, wide[:, :, :1]], axis=2)},
            CANDIDATE_DENSE_INPUT,
        ),
        "parts disagree": ({**good, CANDIDATE_DENSE_INPUT: wide[:, :3]}, "disagree"),
        "user rows": ({**good, USER_DENSE_INPUT: np.repeat(good[USER_DENSE_INPUT], 2, axis=0)}, "batch"),
    }


@pytest.mark.parametrize("protocol", ["http", "grpc"])
@pytest.mark.parametrize("case", ["dlrm", "dcn_multihot"])
def test_a_bad_ranking_request_gets_one_error_line_and_the_server_stays_up(
    servers: dict[str, LocalServer], case: str, protocol: str
) -> None:
    where, flat, hotness = CASES[case]
    client = _client(servers[where], protocol)
    for what, (inputs, needle) in _bad_requests(hotness).items():
        with pytest.raises(InferenceServerException) as raised:
            _infer(client, ranking_model_name(flat), inputs)
        message = str(raised.value)
        assert needle in message and "\n" not in message.strip(), (what, message)
    dense, ids = _rows(3, 9, hotness)
    assert _infer(client, ranking_model_name(flat), SPLIT.split(dense, ids, hotness)).shape == (1, 3, 1)


def test_the_config_records_the_split_and_batches_users(repositories: dict[str, Path]) -> None:
    config = read_config(repositories["flat"] / "dlrm_onnx_ranking" / "config.pbtxt")
    assert config.parameters[USER_FEATURES_PARAMETER].string_value == SPLIT.text
    assert config.max_batch_size > 1 and config.HasField("dynamic_batching")
    ragged = {entry.name for entry in config.input if entry.allow_ragged_batch}
    assert ragged == {CANDIDATE_DENSE_INPUT, CANDIDATE_CATEGORICAL_INPUT}
    assert [entry.kind for entry in config.batch_input] == [mc.BatchInput.BATCH_ITEM_SHAPE] * 2
    assert [entry.kind for entry in config.batch_output] == [mc.BatchOutput.BATCH_SCATTER_WITH_INPUT_SHAPE]
    # Every family's lookups of the user's tables read its ids once, none tiled.
    for where, flat, _ in CASES.values():
        path = repositories[where] / ranking_model_name(flat) / "export_report.json"
        report = json.loads(path.read_text())
        assert report["lookups_tiled"] == [] and report["lookups_once"] >= 1, report
        assert report["parity"]["max_abs_diff"] <= TOLERANCE


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_the_bundles_clients_send_a_file_of_users_as_one_request_per_user(
    servers: dict[str, LocalServer], tmp_path: Path, protocol: str
) -> None:
    """A synthetic file written as ranking requests, through ``clients evaluate`` as a user runs it:
    the ranking model scores every row as the flat model does."""
    data = tmp_path / "users.tsv"
    _run("criteo", "synth", "--rows", "3000", "--out", str(data), "--user-features", FEATURES,
         "--candidates", "40", "--candidate-spread", "geometric", "--users", "50")  # fmt: skip
    server = servers["flat"]
    url = server.http_url if protocol == "http" else server.grpc_url
    command = [sys.executable, "-m", "clients", "evaluate", "--protocol", protocol, "--url", url,
               "--input", str(data), "--model", "dlrm_onnx", "--model", "dlrm_onnx_ranking",
               "--json"]  # fmt: skip
    done = subprocess.run(command, capture_output=True, text=True, check=False, cwd=ROOT)
    assert done.returncode == 0, done.stderr[-2000:]
    scores = {score["name"]: score for score in json.loads(done.stdout)["scores"]}
    assert scores["dlrm_onnx_ranking"]["rows"] == scores["dlrm_onnx"]["rows"] == 3000
    assert abs(scores["dlrm_onnx_ranking"]["auc"] - scores["dlrm_onnx"]["auc"]) <= 1e-6
    assert abs(scores["dlrm_onnx_ranking"]["logloss"] - scores["dlrm_onnx"]["logloss"]) <= 1e-6
    with TritonClient(url, protocol) as client:  # type: ignore[arg-type]
        rows = read_batch(data, 500)
        flat = client.infer("dlrm_onnx", rows.inputs())
        ranked = client.infer("dlrm_onnx_ranking", rows.inputs())
        assert ranked.shape == flat.shape == (500, 1)
        np.testing.assert_allclose(ranked, flat, rtol=0, atol=TOLERANCE)
        empty = SPLIT.split(*_rows(2, 3, None))
        empty[CANDIDATE_DENSE_INPUT] = empty[CANDIDATE_DENSE_INPUT][:, :0]
        with pytest.raises(ClientError, match="holds no candidates"):
            client.infer("dlrm_onnx_ranking", empty)


def _loadtest(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "loadtest", *args], capture_output=True, text=True, check=False, cwd=ROOT
    )


def test_the_load_tests_send_ranking_requests_beside_the_flat_model(
    servers: dict[str, LocalServer], repositories: dict[str, Path], tmp_path: Path
) -> None:
    """The sweep (locust, the driver and perf_analyzer where installed, over gRPC and HTTP), the
    open loop and LoadGen with drawn pairs per query send the ranking model one user and its
    candidates a request, and the flat model beside it the same candidates as tiled rows: every
    request answered, none refused, and the report says what a request carries."""
    from loadtest.sweeps.perf_analyzer import UNSTABLE
    from loadtest.sweeps.perf_analyzer_install import locate

    server, ranking = servers["flat"], ranking_model_name("dlrm_onnx")
    engines = "locust,driver" + (",perf_analyzer" if locate()[0] is not None else "")
    common = ["--model", "dlrm_onnx", "--model", ranking, "--url", server.grpc_url, "--url", server.http_url,
              "--protocol", "grpc", "--protocol", "http", "--batch-size", "24", "--duration", "1",
              "--warmup", "0.3", "--repository", str(repositories["flat"]), "--no-baseline"]  # fmt: skip
    failed_before = _failed(server, ranking)
    swept = _loadtest(
        "sweep", *common, "--concurrency", "2", "--engine", engines, "--out", str(tmp_path / "s")
    )
    assert swept.returncode == 0, swept.stdout[-2000:] + swept.stderr[-3000:]
    report = json.loads((tmp_path / "s" / "report.json").read_text())
    assert {(s["model"], s["protocol"], s["engine"]) for s in report["steps"]} == {
        (m, p, e) for m in ("dlrm_onnx", ranking) for p in ("grpc", "http") for e in engines.split(",")
    }
    for step in report["steps"]:
        if step["failure"]:
            assert step["engine"] == "perf_analyzer" and UNSTABLE in step["failure"], step
            continue
        assert step["requests"] > 0 and step["errors"] == 0, step
        assert step["samples_per_s"] == pytest.approx(24 * step["requests_per_s"], rel=1e-6), step
    settings = report["settings"]
    assert f"{ranking}: one user and its B candidates a request" in settings["Ranking requests"]
    assert FEATURES.split(",")[0] in settings["Ranking requests"]
    sizes = dict(part.rsplit(": ", 1) for part in settings["Bytes a request sends (per sample)"].split("; "))
    for protocol in ("grpc", "http"):
        flat = float(sizes[f"dlrm_onnx {protocol} B=24"].split("(")[1].rstrip(")").replace(",", ""))
        ranked = float(sizes[f"{ranking} {protocol} B=24"].split("(")[1].rstrip(")").replace(",", ""))
        assert 0.3 * flat < ranked < 0.8 * flat, sizes
    rates = _loadtest("sweep", *common, "--request-rate", "40", "--out", str(tmp_path / "r"))
    assert rates.returncode == 0, rates.stdout[-2000:] + rates.stderr[-3000:]
    for step in json.loads((tmp_path / "r" / "rates.json").read_text())["steps"]:
        assert step["requests"] > 0 and step["errors"] == 0, step
    pairs = _loadtest(
        "mlperf", "--url", server.grpc_url, "--model", ranking, "--target-qps", "40",
        "--latency-bound-ms", "200", "--min-duration", "1", "--min-queries", "40", "--pairs", "1:60",
        "--out", str(tmp_path / "m"),
    )  # fmt: skip
    assert pairs.returncode == 0, pairs.stderr[-3000:]
    assert "LoadGen server: Result is" in pairs.stdout and "refused" not in pairs.stdout, pairs.stdout
    assert _failed(server, ranking) == failed_before


def _failed(server: LocalServer, model: str) -> int:
    """Requests ``model`` refused since the server started (the bad-request test sends some)."""
    with TritonClient(server.grpc_url, "grpc") as client:
        return sum(stats.fail_count for stats in client.statistics(model))
