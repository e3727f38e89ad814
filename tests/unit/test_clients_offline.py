"""clients/ without a tritonserver: options, retries, validation, ordering, shared memory, output."""

from __future__ import annotations

import asyncio
import random
import socket
import threading
import time
from concurrent import futures
from pathlib import Path

import grpc
import numpy as np
import pytest
from aiohttp import ServerDisconnectedError
from geventhttpclient.response import HTTPConnectionClosed
from tritonclient.utils import InferenceServerException

from bundle.errors import ClientError, ConfigError, DataError
from bundle.schema import CATEGORICAL_INPUT, DENSE_INPUT, NUM_CATEGORICAL, NUM_DENSE, OUTPUT
from clients import failures, retry
from clients.batching import file_batches, ordered
from clients.options import ClientOptions, default_url
from clients.predict import PredictOptions, ProbabilityWriter
from clients.retry import RetryPolicy
from clients.shm import SystemRegion, layout, mapped_regions
from clients.triton import TritonClient
from clients.validation import ModelSpec
from criteo.synth import SynthConfig, write_tsv
from criteo.tsv import Batch

FAST = RetryPolicy(max_tries=4, initial_backoff_s=0.0, max_backoff_s=0.0, jitter=0.0)

# What tritonserver answers for model metadata and config, over HTTP and over gRPC (as_json=True).
HTTP_METADATA = {
    "name": "dlrm_onnx",
    "versions": ["1"],
    "platform": "onnxruntime_onnx",
    "inputs": [
        {"name": DENSE_INPUT, "datatype": "FP32", "shape": [-1, NUM_DENSE]},
        {"name": CATEGORICAL_INPUT, "datatype": "INT64", "shape": [-1, NUM_CATEGORICAL]},
    ],
    "outputs": [{"name": OUTPUT, "datatype": "FP32", "shape": [-1, 1]}],
}
HTTP_CONFIG = {"name": "dlrm_onnx", "max_batch_size": 4096}
GRPC_METADATA = {
    **HTTP_METADATA,
    "inputs": [
        {"name": DENSE_INPUT, "datatype": "FP32", "shape": ["-1", str(NUM_DENSE)]},
        {"name": CATEGORICAL_INPUT, "datatype": "INT64", "shape": ["-1", str(NUM_CATEGORICAL)]},
    ],
    "outputs": [{"name": OUTPUT, "datatype": "FP32", "shape": ["-1", "1"]}],
}
GRPC_CONFIG = {"config": {"name": "dlrm_onnx", "max_batch_size": 4096}}


def _inputs(rows: int) -> dict[str, np.ndarray]:
    return {
        DENSE_INPUT: np.zeros((rows, NUM_DENSE), np.float32),
        CATEGORICAL_INPUT: np.zeros((rows, NUM_CATEGORICAL), np.int64),
    }


def _grpc_error(code: str) -> InferenceServerException:
    return InferenceServerException(msg=f"{code} happened", status=f"StatusCode.{code}")


# ---------------------------------------------------------------- options
@pytest.mark.parametrize(
    "changes",
    [
        {"url": "http://127.0.0.1:8000"},
        {"url": "127.0.0.1"},
        {"url": "127.0.0.1:0"},
        {"protocol": "tcp"},
        {"timeout_s": 0},
        {"shared_memory": "gpu"},
    ],
)
def test_client_options_reject_bad_values(changes: dict[str, object]) -> None:
    options = {"url": "127.0.0.1:8001", **changes}
    with pytest.raises(ConfigError):
        ClientOptions(**options)  # type: ignore[arg-type]


def test_default_urls_and_endpoint() -> None:
    assert default_url("http") == "127.0.0.1:8000" and default_url("grpc") == "127.0.0.1:8001"
    assert ClientOptions("localhost:9001", "http").endpoint == "http://localhost:9001"


def test_cuda_shared_memory_is_one_clear_error() -> None:
    with pytest.raises(ClientError, match="CUDA shared memory needs the gpu profile and a GPU"):
        TritonClient("127.0.0.1:8001", "grpc", shared_memory="cuda")


@pytest.mark.parametrize(
    "changes", [{"batch_size": 0}, {"mode": "threads"}, {"max_in_flight": 0}, {"max_rows": 0}]
)
def test_predict_options_reject_bad_values(changes: dict[str, object]) -> None:
    with pytest.raises(ConfigError):
        PredictOptions(**changes)  # type: ignore[arg-type]


# ---------------------------------------------------------------- retries
def test_backoff_grows_exponentially_up_to_the_cap() -> None:
    policy = RetryPolicy(max_tries=6, initial_backoff_s=0.1, max_backoff_s=0.5, multiplier=2.0)
    assert [policy.backoff_s(n) for n in range(1, 6)] == pytest.approx([0.1, 0.2, 0.4, 0.5, 0.5])
    for bad in ({"max_tries": 0}, {"initial_backoff_s": 1.0, "max_backoff_s": 0.5}, {"jitter": 2.0}):
        with pytest.raises(ConfigError):
            RetryPolicy(**bad)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("error", "retried"),
    [
        (_grpc_error("UNAVAILABLE"), True),
        (InferenceServerException(msg="overloaded", status="503"), True),
        (ConnectionRefusedError(111, "Connection refused"), True),
        (ConnectionResetError(104, "Connection reset by peer"), True),
        (BrokenPipeError(32, "Broken pipe"), True),
        (HTTPConnectionClosed("connection closed."), True),
        (ServerDisconnectedError(), True),
        (_grpc_error("INVALID_ARGUMENT"), False),
        (_grpc_error("NOT_FOUND"), False),
        (_grpc_error("DEADLINE_EXCEEDED"), False),
        (InferenceServerException(msg="bad shape", status="400"), False),
    ],
)
def test_only_unavailable_is_retried(error: Exception, retried: bool) -> None:
    calls = []

    def flaky() -> str:
        calls.append(1)
        if len(calls) < 3:
            raise error
        return "answer"

    if retried:
        assert retry.call(flaky, FAST) == "answer" and len(calls) == 3
    else:
        with pytest.raises(type(error)):
            retry.call(flaky, FAST)
        assert len(calls) == 1


def test_retries_stop_after_max_tries_and_async_agrees() -> None:
    calls = []

    def down() -> None:
        calls.append(1)
        raise _grpc_error("UNAVAILABLE")

    with pytest.raises(InferenceServerException):
        retry.call(down, FAST)
    assert len(calls) == FAST.max_tries

    async def adown() -> None:
        calls.append(1)
        raise _grpc_error("UNAVAILABLE")

    calls.clear()
    with pytest.raises(InferenceServerException):
        asyncio.run(retry.acall(adown, FAST))
    assert len(calls) == FAST.max_tries


def test_unreachable_server_message() -> None:
    refused = InferenceServerException(
        msg="failed to connect to all addresses; last error: UNKNOWN: ipv4:127.0.0.1:1: "
        "Failed to connect to remote host: Connection refused",
        status="StatusCode.UNAVAILABLE",
    )
    assert str(failures.client_error("127.0.0.1:1", "grpc", "model 'm'", refused)) == (
        "cannot reach tritonserver at 127.0.0.1:1 over grpc (connection refused)"
    )
    http = failures.client_error("127.0.0.1:1", "http", "x", ConnectionRefusedError(111, "refused"))
    assert str(http) == "cannot reach tritonserver at 127.0.0.1:1 over http (connection refused)"
    invalid = InferenceServerException(msg="[request id: <id_unknown>] unexpected shape", status="400")
    assert str(failures.client_error("h:1", "http", "model 'm'", invalid)) == (
        "model 'm' at http://h:1: unexpected shape"
    )


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def test_grpc_retries_reach_a_server_that_comes_up_during_the_backoff() -> None:
    """gRPC's own reconnect backoff (1 s) would hide a server that starts 0.15 s later."""
    port = _free_port()
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=1))
    server.add_insecure_port(f"127.0.0.1:{port}")  # no Triton services: answers UNIMPLEMENTED
    starter = threading.Timer(0.15, server.start)
    starter.start()
    policy = RetryPolicy(max_tries=8, initial_backoff_s=0.05, max_backoff_s=0.1, jitter=0.0)
    try:
        with TritonClient(f"127.0.0.1:{port}", "grpc", retry=policy) as client:
            started = time.monotonic()
            with pytest.raises(ClientError, match=r"server live at grpc://.*: Method not found"):
                client.server_live()
            assert time.monotonic() - started < 0.8
    finally:
        starter.join()
        server.stop(None)


# ------------------------------------------------------------- validation
@pytest.mark.parametrize(("metadata", "config"), [(HTTP_METADATA, HTTP_CONFIG), (GRPC_METADATA, GRPC_CONFIG)])
def test_model_spec_reads_both_protocols(metadata: dict[str, object], config: dict[str, object]) -> None:
    spec = ModelSpec.from_server(metadata, config)
    assert spec.max_batch_size == 4096 and spec.version == "1"
    assert [t.name for t in spec.inputs] == [DENSE_INPUT, CATEGORICAL_INPUT]
    assert spec.inputs[0].shape == (-1, NUM_DENSE) and spec.output().shape == (-1, 1)
    pairs, rows = spec.validate(_inputs(3))
    assert rows == 3 and [t.name for t, _ in pairs] == [DENSE_INPUT, CATEGORICAL_INPUT]


@pytest.mark.parametrize(
    ("inputs", "message"),
    [
        (
            {DENSE_INPUT: np.zeros((2, 5), np.float32)},
            r"input 'dense_features' has shape \[2, 5\], expected \[-1, 13\]",
        ),
        (
            {DENSE_INPUT: np.zeros((2, 13), np.float64)},
            "input 'dense_features' has dtype float64, expected FP32",
        ),
        (
            {CATEGORICAL_INPUT: np.zeros((2, 26), np.int32)},
            "input 'categorical_ids' has dtype int32, expected INT64",
        ),
        (
            {DENSE_INPUT: np.zeros((13,), np.float32)},
            r"input 'dense_features' has shape \[13\], expected \[-1, 13\]",
        ),
        ({CATEGORICAL_INPUT: np.zeros((3, 26), np.int64)}, "inputs disagree on the batch size"),
        ({"extra": np.zeros((2, 1), np.float32)}, "unexpected input 'extra'"),
        ({DENSE_INPUT: None}, "input 'dense_features' is missing"),
    ],
)
def test_validation_names_what_is_wrong(inputs: dict[str, np.ndarray | None], message: str) -> None:
    spec = ModelSpec.from_server(HTTP_METADATA, HTTP_CONFIG)
    request = {**_inputs(2), **inputs}
    request = {name: value for name, value in request.items() if value is not None}
    with pytest.raises(ClientError, match=f"model 'dlrm_onnx': {message}"):
        spec.validate(request)  # type: ignore[arg-type]


def test_validation_enforces_max_batch_size() -> None:
    spec = ModelSpec.from_server(HTTP_METADATA, {"max_batch_size": 8})
    assert spec.validate(_inputs(8))[1] == 8
    with pytest.raises(ClientError, match="batch of 9 rows exceeds its max_batch_size 8"):
        spec.validate(_inputs(9))


@pytest.mark.parametrize("value", [np.nan, np.inf, -np.inf])
def test_validation_refuses_non_finite_values_like_the_backend(value: float) -> None:
    """The NGC C++ backend would answer NaN; the client gives the local backend's one line."""
    spec = ModelSpec.from_server(HTTP_METADATA, HTTP_CONFIG)
    inputs = _inputs(4)
    inputs[DENSE_INPUT][2, 5] = value
    inputs[DENSE_INPUT][3, 0] = value
    expected = (
        r"input 'dense_features' holds 2 non-finite value\(s\) \(NaN or Inf\), "
        rf"the first {value} at index \[2, 5\]"
    )
    with pytest.raises(ClientError, match=f"model 'dlrm_onnx': {expected}.*allow_non_finite_inputs"):
        spec.validate(inputs)


@pytest.mark.parametrize(
    "config",
    [
        {**HTTP_CONFIG, "parameters": {"allow_non_finite_inputs": {"string_value": "TRUE"}}},
        {"config": {**HTTP_CONFIG, "parameters": {"allow_non_finite_inputs": {"string_value": "true"}}}},
    ],
)
def test_a_model_that_allows_non_finite_inputs_gets_them(config: dict[str, object]) -> None:
    spec = ModelSpec.from_server(HTTP_METADATA, config)
    assert spec.allow_non_finite
    inputs = _inputs(2)
    inputs[DENSE_INPUT][0, 0] = np.nan
    assert spec.validate(inputs)[1] == 2
    refused = {**HTTP_CONFIG, "parameters": {"allow_non_finite_inputs": {"string_value": "false"}}}
    assert not ModelSpec.from_server(HTTP_METADATA, refused).allow_non_finite


# ------------------------------------------------- streaming and ordering
def test_file_batches_stream_a_file_larger_than_one_batch(tmp_path: Path) -> None:
    path = tmp_path / "rows.tsv"
    write_tsv(SynthConfig(rows=2_500, seed=5), path)
    assert [len(b) for b in file_batches(path, 1024)] == [1024, 1024, 452]
    assert [len(b) for b in file_batches(path, 1024, max_rows=1500)] == [1024, 476]
    bad = tmp_path / "bad.tsv"
    bad.write_text(path.read_text().splitlines(keepends=True)[0] + "1\t2\n")
    with pytest.raises(DataError, match=r"bad\.tsv:2: "):
        list(file_batches(bad, 1024))


def test_ordered_keeps_input_order_and_bounds_calls_in_flight() -> None:
    in_flight = peak = 0
    rng = random.Random(3)

    async def call(item: int) -> int:
        nonlocal in_flight, peak
        in_flight += 1
        peak = max(peak, in_flight)
        await asyncio.sleep(rng.random() * 0.005)
        in_flight -= 1
        return item * 10

    async def collect() -> list[tuple[int, int]]:
        return [pair async for pair in ordered(range(40), call, max_in_flight=4)]

    assert asyncio.run(collect()) == [(i, i * 10) for i in range(40)]
    assert peak == 4


def test_ordered_raises_the_first_failure_and_cancels_the_rest() -> None:
    cancelled = []

    async def call(item: int) -> int:
        try:
            if item == 0:
                await asyncio.sleep(0.01)
                raise ClientError("item 0 failed")
            await asyncio.sleep(1.0)
            return item
        except asyncio.CancelledError:
            cancelled.append(item)
            raise

    async def collect() -> None:
        async for _ in ordered(range(10), call, max_in_flight=4):
            pass

    started = time.monotonic()
    with pytest.raises(ClientError, match="item 0 failed"):
        asyncio.run(collect())
    assert time.monotonic() - started < 0.9
    assert sorted(cancelled) == [1, 2, 3]


# ----------------------------------------------------------- shared memory
def test_system_region_round_trip_and_destroy() -> None:
    spec = ModelSpec.from_server(HTTP_METADATA, HTTP_CONFIG)
    pairs, rows = spec.validate(
        {
            DENSE_INPUT: np.arange(3 * NUM_DENSE, dtype=np.float32).reshape(3, NUM_DENSE),
            CATEGORICAL_INPUT: np.arange(3 * NUM_CATEGORICAL, dtype=np.int64).reshape(3, NUM_CATEGORICAL),
        }
    )
    slices = layout([(t, a.shape) for t, a in pairs], spec.output(), rows)
    assert [s.offset for s in slices] == [0, 3 * 13 * 4, 3 * 13 * 4 + 3 * 26 * 8]
    region = SystemRegion(slices[-1].offset + slices[-1].nbytes)
    try:
        for (_, array), where in zip(pairs, slices, strict=False):
            region.write(array, where.offset)
        back = region.read(np.dtype(np.int64), (3, NUM_CATEGORICAL), slices[1].offset)
        np.testing.assert_array_equal(back, pairs[1][1])
        assert region.key in mapped_regions()
    finally:
        region.destroy()
    assert region.destroyed and region.key not in mapped_regions()
    assert not Path("/dev/shm", region.name).exists()


# ------------------------------------------------------------------ output
def test_probability_writer_writes_atomically(tmp_path: Path) -> None:
    batch = Batch(np.zeros((2, NUM_DENSE), np.float32), np.zeros((2, NUM_CATEGORICAL), np.int64), None)
    out = tmp_path / "p.csv"
    with ProbabilityWriter(out) as writer:
        writer(batch, np.array([[0.25], [0.123456789]], np.float32))
    assert out.read_text().splitlines() == [OUTPUT, "0.25", "0.123456791"]
    failed = tmp_path / "failed.csv"
    with pytest.raises(ClientError), ProbabilityWriter(failed) as writer:
        writer(batch, np.array([[0.5], [0.5]], np.float32))
        raise ClientError("server went away")
    assert list(tmp_path.iterdir()) == [out]


def test_a_timeout_is_not_called_unreachable() -> None:
    error = failures.client_error("h:1", "grpc", "model 'm'", _grpc_error("DEADLINE_EXCEEDED"))
    assert str(error) == "model 'm': no answer from tritonserver at h:1 over grpc within the timeout"
    assert not failures.is_unavailable(TimeoutError())


def test_a_restricted_api_refusal_is_final_not_retried() -> None:
    from tritonclient.utils import InferenceServerException

    from clients.failures import is_restricted, is_unavailable

    refused = InferenceServerException(
        "This protocol is restricted, expecting header 'triton-grpc-protocol-admin-key'",
        status="StatusCode.UNAVAILABLE",
    )
    assert is_restricted(refused) and not is_unavailable(refused)
    assert is_restricted(InferenceServerException("forbidden", status="403"))
    down = InferenceServerException("failed to connect", status="StatusCode.UNAVAILABLE")
    assert is_unavailable(down) and not is_restricted(down)


def test_an_empty_or_malformed_output_is_one_client_error() -> None:
    """An answer whose binary output is empty (seen with numpy 2 in a python-backend stub) made
    tritonclient's as_numpy raise a bare reshape ValueError; it is one ClientError line."""
    from clients.request import Prepared, decode
    from clients.validation import TensorMeta

    class EmptyAnswer:
        def as_numpy(self, name: str) -> np.ndarray:
            raise ValueError("cannot reshape array of size 0 into shape (1024,1)")

    prepared = Prepared("dlrm_onnx", "", [], [], 1024, TensorMeta(OUTPUT, "FP32", (-1, 1)))
    with pytest.raises(
        ClientError, match=r"output 'click_probability' came back malformed or empty .*numpy<2"
    ):
        decode(prepared, EmptyAnswer())


def test_repository_models_lists_only_models_that_take_the_schema(tmp_path: Path) -> None:
    """A hot/cold model's dense part takes hot_slots/cold rows and its stage takes only ids:
    verify and the soak send the schema's two inputs, so they list neither."""
    from clients.verify import repository_models

    def model(name: str, inputs: list[str]) -> None:
        (tmp_path / name / "1").mkdir(parents=True)
        (tmp_path / name / "1" / "model.onnx").write_bytes(b"")
        text = "".join(f'input {{ name: "{i}" data_type: TYPE_FP32 dims: [ 1 ] }}\n' for i in inputs)
        (tmp_path / name / "config.pbtxt").write_text(f'name: "{name}"\n{text}')

    model("dlrm_onnx_fp16", [DENSE_INPUT, CATEGORICAL_INPUT])
    model("dlrm_dense", [DENSE_INPUT, "hot_slots", "cold_positions", "cold_rows"])
    model("dlrm_embedding", [CATEGORICAL_INPUT])
    assert repository_models(tmp_path) == ["dlrm_onnx_fp16"]


def test_a_model_being_reloaded_is_retried_and_an_unknown_one_is_not() -> None:
    from tritonclient.utils import InferenceServerException

    from clients.failures import is_model_reloading, is_unavailable

    reloading = InferenceServerException(
        "Request for unknown model: 'dlrm_onnx' has no available versions", status="StatusCode.NOT_FOUND"
    )
    dead = InferenceServerException("Stub process 'dlrm_onnx_0_0' is not healthy.", status="500")
    unknown = InferenceServerException("Request for unknown model: 'nope' is not found", status="404")
    broken = InferenceServerException("Failed to process the request", status="StatusCode.INTERNAL")
    assert is_model_reloading(reloading) and is_unavailable(reloading)
    assert is_model_reloading(dead) and is_unavailable(dead)
    assert not is_unavailable(unknown) and not is_unavailable(broken)
