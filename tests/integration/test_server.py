"""The local server end to end: the real tritonserver with our onnxruntime backend.

Tiny ONNX models built with onnx.helper stand in for the CTR models; every
answer is compared with ONNX Runtime run in this process.
"""

from __future__ import annotations

import contextlib
import functools
import os
import queue
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import onnxruntime as ort
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from google.protobuf import text_format
from onnx import TensorProto, helper, numpy_helper
from tritonclient.grpc import model_config_pb2
from tritonclient.utils import InferenceServerException

from bundle.errors import ConfigError, ServerError
from server import LocalServer, ServerConfig, free_ports

pytestmark = pytest.mark.integration

StartTriton = Callable[..., LocalServer]  # the start_triton fixture of conftest.py

PROJECT_ROOT = Path(__file__).resolve().parents[2]

# The tensor contract of these test models (13 dense, 26 categorical, like Criteo).
DENSE, CATEGORICAL, OUTPUT = "dense_features", "categorical_ids", "click_probability"
NUM_DENSE, NUM_CATEGORICAL = 13, 26
# Opset of the test graphs: old enough for any ONNX Runtime this bundle pins.
OPSET = 17
GATHER_TABLE_ROWS = 10

CTR_MODEL = "tiny_ctr"  # sigmoid(dense @ w + 0.01 * sum(ids mod 7)), batched
UNBATCHED_MODEL = "tiny_ctr_unbatched"  # the same graph with max_batch_size 0
GATHER_MODEL = "tiny_gather"  # reads table[ids]: an id >= 10 makes ONNX Runtime fail
MAX_BATCH_SIZE = 64
TOLERANCE = 1e-6


# ------------------------------------------------------------------ models
def _ctr_graph(gather: bool) -> onnx.ModelProto:
    """``B x 13`` FP32 and ``B x 26`` INT64 in, ``B x 1`` FP32 click probability out."""
    rng = np.random.default_rng(0)
    initializers = [
        numpy_helper.from_array(rng.normal(0, 0.3, (NUM_DENSE, 1)).astype(np.float32), "w"),
        numpy_helper.from_array(np.array([1], dtype=np.int64), "axes"),
        numpy_helper.from_array(np.array(0.01, dtype=np.float32), "scale"),
    ]
    nodes = [helper.make_node("MatMul", [DENSE, "w"], ["dense_logit"])]
    if gather:
        table = rng.normal(0, 0.1, GATHER_TABLE_ROWS).astype(np.float32)
        initializers.append(numpy_helper.from_array(table, "table"))
        nodes.append(helper.make_node("Gather", ["table", CATEGORICAL], ["rows"], axis=0))
    else:
        initializers.append(numpy_helper.from_array(np.array(7, dtype=np.int64), "seven"))
        nodes += [
            helper.make_node("Mod", [CATEGORICAL, "seven"], ["buckets"]),
            helper.make_node("Cast", ["buckets"], ["rows"], to=TensorProto.FLOAT),
        ]
    nodes += [
        helper.make_node("ReduceSum", ["rows", "axes"], ["row_sum"], keepdims=1),
        helper.make_node("Mul", ["row_sum", "scale"], ["sparse_logit"]),
        helper.make_node("Add", ["dense_logit", "sparse_logit"], ["logit"]),
        helper.make_node("Sigmoid", ["logit"], [OUTPUT]),
    ]
    graph = helper.make_graph(
        nodes,
        "tiny_ctr",
        [
            helper.make_tensor_value_info(DENSE, TensorProto.FLOAT, ["batch", NUM_DENSE]),
            helper.make_tensor_value_info(CATEGORICAL, TensorProto.INT64, ["batch", NUM_CATEGORICAL]),
        ],
        [helper.make_tensor_value_info(OUTPUT, TensorProto.FLOAT, ["batch", 1])],
        initializers,
    )
    opset = helper.make_opsetid("", OPSET)
    # onnx writes its newest IR version by default, which ONNX Runtime may not
    # read yet; the oldest IR version that carries this opset is enough.
    model = helper.make_model(
        graph, opset_imports=[opset], ir_version=helper.find_min_ir_version_for([opset])
    )
    onnx.checker.check_model(model)
    return model


def _write_model(
    repository: Path,
    name: str,
    model: bytes | None,
    max_batch_size: int = MAX_BATCH_SIZE,
    max_queue_delay_us: int = 10_000,
) -> None:
    """Write ``<repository>/<name>/config.pbtxt`` and ``1/model.onnx`` (if given)."""
    batch_dims = [] if max_batch_size > 0 else [-1]
    config = model_config_pb2.ModelConfig(name=name, backend="onnxruntime", max_batch_size=max_batch_size)
    config.input.add(name=DENSE, data_type=model_config_pb2.TYPE_FP32, dims=[*batch_dims, NUM_DENSE])
    config.input.add(
        name=CATEGORICAL, data_type=model_config_pb2.TYPE_INT64, dims=[*batch_dims, NUM_CATEGORICAL]
    )
    config.output.add(name=OUTPUT, data_type=model_config_pb2.TYPE_FP32, dims=[*batch_dims, 1])
    if max_batch_size > 0:
        config.dynamic_batching.max_queue_delay_microseconds = max_queue_delay_us
    config.instance_group.add(kind=model_config_pb2.ModelInstanceGroup.KIND_CPU, count=1)
    config.parameters["intra_op_thread_count"].string_value = "1"
    version_dir = repository / name / "1"
    version_dir.mkdir(parents=True)
    (repository / name / "config.pbtxt").write_text(text_format.MessageToString(config))
    if model is not None:
        (version_dir / "model.onnx").write_bytes(model)


def _batch(size: int, seed: int, ids: tuple[int, int] = (-(10**12), 10**12)) -> dict[str, np.ndarray]:
    """``size`` random rows; categorical ids drawn from ``[ids[0], ids[1])``."""
    rng = np.random.default_rng(seed)
    return {
        DENSE: rng.normal(0, 1, (size, NUM_DENSE)).astype(np.float32),
        CATEGORICAL: rng.integers(*ids, (size, NUM_CATEGORICAL), dtype=np.int64),
    }


def _http_inputs(batch: dict[str, np.ndarray]) -> list[httpclient.InferInput]:
    inputs = []
    for name, array in batch.items():
        tensor = httpclient.InferInput(name, list(array.shape), _triton_type(array))
        tensor.set_data_from_numpy(array)
        inputs.append(tensor)
    return inputs


def _grpc_inputs(batch: dict[str, np.ndarray]) -> list[grpcclient.InferInput]:
    inputs = []
    for name, array in batch.items():
        tensor = grpcclient.InferInput(name, list(array.shape), _triton_type(array))
        tensor.set_data_from_numpy(array)
        inputs.append(tensor)
    return inputs


def _triton_type(array: np.ndarray) -> str:
    return {"float32": "FP32", "float64": "FP64", "int64": "INT64", "int32": "INT32"}[array.dtype.name]


# ---------------------------------------------------------------- fixtures
@pytest.fixture(scope="module")
def onnx_models() -> dict[str, bytes]:
    return {
        CTR_MODEL: _ctr_graph(gather=False).SerializeToString(),
        GATHER_MODEL: _ctr_graph(gather=True).SerializeToString(),
    }


@pytest.fixture(scope="module")
def repository(tmp_path_factory: pytest.TempPathFactory, onnx_models: dict[str, bytes]) -> Path:
    root = tmp_path_factory.mktemp("repository")
    _write_model(root, CTR_MODEL, onnx_models[CTR_MODEL])
    _write_model(root, UNBATCHED_MODEL, onnx_models[CTR_MODEL], max_batch_size=0)
    # A long queue delay makes concurrent requests share one batch for sure.
    _write_model(root, GATHER_MODEL, onnx_models[GATHER_MODEL], max_queue_delay_us=200_000)
    return root


@pytest.fixture(scope="module")
def server(start_triton: StartTriton, repository: Path) -> Iterator[LocalServer]:
    server = start_triton(repository)
    yield server
    server.stop()


@pytest.fixture(scope="module")
def reference(onnx_models: dict[str, bytes]) -> dict[str, ort.InferenceSession]:
    """ONNX Runtime in this process, the expected answers."""
    return {
        name: ort.InferenceSession(model, providers=["CPUExecutionProvider"])
        for name, model in onnx_models.items()
    }


def _expected(session: ort.InferenceSession, batch: dict[str, np.ndarray]) -> np.ndarray:
    (output,) = session.run([OUTPUT], batch)
    return np.asarray(output)


def _inference_counts(server: LocalServer, model: str) -> tuple[int, int]:
    """(inference_count, execution_count) of ``model`` so far."""
    client = httpclient.InferenceServerClient(server.http_url)
    try:
        (stats,) = client.get_inference_statistics(model)["model_stats"]
    finally:
        client.close()
    return int(stats["inference_count"]), int(stats["execution_count"])


# ------------------------------------------------------------------- tests
def test_server_reports_every_model_ready(server: LocalServer) -> None:
    states = {model.name: model.state for model in server.models()}
    assert states == {CTR_MODEL: "READY", UNBATCHED_MODEL: "READY", GATHER_MODEL: "READY"}
    assert server.running and server.pid is not None
    assert server.http_url == f"127.0.0.1:{server.config.http_port}"


def test_http_matches_onnxruntime(server: LocalServer, reference: dict[str, ort.InferenceSession]) -> None:
    batch = _batch(5, seed=1)
    client = httpclient.InferenceServerClient(server.http_url)
    try:
        result = client.infer(CTR_MODEL, _http_inputs(batch))
    finally:
        client.close()
    answer = result.as_numpy(OUTPUT)
    assert answer.shape == (5, 1) and answer.dtype == np.float32
    assert np.abs(answer - _expected(reference[CTR_MODEL], batch)).max() <= TOLERANCE


def test_grpc_matches_onnxruntime(server: LocalServer, reference: dict[str, ort.InferenceSession]) -> None:
    batch = _batch(MAX_BATCH_SIZE, seed=2)
    with grpcclient.InferenceServerClient(server.grpc_url) as client:
        answer = client.infer(CTR_MODEL, _grpc_inputs(batch)).as_numpy(OUTPUT)
    assert answer.shape == (MAX_BATCH_SIZE, 1)
    assert np.abs(answer - _expected(reference[CTR_MODEL], batch)).max() <= TOLERANCE


def test_model_without_batching_is_served(
    server: LocalServer, reference: dict[str, ort.InferenceSession]
) -> None:
    batch = _batch(3, seed=3)
    with grpcclient.InferenceServerClient(server.grpc_url) as client:
        answer = client.infer(UNBATCHED_MODEL, _grpc_inputs(batch)).as_numpy(OUTPUT)
    assert np.abs(answer - _expected(reference[CTR_MODEL], batch)).max() <= TOLERANCE


def _infer_concurrently(server: LocalServer, model: str, batches: list[dict[str, np.ndarray]]) -> list[Any]:
    """Send every batch at once over gRPC; each answer's output, or its exception.

    gRPC async requests leave together, so the dynamic batcher sees them
    together (tritonclient.http's async requests leave one by one without a
    gevent-patched program).
    """
    outcomes: list[Any] = [None] * len(batches)
    answered = threading.Semaphore(0)

    def on_answer(index: int, result: Any, error: InferenceServerException | None) -> None:
        outcomes[index] = error if error is not None else result.as_numpy(OUTPUT)
        answered.release()

    with grpcclient.InferenceServerClient(server.grpc_url) as client:
        for index, batch in enumerate(batches):
            client.async_infer(model, _grpc_inputs(batch), functools.partial(on_answer, index))
        for _ in batches:
            assert answered.acquire(timeout=30), "a request got no answer"
    return outcomes


def test_concurrent_requests_are_batched_and_each_answered(
    server: LocalServer, reference: dict[str, ort.InferenceSession]
) -> None:
    sizes = list(range(1, 17))
    batches = [_batch(size, seed=100 + size) for size in sizes]
    inferences_before, executions_before = _inference_counts(server, CTR_MODEL)
    answers = _infer_concurrently(server, CTR_MODEL, batches)
    for batch, answer in zip(batches, answers, strict=True):
        expected = _expected(reference[CTR_MODEL], batch)
        assert isinstance(answer, np.ndarray), answer
        assert answer.shape == expected.shape
        assert np.abs(answer - expected).max() <= TOLERANCE
    inferences_after, executions_after = _inference_counts(server, CTR_MODEL)
    assert inferences_after - inferences_before == sum(sizes)
    # Fewer model executions than requests: the dynamic batcher merged them.
    assert executions_after - executions_before < len(batches)


@pytest.mark.parametrize(
    ("case", "message"),
    [
        ("wrong_dtype", "FP64"),
        ("wrong_shape", "shape"),
        ("missing_input", CATEGORICAL),
    ],
)
def test_bad_request_gets_an_error_and_server_keeps_serving(
    server: LocalServer, reference: dict[str, ort.InferenceSession], case: str, message: str
) -> None:
    batch = _batch(2, seed=4)
    if case == "wrong_dtype":
        bad = {**batch, DENSE: batch[DENSE].astype(np.float64)}
    elif case == "wrong_shape":
        bad = {**batch, DENSE: batch[DENSE][:, :-1]}
    else:
        bad = {DENSE: batch[DENSE]}
    client = httpclient.InferenceServerClient(server.http_url)
    try:
        with pytest.raises(InferenceServerException, match=message):
            client.infer(CTR_MODEL, _http_inputs(bad))
        assert client.is_server_ready()
        answer = client.infer(CTR_MODEL, _http_inputs(batch)).as_numpy(OUTPUT)
    finally:
        client.close()
    assert np.abs(answer - _expected(reference[CTR_MODEL], batch)).max() <= TOLERANCE


def test_failing_request_does_not_fail_the_others_in_its_batch(
    server: LocalServer, reference: dict[str, ort.InferenceSession]
) -> None:
    batches = [_batch(size, seed=200 + size, ids=(0, GATHER_TABLE_ROWS)) for size in (1, 2, 3, 4, 5)]
    bad_index = 2
    batches[bad_index][CATEGORICAL][0, 0] = 1000  # out of the table: ONNX Runtime raises
    _, executions_before = _inference_counts(server, GATHER_MODEL)
    outcomes = _infer_concurrently(server, GATHER_MODEL, batches)
    _, executions_after = _inference_counts(server, GATHER_MODEL)
    assert executions_after - executions_before < len(batches), "requests were not batched"
    for index, (batch, outcome) in enumerate(zip(batches, outcomes, strict=True)):
        if index == bad_index:
            assert isinstance(outcome, InferenceServerException)
            assert "onnxruntime failed" in str(outcome)
        else:
            assert isinstance(outcome, np.ndarray), outcome
            assert np.abs(outcome - _expected(reference[GATHER_MODEL], batch)).max() <= TOLERANCE


def test_taken_port_is_a_clear_server_error(repository: Path, tmp_path: Path) -> None:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        taken = holder.getsockname()[1]
        config = ServerConfig.with_free_ports(repository, log_file=tmp_path / "triton.log")
        server = LocalServer(config.replace(grpc_port=taken))
        try:
            with pytest.raises(ServerError, match=rf"grpc port {taken} on 127\.0\.0\.1 is already in use"):
                server.start()
        finally:
            server.stop()
        assert server.pid is None


def test_missing_repository_is_a_server_error(tmp_path: Path) -> None:
    server = LocalServer(ServerConfig.with_free_ports(tmp_path / "absent", log_file=tmp_path / "t.log"))
    with pytest.raises(ServerError, match="does not exist"):
        server.start()
    assert server.pid is None


def test_broken_models_fail_start_naming_each(tmp_path: Path, onnx_models: dict[str, bytes]) -> None:
    repository = tmp_path / "repository"
    _write_model(repository, CTR_MODEL, onnx_models[CTR_MODEL])
    _write_model(repository, "missing_file", None)
    _write_model(repository, "corrupt_file", b"this is not an onnx model")
    server = LocalServer(ServerConfig.with_free_ports(repository, log_file=tmp_path / "triton.log"))
    try:
        with pytest.raises(ServerError) as failure:
            server.start()
    finally:
        server.stop()
    message = str(failure.value)
    assert "2 models failed to load" in message
    assert re.search(
        r"'missing_file' version 1: .*model file .*missing_file/1/model\.onnx not found", message
    )
    assert re.search(r"'corrupt_file' version 1: .*onnxruntime could not load", message)
    assert "\n" not in message
    assert server.pid is not None and not server.running


def _read_lines(stream: Any, lines: queue.Queue[str]) -> None:
    for line in stream:
        lines.put(line)


def test_cli_serves_until_sigterm(repository: Path, tmp_path: Path) -> None:
    http_port, grpc_port, metrics_port = free_ports(3)
    command = [
        sys.executable,
        "-m",
        "server",
        "serve",
        "--repository",
        str(repository),
        "--http-port",
        str(http_port),
        "--grpc-port",
        str(grpc_port),
        "--metrics-port",
        str(metrics_port),
        "--log-file",
        str(tmp_path / "triton.log"),
    ]
    errors = tmp_path / "cli.err"
    with errors.open("w") as stderr:
        cli = subprocess.Popen(command, cwd=PROJECT_ROOT, stdout=subprocess.PIPE, stderr=stderr, text=True)
    assert cli.stdout is not None
    lines: queue.Queue[str] = queue.Queue()
    reader = threading.Thread(target=_read_lines, args=(cli.stdout, lines), daemon=True)
    reader.start()
    triton_pid: int | None = None
    try:
        output: list[str] = []
        deadline = time.monotonic() + 60
        while not output or not output[-1].startswith("stop with"):
            if time.monotonic() > deadline or (cli.poll() is not None and lines.empty()):
                pytest.fail(f"no summary from the CLI: {''.join(output)}{errors.read_text()}")
            with contextlib.suppress(queue.Empty):
                output.append(lines.get(timeout=0.2))
        text = "".join(output)
        found = re.search(r"ready \(pid (\d+)\)", text)
        assert found, text
        triton_pid = int(found.group(1))
        assert f"http     http://127.0.0.1:{http_port}" in text
        assert f"grpc     127.0.0.1:{grpc_port}" in text
        assert f"metrics  http://127.0.0.1:{metrics_port}/metrics" in text
        assert re.search(rf"{CTR_MODEL}\s+version 1\s+READY", text)
        with grpcclient.InferenceServerClient(f"127.0.0.1:{grpc_port}") as client:
            assert client.is_model_ready(CTR_MODEL)

        cli.send_signal(signal.SIGTERM)
        assert cli.wait(timeout=30) == 0, errors.read_text()
        with pytest.raises(ProcessLookupError):  # the CLI stopped and reaped tritonserver
            os.kill(triton_pid, 0)
    finally:
        if cli.poll() is None:  # the test failed before a clean stop
            if triton_pid is not None:  # still the CLI's child: the pid is tritonserver's
                with contextlib.suppress(ProcessLookupError):
                    os.kill(triton_pid, signal.SIGKILL)
            cli.kill()
            cli.wait()
        reader.join(timeout=5)
        cli.stdout.close()


def _child_arguments(pid: int) -> list[str]:
    """The command lines of ``pid``'s children, their arguments in one list."""
    arguments: list[str] = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        with contextlib.suppress(OSError):
            if int(stat.read_text().rsplit(")", 1)[1].split()[1]) == pid:
                arguments += (stat.parent / "cmdline").read_bytes().decode().split("\0")
    return arguments


def test_the_tritonserver_command_passes_its_arguments_through_and_adds_the_backends(
    repository: Path, tmp_path: Path
) -> None:
    """What Model Analyzer's --triton-server-path runs: tritonserver with the caller's own
    arguments, able to serve the bundle's CPU models, stopped by SIGTERM, leaving nothing."""
    http_port, grpc_port, metrics_port = free_ports(3)
    wrapper = PROJECT_ROOT / "benchmarks" / "model_analyzer" / "tritonserver"
    command = [
        str(wrapper), f"--model-repository={repository}", f"--http-port={http_port}",
        f"--grpc-port={grpc_port}", f"--metrics-port={metrics_port}", "--model-control-mode=explicit",
        f"--load-model={CTR_MODEL}",
    ]  # fmt: skip
    log = tmp_path / "tritonserver.log"
    with log.open("wb") as output:
        process = subprocess.Popen(command, cwd=tmp_path, stdout=output, stderr=subprocess.STDOUT,
                                   start_new_session=True)  # fmt: skip
    try:
        ready = False
        deadline = time.monotonic() + 90
        while not ready and time.monotonic() < deadline and process.poll() is None:
            with (
                contextlib.suppress(Exception),
                grpcclient.InferenceServerClient(f"127.0.0.1:{grpc_port}") as c,
            ):
                ready = c.is_model_ready(CTR_MODEL) and not c.is_model_ready(GATHER_MODEL)
            time.sleep(0.3)
        assert ready, log.read_text()[-3000:]
        backends = [
            a.split("=", 1)[1] for a in _child_arguments(process.pid) if a.startswith("--backend-directory=")
        ]
        assert len(backends) == 1 and Path(backends[0], "python").is_dir()

        process.send_signal(signal.SIGTERM)
        assert process.wait(timeout=60) == 0, log.read_text()[-3000:]
        assert not Path(backends[0]).exists()
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()


def test_a_server_given_cores_runs_on_them_with_its_backends(
    start_triton: StartTriton, repository: Path
) -> None:
    """``cpus`` (a sweep keeps its server off the load generator's cores) holds for
    tritonserver and the python stubs it starts, and the server answers."""
    cores = os.sched_getaffinity(0)
    chosen = frozenset({max(cores)})
    server = start_triton(repository, cpus=chosen)
    stubs = [int(p.parent.name) for p in Path("/proc").glob("[0-9]*/stat")
             if _parent_pid(p) == server.pid]  # fmt: skip
    assert stubs, "tritonserver started no backend process"
    for pid in [server.pid or 0, *stubs]:
        assert os.sched_getaffinity(pid) == chosen
    with grpcclient.InferenceServerClient(server.grpc_url) as client:
        assert client.is_model_ready(CTR_MODEL)


def test_server_cores_outside_this_process_are_refused_in_one_line(repository: Path) -> None:
    with pytest.raises(ConfigError, match=r"server cores \[100000\] are not among"):
        ServerConfig.with_free_ports(repository, cpus={100000})


def _parent_pid(stat: Path) -> int:
    with contextlib.suppress(OSError, IndexError, ValueError):
        return int(stat.read_text().rsplit(")", 1)[1].split()[1])
    return -1
