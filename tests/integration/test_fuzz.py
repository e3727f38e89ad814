"""Bad input against the real local tritonserver: one clear error each, and the server stays correct.

Each malformed request of the table reaches the server (tritonclient directly,
no client-side validation) and must get one error of its own kind, after which
the server is live, ready and answers a good request exactly. Then a seeded
fuzz sends a few hundred random malformed requests over raw HTTP and raw gRPC
and checks that every one got a 4xx / INVALID_ARGUMENT / NOT_FOUND answer (never
a 5xx, a dropped connection or a crash). Malformed TSV rows on the client side
get one DataError naming the file and line.

Behaviour pinned here (docs/reliability.md, "Bad input"):
- wrong dtype, shape or rank, a missing or unknown input, a batch over
  max_batch_size and an empty batch are refused by tritonserver itself
  (INVALID_ARGUMENT, HTTP 400);
- NaN or +-Inf in a float input is refused by the local onnxruntime backend
  (INVALID_ARGUMENT, naming input, row and column);
- an unknown model or version is NOT_FOUND (HTTP 404);
- any int64 id, negative or huge, is answered: the graph reduces it into its
  table, so the answer equals ONNX Runtime in process.
"""

from __future__ import annotations

import http.client
import json
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import grpc
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.grpc import service_pb2, service_pb2_grpc
from tritonclient.utils import InferenceServerException

from bundle.errors import DataError
from bundle.schema import CATEGORICAL_INPUT, DENSE_INPUT, NUM_CATEGORICAL, NUM_DENSE, OUTPUT
from clients.batching import file_batches
from clients.reference import OnnxReference
from clients.triton import TritonClient
from criteo.tsv import Batch, read_batch
from server import LocalServer

MODEL = "dlrm_onnx"
MAX_BATCH_SIZE = 4096  # the export's default, in the model's config
FUZZ_REQUESTS = 200  # per protocol
TOLERANCE = 1e-6

Arrays = dict[str, np.ndarray]


@pytest.fixture(scope="module")
def rows(labeled_file: Path) -> Batch:
    return read_batch(labeled_file, 64)


@pytest.fixture(scope="module")
def reference(exported_repository: Path) -> OnnxReference:
    return OnnxReference(exported_repository / MODEL / "1" / "model.onnx")


def _url(server: LocalServer, protocol: str) -> str:
    return server.http_url if protocol == "http" else server.grpc_url


def _triton_type(array: np.ndarray) -> str:
    return {"float32": "FP32", "float64": "FP64", "int64": "INT64", "int32": "INT32"}[array.dtype.name]


def _raw_infer(
    server: LocalServer, protocol: str, model: str, inputs: Arrays, version: str = ""
) -> np.ndarray:
    """One request through tritonclient itself: nothing checks it before the server does."""
    module: Any = httpclient if protocol == "http" else grpcclient
    tensors = []
    for name, array in inputs.items():
        tensor = module.InferInput(name, list(array.shape), _triton_type(array))
        tensor.set_data_from_numpy(array)
        tensors.append(tensor)
    client = module.InferenceServerClient(_url(server, protocol))
    try:
        return np.asarray(client.infer(model, tensors, model_version=version).as_numpy(OUTPUT))
    finally:
        client.close()


def _assert_live_ready_and_exact(server: LocalServer, rows: Batch, reference: OnnxReference) -> None:
    """The server answers health checks and a good request, over both protocols, exactly."""
    batch = rows.slice(0, 16)
    expected = reference.predict(batch)
    assert server.running
    for protocol in ("http", "grpc"):
        with TritonClient(_url(server, protocol), protocol) as client:  # type: ignore[arg-type]
            assert client.server_live() and client.server_ready()
            served = client.infer(MODEL, batch.inputs())
        np.testing.assert_allclose(served, expected, rtol=0, atol=TOLERANCE)


# ------------------------------------------------------------ bad input, one case at a time
def _with(rows: Batch, size: int = 4, **changes: np.ndarray) -> Arrays:
    inputs = rows.slice(0, size).inputs()
    inputs.update(changes)
    return inputs


def _non_finite(rows: Batch, value: float) -> Arrays:
    dense = rows.dense[:4].copy()
    dense[2, 5] = value
    return _with(rows, **{DENSE_INPUT: dense})


def _repeat(rows: Batch, size: int) -> Arrays:
    return {
        DENSE_INPUT: np.resize(rows.dense, (size, NUM_DENSE)),
        CATEGORICAL_INPUT: np.resize(rows.categorical, (size, NUM_CATEGORICAL)),
    }


# name -> (inputs from rows, model, version, expected message, HTTP status, gRPC code)
BAD_INPUT: dict[str, tuple[Callable[[Batch], Arrays], str, str, str, int, str]] = {
    "wrong_dtype": (
        lambda r: _with(r, **{DENSE_INPUT: r.dense[:4].astype(np.float64)}),
        MODEL, "", r"input 'dense_features' data-type is 'FP64', but model 'dlrm_onnx' expects 'FP32'", 400,
        "INVALID_ARGUMENT",
    ),
    "wrong_shape": (
        lambda r: _with(r, **{DENSE_INPUT: r.dense[:4, :12]}),
        MODEL, "", r"unexpected shape for input 'dense_features'.*Expected \[-1,13\], got \[4,12\]", 400,
        "INVALID_ARGUMENT",
    ),
    "wrong_rank": (
        lambda r: _with(r, **{CATEGORICAL_INPUT: r.categorical[:4, :, None]}),
        MODEL, "", r"unexpected shape for input 'categorical_ids'", 400, "INVALID_ARGUMENT",
    ),
    "wrong_id_dtype": (
        lambda r: _with(r, **{CATEGORICAL_INPUT: r.categorical[:4].astype(np.int32)}),
        MODEL, "", r"input 'categorical_ids' data-type is 'INT32', but model 'dlrm_onnx' expects 'INT64'",
        400, "INVALID_ARGUMENT",
    ),
    "batch_over_max": (
        lambda r: _repeat(r, MAX_BATCH_SIZE + 1),
        MODEL, "", rf"batch-size must be <= {MAX_BATCH_SIZE}", 400, "INVALID_ARGUMENT",
    ),
    # tritonserver's own wording for B = 0 speaks of byte sizes; the clients say "empty batch".
    "empty_batch": (
        lambda r: _repeat(r, 0), MODEL, "", r"input byte size mismatch", 400, "INVALID_ARGUMENT",
    ),
    "nan_count": (
        lambda r: _non_finite(r, np.nan),
        MODEL, "", r"input 'dense_features' holds 1 non-finite value\(s\).*nan at index \[2, 5\]", 400,
        "INVALID_ARGUMENT",
    ),
    "inf_count": (
        lambda r: _non_finite(r, np.inf),
        MODEL, "", r"holds 1 non-finite value\(s\).*inf at index \[2, 5\]", 400, "INVALID_ARGUMENT",
    ),
    "minus_inf_count": (
        lambda r: _non_finite(r, -np.inf),
        MODEL, "", r"holds 1 non-finite value\(s\).*-inf at index \[2, 5\]", 400, "INVALID_ARGUMENT",
    ),
    "missing_input": (
        lambda r: {DENSE_INPUT: r.dense[:4]},
        MODEL, "", r"missing required input\(s\) \['categorical_ids'\]|expected 2 inputs but got 1", 400,
        "INVALID_ARGUMENT",
    ),
    "unknown_input": (
        lambda r: _with(r, extra_features=r.dense[:4]),
        MODEL, "", r"expected 2 inputs but got 3 inputs .*'extra_features'", 400, "INVALID_ARGUMENT",
    ),
    "unknown_model": (
        lambda r: _with(r), "no_such_model", "", r"unknown model: 'no_such_model'", 404, "NOT_FOUND",
    ),
    "unknown_version": (
        lambda r: _with(r), MODEL, "7", r"'dlrm_onnx' version 7 is not found", 404, "NOT_FOUND",
    ),
}  # fmt: skip


@pytest.mark.integration
@pytest.mark.parametrize("protocol", ["http", "grpc"])
@pytest.mark.parametrize("case", list(BAD_INPUT))
def test_bad_input_gets_one_clear_error_and_the_server_stays_correct(
    exported_server: LocalServer, rows: Batch, reference: OnnxReference, protocol: str, case: str
) -> None:
    build, model, version, message, http_status, grpc_code = BAD_INPUT[case]
    with pytest.raises(InferenceServerException, match=message) as failure:
        _raw_infer(exported_server, protocol, model, build(rows), version)
    status = str(failure.value.status())
    assert status == (str(http_status) if protocol == "http" else f"StatusCode.{grpc_code}")
    _assert_live_ready_and_exact(exported_server, rows, reference)


@pytest.mark.integration
@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_negative_and_huge_ids_get_the_defined_answer(
    exported_server: LocalServer, rows: Batch, reference: OnnxReference, protocol: str
) -> None:
    info = np.iinfo(np.int64)
    ids = np.resize(np.array([info.min, info.max, -1, -(10**18), 2**62 + 5, 10**12, 0]), (8, NUM_CATEGORICAL))
    batch = Batch(rows.dense[:8], ids.astype(np.int64), None)
    served = _raw_infer(exported_server, protocol, MODEL, batch.inputs())
    assert served.shape == (8, 1) and np.all((served > 0) & (served < 1))
    np.testing.assert_allclose(served, reference.predict(batch), rtol=0, atol=TOLERANCE)


# -------------------------------------------------------------------------------- fuzz
def _valid_json_request(rng: np.random.Generator, size: int) -> dict[str, Any]:
    return {
        "inputs": [
            {
                "name": DENSE_INPUT,
                "shape": [size, NUM_DENSE],
                "datatype": "FP32",
                "data": rng.normal(0, 1, size * NUM_DENSE).round(3).tolist(),
            },
            {
                "name": CATEGORICAL_INPUT,
                "shape": [size, NUM_CATEGORICAL],
                "datatype": "INT64",
                "data": rng.integers(0, 10**6, size * NUM_CATEGORICAL).tolist(),
            },
        ],
        "outputs": [{"name": OUTPUT}],
    }


def _http_fuzz_case(rng: np.random.Generator) -> tuple[str, str, bytes, dict[str, str]]:
    """One random malformed HTTP inference request: (kind, path, body, headers)."""
    path = f"/v2/models/{MODEL}/infer"
    headers = {"Content-Type": "application/json"}
    request = _valid_json_request(rng, int(rng.integers(1, 5)))
    tensor = request["inputs"][int(rng.integers(0, 2))]
    kind = str(
        rng.choice(
            [
                "garbage", "truncated", "datatype", "shape", "data_length", "data_values", "non_finite_json",
                "names", "model_path", "binary_header", "outputs", "top_level",
            ]
        )
    )  # fmt: skip
    if kind == "garbage":
        return kind, path, rng.bytes(int(rng.integers(0, 400))), headers
    if kind == "truncated":
        text = json.dumps(request).encode()
        return kind, path, text[: int(rng.integers(1, len(text) - 1))], headers
    if kind == "datatype":
        tensor["datatype"] = [
            "FP64", "INT32", "BYTES", "FP99", "", 7, None, "fp32", "BF16", "BOOL"
        ][int(rng.integers(0, 10))]  # fmt: skip
    elif kind == "shape":
        size = tensor["shape"][0]
        width = tensor["shape"][1]
        tensor["shape"] = [
            [], [size], [size, width, 1], [-1, width], [0, width], [size, -5], [2**40, width],
            ["a", width], [size, width - 1], 5, [2**63 - 1, width], None, [size * width],
        ][int(rng.integers(0, 13))]  # fmt: skip
    elif kind == "data_length":
        data = tensor["data"]
        choice = int(rng.integers(0, 4))
        tensor["data"] = [data[:-1], [*data, data[0]], [], [*data, *data]][choice]
    elif kind == "data_values":
        data = tensor["data"]
        # 1e40 is infinite as FP32 (refused by the backend) and not an INT64.
        data[int(rng.integers(0, len(data)))] = ["x", None, {"a": 1}, [1, 2], True, 1e40][
            int(rng.integers(0, 6))
        ]
    elif kind == "non_finite_json":
        request["inputs"][0]["data"][int(rng.integers(0, NUM_DENSE))] = float(
            rng.choice([np.nan, np.inf, -np.inf])
        )
    elif kind == "names":
        choice = int(rng.integers(0, 4))
        if choice == 0:
            request["inputs"].pop()
        elif choice == 1:
            request["inputs"].append(dict(request["inputs"][0]))
        elif choice == 2:
            tensor["name"] = "no_such_input"
        else:
            del tensor["name"]
    elif kind == "model_path":
        path = [
            "/v2/models/no_such_model/infer",
            f"/v2/models/{MODEL}/versions/7/infer",
            f"/v2/models/{MODEL}/versions/abc/infer",
            f"/v2/models/{MODEL}/versions/-1/infer",
            f"/v2/models/{MODEL}/versions/99999999999999999999999/infer",
            "/v2/models/..%2F..%2Fetc%2Fpasswd/infer",
            "/v2/models/" + "m" * 5000 + "/infer",
            "/v2/models//infer",
        ][int(rng.integers(0, 8))]
    elif kind == "binary_header":
        text = json.dumps(request).encode()
        headers = {
            "Content-Type": "application/octet-stream",
            "Inference-Header-Content-Length": str(
                [len(text) + 10, -3, "abc", 2**40][int(rng.integers(0, 4))]
            ),
        }
        return kind, path, text + rng.bytes(int(rng.integers(1, 64))), headers
    elif kind == "outputs":
        request["outputs"] = [
            [{"name": "no_such_output"}],
            [{"name": OUTPUT, "parameters": {"binary_data": "yes"}}],
            [{}],
            "x",
        ][int(rng.integers(0, 4))]
    else:  # top_level
        choice = int(rng.integers(0, 4))
        body: Any = [[request], {"inputs": {}}, {"inputs": None}, {**request, "parameters": "x"}][choice]
        return kind, path, json.dumps(body).encode(), headers
    return kind, path, json.dumps(request).encode(), headers


def _grpc_fuzz_case(rng: np.random.Generator) -> tuple[str, service_pb2.ModelInferRequest]:
    """One random malformed gRPC inference request."""
    size = int(rng.integers(1, 5))
    dense = rng.normal(0, 1, (size, NUM_DENSE)).astype(np.float32)
    ids = rng.integers(0, 10**6, (size, NUM_CATEGORICAL)).astype(np.int64)
    specs: list[list[Any]] = [
        [DENSE_INPUT, "FP32", [size, NUM_DENSE], dense.tobytes()],
        [CATEGORICAL_INPUT, "INT64", [size, NUM_CATEGORICAL], ids.tobytes()],
    ]
    model, version = MODEL, ""
    spec = specs[int(rng.integers(0, 2))]
    kind = str(
        rng.choice(["datatype", "shape", "byte_length", "names", "model", "non_finite", "contents", "batch"])
    )
    if kind == "datatype":
        spec[1] = ["FP64", "INT32", "BYTES", "FP99", "", "UINT8", "FP16"][int(rng.integers(0, 7))]
    elif kind == "shape":
        width = spec[2][1]
        choice = int(rng.integers(0, 8))
        # A wrong batch dimension goes on the first input: tritonserver 2.51 takes the
        # batch size from the first input and does not compare the others' with it
        # (see test_batch_dimension_of_a_later_input_is_not_checked).
        target = specs[0] if choice >= 5 else spec
        target[2] = [
            [], [size], [size, width, 1], [size, width - 1], [size, -3],
            [2**40, NUM_DENSE], [0, NUM_DENSE], [-1, NUM_DENSE],
        ][choice]  # fmt: skip
    elif kind == "byte_length":
        raw = spec[3]
        spec[3] = [raw[:-1], raw + b"\0", b"", raw[: len(raw) // 2], rng.bytes(7)][int(rng.integers(0, 5))]
    elif kind == "names":
        choice = int(rng.integers(0, 3))
        if choice == 0:
            specs.pop(int(rng.integers(0, 2)))
        elif choice == 1:
            specs.append(list(specs[0]))
        else:
            spec[0] = "no_such_input"
    elif kind == "model":
        model, version = [
            ("no_such_model", ""), (MODEL, "7"), (MODEL, "abc"), (MODEL, "-1"), ("", ""), ("m" * 5000, ""),
        ][int(rng.integers(0, 6))]  # fmt: skip
    elif kind == "non_finite":
        bad = dense.copy()
        bad[int(rng.integers(0, size)), int(rng.integers(0, NUM_DENSE))] = rng.choice(
            [np.nan, np.inf, -np.inf]
        )
        specs[0][3] = bad.tobytes()
    elif kind == "batch":
        rows = [0, MAX_BATCH_SIZE + 1][int(rng.integers(0, 2))]
        specs = [
            [DENSE_INPUT, "FP32", [rows, NUM_DENSE], np.zeros((rows, NUM_DENSE), np.float32).tobytes()],
            [CATEGORICAL_INPUT, "INT64", [rows, NUM_CATEGORICAL], np.zeros((rows, 26), np.int64).tobytes()],
        ]
    request = service_pb2.ModelInferRequest(model_name=model, model_version=version)
    for name, datatype, shape, raw in specs:
        tensor = request.inputs.add(name=name, datatype=datatype, shape=shape)
        if kind == "contents" and name == DENSE_INPUT:
            # Values in typed contents and raw contents together: the protocol allows one form.
            tensor.contents.fp32_contents.extend(np.frombuffer(raw, np.float32).tolist())
        request.raw_input_contents.append(raw)
    return kind, request


_HTTP_PARSE_ERRORS = (
    "failed to parse the request JSON buffer",
    "Unable to parse",
    "failed to get request params",
)


@pytest.fixture
def grpc_stub(exported_server: LocalServer) -> Iterator[service_pb2_grpc.GRPCInferenceServiceStub]:
    channel = grpc.insecure_channel(exported_server.grpc_url)
    try:
        yield service_pb2_grpc.GRPCInferenceServiceStub(channel)
    finally:
        channel.close()


@pytest.mark.integration
def test_fuzz_of_malformed_requests_leaves_the_server_live_ready_and_exact(
    exported_server: LocalServer,
    grpc_stub: service_pb2_grpc.GRPCInferenceServiceStub,
    rows: Batch,
    reference: OnnxReference,
) -> None:
    rng = np.random.default_rng(20261122)
    pid = exported_server.pid
    host, port = exported_server.http_url.rsplit(":", 1)
    unexpected: list[str] = []
    statuses: dict[str, set[str]] = {}
    for _ in range(FUZZ_REQUESTS):
        kind, path, body, headers = _http_fuzz_case(rng)
        connection = http.client.HTTPConnection(host, int(port), timeout=10)
        try:
            connection.request("POST", path, body=body, headers=headers)
            response = connection.getresponse()
            status, answer = response.status, response.read()
        except OSError as exc:  # a dropped connection is a failure of the server
            unexpected.append(f"http {kind}: {type(exc).__name__}: {exc}")
            continue
        finally:
            connection.close()
        statuses.setdefault(f"http {kind}", set()).add(str(status))
        try:
            error = str(json.loads(answer)["error"])
        except (ValueError, KeyError, TypeError):
            error = ""
        # tritonserver 2.51 answers a body it cannot parse with 500 (its JSON errors are
        # "internal"; triton-inference-server/server#8762); anything else must be 4xx.
        parse_error = status == 500 and error.startswith(_HTTP_PARSE_ERRORS)
        if not error or not (status in (400, 404) or parse_error):
            unexpected.append(f"http {kind} {path[:80]}: HTTP {status} {answer[:200]!r}")
    for _ in range(FUZZ_REQUESTS):
        kind, request = _grpc_fuzz_case(rng)
        try:
            grpc_stub.ModelInfer(request, timeout=10)
        except grpc.RpcError as exc:
            code = exc.code()
            statuses.setdefault(f"grpc {kind}", set()).add(code.name)
            if code not in (grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.NOT_FOUND):
                unexpected.append(f"grpc {kind}: {code.name} {exc.details()}")
        else:
            unexpected.append(f"grpc {kind}: answered a malformed request")
    assert not unexpected, "\n".join(unexpected)
    assert len(statuses) >= 15, statuses  # most kinds of malformation were drawn
    assert exported_server.pid == pid
    _assert_live_ready_and_exact(exported_server, rows, reference)


# ------------------------------------------------------------- malformed TSV, client side
GOOD_LINE = "\t".join(["1", *["5"] * NUM_DENSE, *["a1b2c3d4"] * NUM_CATEGORICAL])

# name -> (a malformed row, what the error says after "<file>:<line>: ")
MALFORMED_ROWS = {
    "too_few_fields": ("1\t2\t3", r"expected 40 tab-separated fields, got 3"),
    "one_field_more": (GOOD_LINE + "\t0", r"expected 40 tab-separated fields, got 41"),
    "one_field_less": (GOOD_LINE.rsplit("\t", 1)[0], r"expected 40 tab-separated fields, got 39"),
    "label_not_binary": ("2" + GOOD_LINE[1:], r"label must be 0 or 1, got '2'"),
    "count_not_a_number": (
        GOOD_LINE.replace("\t5\t", "\tfive\t", 1),
        r"I\d+: count 'five' is not an integer",
    ),
    "count_float": (GOOD_LINE.replace("\t5\t", "\t5.5\t", 1), r"I\d+: count '5\.5' is not an integer"),
    "id_not_hex": (
        GOOD_LINE.replace("a1b2c3d4", "zz9", 1),
        r"C\d+: categorical id 'zz9' is not 1 to 16 hex digits",
    ),
    "empty_line": ("", r"empty line"),
}


@pytest.mark.parametrize("case", list(MALFORMED_ROWS))
def test_malformed_tsv_row_gets_one_error_naming_file_and_line(tmp_path: Path, case: str) -> None:
    row, message = MALFORMED_ROWS[case]
    path = tmp_path / "rows.tsv"
    path.write_text("\n".join([GOOD_LINE, GOOD_LINE, row, GOOD_LINE]) + "\n")
    with pytest.raises(DataError, match=rf"^{path}:3: {message}"):
        list(file_batches(path, batch_size=1024))


@pytest.mark.parametrize(
    "row",
    [
        GOOD_LINE.replace("\t5\t", "\t99999999999999999999999\t", 1),
        GOOD_LINE.replace("a1b2c3d4", "ffffffffffffffffffff", 1),
    ],
    ids=["count_beyond_int64", "id_beyond_int64"],
)
def test_row_with_a_number_beyond_int64_gets_a_data_error(tmp_path: Path, row: str) -> None:
    path = tmp_path / "rows.tsv"
    path.write_text(f"{GOOD_LINE}\n{row}\n")
    with pytest.raises(DataError, match=rf"^{path}:2: "):
        list(file_batches(path, batch_size=1024))


@pytest.mark.integration
def test_batch_dimension_of_a_later_input_is_not_checked(
    exported_server: LocalServer,
    grpc_stub: service_pb2_grpc.GRPCInferenceServiceStub,
    rows: Batch,
    reference: OnnxReference,
) -> None:
    """tritonserver 2.51 takes B from the first input and checks only that one's shape against it:
    ``categorical_ids`` declared ``[2**40, 26]`` next to ``dense_features`` ``[3, 13]`` is answered
    for the 3 rows its bytes hold. The answer is the one for the data sent, so it is safe; this
    pins the leniency so that a tritonserver that starts refusing it is noticed."""
    batch = rows.slice(0, 3)
    request = service_pb2.ModelInferRequest(model_name=MODEL)
    request.inputs.add(name=DENSE_INPUT, datatype="FP32", shape=[3, NUM_DENSE])
    request.inputs.add(name=CATEGORICAL_INPUT, datatype="INT64", shape=[2**40, NUM_CATEGORICAL])
    request.raw_input_contents.extend([batch.dense.tobytes(), batch.categorical.tobytes()])
    response = grpc_stub.ModelInfer(request, timeout=10)
    (output,) = response.outputs
    assert list(output.shape) == [3, 1]
    served = np.frombuffer(response.raw_output_contents[0], np.float32).reshape(3, 1)
    np.testing.assert_allclose(served, reference.predict(batch), rtol=0, atol=TOLERANCE)
