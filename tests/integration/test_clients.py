"""clients/ against the real local tritonserver: both protocols, sync and async, shared memory,
a file larger than one batch, evaluation, client-side validation and the CLI's error lines."""

from __future__ import annotations

import asyncio
import json
import os
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from bundle.errors import ClientError
from bundle.schema import CATEGORICAL_INPUT, DENSE_INPUT, OUTPUT
from clients.__main__ import app
from clients.aio import AsyncTritonClient
from clients.options import ClientOptions
from clients.predict import PredictOptions, predict_file
from clients.reference import OnnxReference
from clients.retry import RetryPolicy
from clients.shm import mapped_regions
from clients.triton import TritonClient
from criteo.metrics import roc_auc
from criteo.tsv import Batch, read_batch
from server import LocalServer, free_ports

pytestmark = pytest.mark.integration

FAMILIES = ["dlrm_onnx", "wide_deep_onnx"]
ROWS = 2_500
BATCH = 1024


def _url(server: LocalServer, protocol: str) -> str:
    return server.http_url if protocol == "http" else server.grpc_url


def _onnx(repository: Path, model: str) -> Path:
    return repository / model / "1" / "model.onnx"


def _clients(*args: str) -> subprocess.CompletedProcess[str]:
    """``python -m clients ...`` in its own process, as a user runs it."""
    env = {**os.environ, "PYTHONPATH": str(Path.cwd())}
    return subprocess.run(
        [sys.executable, "-m", "clients", *args], capture_output=True, text=True, env=env, timeout=120
    )


@pytest.fixture(scope="module")
def big_file(labeled_file: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The first 2,500 rows of the labeled file: more than two batches of 1,024."""
    path = tmp_path_factory.mktemp("clients") / "rows_2500.tsv"
    with labeled_file.open() as source, path.open("w") as target:
        for _, line in zip(range(ROWS), source, strict=False):
            target.write(line)
    return path


@pytest.fixture(scope="module")
def big_rows(big_file: Path) -> Batch:
    return read_batch(big_file)


@pytest.fixture(scope="module")
def expected(exported_repository: Path, big_rows: Batch) -> dict[str, np.ndarray]:
    """ONNX Runtime in this process on the 2,500 rows, per model family: ``2500 x 1``."""
    return {model: OnnxReference(_onnx(exported_repository, model)).predict(big_rows) for model in FAMILIES}


def _read_csv(path: Path) -> np.ndarray:
    lines = path.read_text().splitlines()
    assert lines[0] == OUTPUT
    return np.array([float(value) for value in lines[1:]], dtype=np.float64)


@pytest.mark.parametrize("shared_memory", ["none", "system"])
@pytest.mark.parametrize("mode", ["sync", "async"])
@pytest.mark.parametrize("protocol", ["http", "grpc"])
@pytest.mark.parametrize("model", FAMILIES)
def test_file_larger_than_a_batch_equals_in_process(
    exported_server: LocalServer,
    big_file: Path,
    expected: dict[str, np.ndarray],
    tmp_path: Path,
    model: str,
    protocol: str,
    mode: str,
    shared_memory: str,
) -> None:
    options = ClientOptions(_url(exported_server, protocol), protocol, shared_memory=shared_memory)  # type: ignore[arg-type]
    out = tmp_path / "p.csv"
    summary = predict_file(options, model, big_file, PredictOptions(BATCH, mode, max_in_flight=3), out)  # type: ignore[arg-type]
    assert (summary.rows, summary.batches) == (ROWS, 3)
    served = _read_csv(out)
    assert served.shape == (ROWS,)
    np.testing.assert_allclose(served, expected[model].ravel(), rtol=0, atol=1e-6)
    assert mapped_regions() == []


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_shared_memory_regions_are_released_on_close_and_on_errors(
    exported_server: LocalServer, big_rows: Batch, protocol: str
) -> None:
    url = _url(exported_server, protocol)
    # Regions this test did not register (the server is shared by the module) are not its own.
    before, mapped = set(_server_regions(url, protocol)), set(mapped_regions())
    with TritonClient(url, protocol, shared_memory="system") as client:  # type: ignore[arg-type]
        client.infer("dlrm_onnx", big_rows.slice(0, 8).inputs())
        names = sorted(set(_server_regions(url, protocol)) - before)
        assert len(names) == 1 and names[0].startswith("ctr_")
    assert set(_server_regions(url, protocol)) == before and set(mapped_regions()) == mapped

    async def fail_in_flight() -> None:
        async with AsyncTritonClient(url, protocol, shared_memory="system", validate=False) as client:  # type: ignore[arg-type]
            bad = {DENSE_INPUT: big_rows.dense[:4, :5], CATEGORICAL_INPUT: big_rows.categorical[:4]}
            good = big_rows.slice(0, 4).inputs()
            await asyncio.gather(client.infer("dlrm_onnx", good), client.infer("dlrm_onnx", bad))

    with pytest.raises(ClientError, match="dlrm_onnx"):
        asyncio.run(fail_in_flight())
    assert set(_server_regions(url, protocol)) == before and set(mapped_regions()) == mapped


def _server_regions(url: str, protocol: str) -> list[str]:
    import tritonclient.grpc as grpc_client
    import tritonclient.http as http_client

    if protocol == "http":
        status = http_client.InferenceServerClient(url).get_system_shared_memory_status()
        return [entry["name"] for entry in status]
    status = grpc_client.InferenceServerClient(url).get_system_shared_memory_status(as_json=True)
    return list(status.get("regions", {}))


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_validation_rejects_bad_requests_before_sending(
    exported_server: LocalServer, big_rows: Batch, protocol: str
) -> None:
    good = big_rows.slice(0, 4).inputs()
    too_many = np.resize(big_rows.dense, (4097, 13)), np.resize(big_rows.categorical, (4097, 26))
    with_nan = big_rows.dense[:4].copy()
    with_nan[1, 3] = np.nan
    cases = {
        "holds 1 non-finite value\\(s\\) \\(NaN or Inf\\), the first nan at index \\[1, 3\\]": {
            **good,
            DENSE_INPUT: with_nan,
        },
        "has shape \\[4, 5\\], expected \\[-1, 13\\]": {**good, DENSE_INPUT: big_rows.dense[:4, :5]},
        "has dtype float64, expected FP32": {**good, DENSE_INPUT: big_rows.dense[:4].astype(np.float64)},
        "batch of 4097 rows exceeds its max_batch_size 4096": {
            DENSE_INPUT: too_many[0],
            CATEGORICAL_INPUT: too_many[1],
        },
    }
    with TritonClient(_url(exported_server, protocol), protocol) as client:  # type: ignore[arg-type]
        before = client.statistics("dlrm_onnx")[0]
        for message, inputs in cases.items():
            with pytest.raises(ClientError, match=f"model 'dlrm_onnx': input .*{message}|{message}"):
                client.infer("dlrm_onnx", inputs)
        after = client.statistics("dlrm_onnx")[0]
    # Nothing reached the server: no failed and no extra successful request.
    assert (after.fail_count, after.success_count) == (before.fail_count, before.success_count)


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_invalid_argument_from_the_server_is_not_retried(
    exported_server: LocalServer, big_rows: Batch, protocol: str
) -> None:
    retry = RetryPolicy(max_tries=5, initial_backoff_s=0.01, max_backoff_s=0.01)
    url = _url(exported_server, protocol)
    with TritonClient(url, protocol, validate=False, retry=retry) as client:  # type: ignore[arg-type]
        before = client.statistics("dlrm_onnx")[0].fail_count
        bad = {DENSE_INPUT: big_rows.dense[:4, :5], CATEGORICAL_INPUT: big_rows.categorical[:4]}
        with pytest.raises(ClientError, match=f"model 'dlrm_onnx' at {protocol}://{url}: unexpected shape"):
            client.infer("dlrm_onnx", bad)
        assert client.statistics("dlrm_onnx")[0].fail_count - before in (0, 1)  # one try at most
        assert client.is_ready()


def test_evaluate_cli_auc_matches_in_process(
    exported_server: LocalServer, exported_repository: Path, labeled_file: Path
) -> None:
    models = ["dlrm_onnx", "dlrm_onnx_fp16", "wide_deep_onnx", "wide_deep_onnx_fp16"]
    args = ["evaluate", "--url", exported_server.grpc_url, "--input", str(labeled_file), "--json"]
    args += ["--reference", str(_onnx(exported_repository, "dlrm_onnx")), "--mode", "async"]
    for model in models:
        args += ["--model", model]
    completed = _clients(*args)
    assert completed.returncode == 0, completed.stderr
    result = json.loads(completed.stdout)
    scores = {score["name"]: score for score in result["scores"]}
    assert list(scores) == models and result["rows"] == 6_000

    rows = read_batch(labeled_file)
    for family in FAMILIES:
        in_process = OnnxReference(_onnx(exported_repository, family)).predict(rows)
        assert abs(scores[family]["auc"] - roc_auc(rows.labels, in_process)) <= 1e-4  # type: ignore[arg-type]
        assert abs(scores[f"{family}_fp16"]["auc"] - scores[family]["auc"]) <= 1e-3
    assert abs(result["reference"]["auc"] - scores["dlrm_onnx"]["auc"]) <= 1e-4
    assert scores["dlrm_onnx"]["max_abs_diff"] <= 1e-6


def test_infer_cli_writes_every_row_in_input_order(
    exported_server: LocalServer, big_file: Path, expected: dict[str, np.ndarray], tmp_path: Path
) -> None:
    out = tmp_path / "out" / "p.csv"
    completed = _clients(
        "infer", "--model", "wide_deep_onnx", "--input", str(big_file), "--output", str(out),
        "--protocol", "http", "--url", exported_server.http_url, "--batch-size", str(BATCH),
        "--mode", "async", "--max-in-flight", "3", "--shared-memory", "system",
    )  # fmt: skip
    assert completed.returncode == 0, completed.stderr
    assert completed.stdout.startswith(f"wrote {ROWS} probabilities to {out}")
    np.testing.assert_allclose(_read_csv(out), expected["wide_deep_onnx"].ravel(), rtol=0, atol=1e-6)


def test_cli_errors_are_one_line_without_traceback(
    exported_server: LocalServer, big_file: Path, tmp_path: Path
) -> None:
    malformed = tmp_path / "malformed.tsv"
    lines = big_file.read_text().splitlines(keepends=True)
    malformed.write_text("".join(lines[:1500]) + "1\t2\t3\n" + "".join(lines[1500:1600]))
    (down_port,) = free_ports(1)
    grpc_url = exported_server.grpc_url
    out = tmp_path / "never.csv"
    cases = [
        (
            ["--url", f"127.0.0.1:{down_port}", "--tries", "2", "--model", "dlrm_onnx"],
            f"error: cannot reach tritonserver at 127.0.0.1:{down_port} over grpc (connection refused)",
        ),
        (
            ["--url", grpc_url, "--model", "no_such_model"],
            f"error: unknown model 'no_such_model' at grpc://{grpc_url}; "
            "the server has: criteo_rows, dlrm_onnx, ",
        ),
        (
            ["--url", grpc_url, "--model", "dlrm_onnx", "--input", str(malformed)],
            f"error: {malformed}:1501: expected 40 tab-separated fields, got 3",
        ),
    ]
    for args, message in cases:
        if "--input" not in args:
            args = [*args, "--input", str(big_file)]
        completed = _clients("infer", *args, "--output", str(out))
        assert completed.returncode == 1, completed
        assert completed.stderr.splitlines() == [completed.stderr.strip()], completed.stderr
        assert completed.stderr.startswith(message), completed.stderr
        assert "Traceback" not in completed.stderr and completed.stdout == ""
        assert not out.exists() and list(tmp_path.glob("*.partial")) == []


def test_health_metadata_and_stats_commands(exported_server: LocalServer) -> None:
    runner = CliRunner()
    for protocol in ("http", "grpc"):
        url = _url(exported_server, protocol)
        health = runner.invoke(app, ["health", "-p", protocol, "-u", url, "--model", "dlrm_onnx"])
        assert health.exit_code == 0, health.output
        assert f"tritonserver at {protocol}://{url}: live, ready" in health.output
        assert re.search(r"^wide_deep_onnx_fp16 +1 +READY$", health.output, re.MULTILINE), health.output
        meta = runner.invoke(app, ["metadata", "-p", protocol, "-u", url, "--model", "dlrm_onnx"])
        assert meta.exit_code == 0, meta.output
        summary = json.loads(meta.output)
        assert summary["max_batch_size"] == 4096
        assert [t["name"] for t in summary["inputs"]] == [DENSE_INPUT, CATEGORICAL_INPUT]
        assert summary["inputs"][0]["shape"] == [-1, 13]
        stats = runner.invoke(app, ["stats", "-p", protocol, "-u", url, "--json"])
        assert stats.exit_code == 0, stats.output
        assert {entry["name"] for entry in json.loads(stats.output)} >= set(FAMILIES)


@pytest.fixture(scope="module")
def idle_server(start_triton, exported_repository: Path) -> Iterator[LocalServer]:  # type: ignore[no-untyped-def]
    """A server on the same repository with no model loaded (explicit mode): starts in a second."""
    server = start_triton(exported_repository, model_control_mode="explicit")
    yield server
    server.stop()


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_model_not_ready_is_named(idle_server: LocalServer, big_rows: Batch, protocol: str) -> None:
    url = _url(idle_server, protocol)
    for validate in (True, False):
        client = TritonClient(url, protocol, validate=validate)  # type: ignore[arg-type]
        with (
            client,
            pytest.raises(ClientError, match=rf"model 'dlrm_onnx' at {protocol}://{url} is not ready"),
        ):
            client.infer("dlrm_onnx", big_rows.slice(0, 2).inputs())
    result = CliRunner().invoke(app, ["health", "-p", protocol, "-u", url, "--model", "dlrm_onnx"])
    assert result.exit_code == 1 and "not ready" in str(result.exception)
