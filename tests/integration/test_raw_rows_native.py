"""The raw-row stage (``criteo_rows``, the C++ backend ``raw_rows`` that ``make stages`` builds),
as the export writes it, loaded by the real local tritonserver.

Over HTTP and gRPC, each request is answered as the rules answer it in process
(:func:`criteo.rows.request_inputs`): the same tensors bit for bit (the dense features within 4
ULP where numpy's float32 ``log1p`` is not the C library's), or, for a row that breaks a rule, the
rules' error text with INVALID_ARGUMENT; a bad row fails only its own request, a tensor of
another shape or type gets its own error, and the server stays up. Until the python stage was
removed, the same tests held the compiled stage to it, bit for bit and word for word. Skips when
the compiled stages are not built.
"""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from bundle.repository import version_dir, write_config
from bundle.schema import CATEGORICAL_INPUT, DENSE_INPUT, RAW_ROWS_INPUT
from export.raw_rows import STAGE_MODEL, build_stage_config, write_stage
from server import LocalServer
from server.config import ModelControlMode
from server.installation import COMPILED_STAGES
from tests.native_stages import assert_rows_equal, rows_reference

pytestmark = [
    pytest.mark.integration,
    pytest.mark.skipif(
        not (COMPILED_STAGES / "raw_rows" / "libtriton_raw_rows.so").is_file(),
        reason=f"the compiled stages are not built ({COMPILED_STAGES} has no raw_rows): run `make stages`",
    ),
]


#: The status of a refused request, by protocol.
INVALID = {"grpc": "StatusCode.INVALID_ARGUMENT", "http": "400"}


def _write_changed(repository: Path, name: str, change: Callable[[Any], None]) -> None:
    config = build_stage_config()
    config.name = name
    change(config)
    version_dir(repository, name, 1).mkdir(parents=True, exist_ok=True)
    write_config(repository / name, config)


@pytest.fixture(scope="module")
def server(start_triton: Callable[..., LocalServer], tmp_path_factory: pytest.TempPathFactory) -> LocalServer:
    repository = tmp_path_factory.mktemp("native-raw-rows")
    write_stage(repository)
    return start_triton(repository)


def _rows(count: int, seed: int) -> list[bytes]:
    """Unlabeled rows: random ones, then rows at the rules' edges."""
    rng = np.random.default_rng(seed)
    rows = []
    for _ in range(count):
        counts = [str(int(v)) if rng.random() > 0.1 else "" for v in rng.integers(-10, 10**6, 13)]
        ids = [format(int(v), "x") if rng.random() > 0.1 else "" for v in rng.integers(0, 2**40, 26)]
        rows.append("\t".join(counts + ids).encode())
    rows.append(b"\t" * 38)
    counts = ["-5", "999999999999999999", *["0"] * 11]
    ids = ["8000000000000000", "ffffffffffffffff", "7FFFFFFFFFFFFFFF", *["aB"] * 23]
    rows.append("\t".join(counts + ids).encode())
    rows.append(rows[0] + b"\r\n")
    return rows


def _infer(protocol: str, url: str, model: str, rows: list[bytes]) -> dict[str, np.ndarray]:
    module: Any = grpcclient if protocol == "grpc" else httpclient
    array = np.array(rows, dtype=np.object_).reshape(-1, 1)
    with module.InferenceServerClient(url) as client:
        tensor = module.InferInput(RAW_ROWS_INPUT, list(array.shape), "BYTES")
        tensor.set_data_from_numpy(array)
        outputs = [module.InferRequestedOutput(name) for name in (DENSE_INPUT, CATEGORICAL_INPUT)]
        result = client.infer(model, [tensor], outputs=outputs)
        return {name: np.asarray(result.as_numpy(name)) for name in (DENSE_INPUT, CATEGORICAL_INPUT)}


def _url(server: LocalServer, protocol: str) -> str:
    return server.grpc_url if protocol == "grpc" else server.http_url


@pytest.mark.parametrize("protocol", ["http", "grpc"])
@pytest.mark.parametrize("count", [1, 64, 1024])
def test_the_stage_answers_as_the_rules(server: LocalServer, protocol: str, count: int) -> None:
    rows = _rows(count, seed=count)
    expected = rows_reference(rows)
    assert isinstance(expected, dict), expected
    answered = _infer(protocol, _url(server, protocol), STAGE_MODEL, rows)
    dense, ids = answered[DENSE_INPUT], answered[CATEGORICAL_INPUT]
    assert (dense.dtype, dense.shape) == (np.float32, (len(rows), 13))
    assert (ids.dtype, ids.shape) == (np.int64, (len(rows), 26))
    assert_rows_equal(answered, expected)


def _bad(rows: list[bytes]) -> list[list[bytes]]:
    good = rows[0]
    fields = good.split(b"\t")
    c7 = [*fields[:19], b"zz", *fields[20:]]
    return [
        [good, b"\t".join(c7)],  # a bad id, in row 1
        [good + b"\t0"],  # a field too many
        [b"x" + good],  # a bad count
        [good.rsplit(b"\t", 1)[0] + b"\t" + b"f" * 17],  # an id too long
        [good, good[:10] + b"\n" + good[10:]],  # a line break inside a row
        [b"-\xe9'\"\\" + good],  # a count quoted with every escape
        [b""],
    ]


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_a_bad_row_gets_the_rules_error(server: LocalServer, protocol: str) -> None:
    for request in _bad(_rows(4, seed=7)):
        expected = rows_reference(request)
        assert isinstance(expected, str) and expected.startswith("row "), (request, expected)
        with pytest.raises(InferenceServerException) as caught:
            _infer(protocol, _url(server, protocol), STAGE_MODEL, request)
        assert (caught.value.status(), caught.value.message()) == (INVALID[protocol], expected), request


def _mutated(rng: np.random.Generator, row: bytes) -> bytes:
    """``row`` with a few random bytes put in, replaced or taken out (tabs and line ends among them)."""
    for _ in range(int(rng.integers(0, 4))):
        where = int(rng.integers(0, len(row) + 1))
        byte = bytes([int(rng.choice([9, 10, 13, 45, 39, 0, 255, int(rng.integers(0, 256))]))])
        action = int(rng.integers(0, 3))
        tail = row[where + 1 :] if action else row[where:]
        row = row[:where] + (byte if action < 2 else b"") + tail
    return row


def test_random_requests_get_the_rules_answer_or_error(server: LocalServer) -> None:
    """Requests of 1 to 8 randomly damaged rows, over gRPC: the rules' tensors or the rules' error."""
    rng = np.random.default_rng(5)
    rows = _rows(64, seed=5)
    outcomes = {"answered": 0, "refused": 0}
    for _ in range(150):
        picked = [rows[int(rng.integers(0, len(rows)))] for _ in range(int(rng.integers(1, 9)))]
        request = [_mutated(rng, row) if rng.random() < 0.1 else row for row in picked]
        expected = rows_reference(request)
        try:
            answered: Any = _infer("grpc", server.grpc_url, STAGE_MODEL, request)
        except InferenceServerException as exc:
            answered = (exc.status(), exc.message())
        if isinstance(expected, dict):
            assert isinstance(answered, dict), (request, answered)
            assert_rows_equal(answered, expected)
        else:
            assert answered == (INVALID["grpc"], expected), request
        outcomes["refused" if isinstance(expected, str) else "answered"] += 1
    assert min(outcomes.values()) > 20, outcomes
    with grpcclient.InferenceServerClient(server.grpc_url) as client:
        assert client.is_server_ready()


def _send(url: str, model: str, array: np.ndarray, datatype: str) -> dict[str, np.ndarray] | str:
    """One raw tensor to ``model`` over gRPC: its outputs, or its error with the model's name
    taken out (Triton's own checks name it)."""
    with grpcclient.InferenceServerClient(url) as client:
        tensor = grpcclient.InferInput(RAW_ROWS_INPUT, list(array.shape), datatype)
        tensor.set_data_from_numpy(array)
        try:
            result = client.infer(model, [tensor])
        except InferenceServerException as exc:
            return f"{exc.status()}: {exc.message()}".replace(f"'{model}'", "'MODEL'")
        return {name: np.asarray(result.as_numpy(name)) for name in (DENSE_INPUT, CATEGORICAL_INPUT)}


def test_wrong_shapes_dtypes_and_random_bytes_get_their_own_error(server: LocalServer) -> None:
    """A tensor of another type or shape is refused, naming the input; random bytes as rows get the
    rules' answer or error; neither the server nor the stage goes down."""
    rng = np.random.default_rng(11)
    good = _rows(4, seed=11)[:4]
    wrong: list[tuple[np.ndarray, str]] = [
        (np.zeros((2, 1), dtype=np.int64), "INT64"),
        (np.zeros((2, 1), dtype=np.float32), "FP32"),
        (np.array(good, dtype=np.object_).reshape(2, 2), "BYTES"),
        (np.array(good, dtype=np.object_).reshape(-1), "BYTES"),
        (np.array(good, dtype=np.object_).reshape(1, 4, 1), "BYTES"),
        (np.zeros((0, 1), dtype=np.object_), "BYTES"),
    ]
    for array, datatype in wrong:
        answer = _send(server.grpc_url, STAGE_MODEL, array, datatype)
        assert isinstance(answer, str), (array.shape, datatype, answer)
        assert answer.startswith(f"{INVALID['grpc']}: ") and f"'{RAW_ROWS_INPUT}'" in answer, answer
    for _ in range(20):
        rows = [rng.bytes(int(rng.integers(0, 400))) for _ in range(int(rng.integers(1, 6)))]
        expected = rows_reference(rows)
        answer = _send(server.grpc_url, STAGE_MODEL, np.array(rows, dtype=np.object_).reshape(-1, 1), "BYTES")
        if isinstance(expected, dict):
            assert isinstance(answer, dict), (rows, answer)
            assert_rows_equal(answer, expected)
        else:
            assert answer == f"{INVALID['grpc']}: {expected}", rows
    with grpcclient.InferenceServerClient(server.grpc_url) as client:
        assert client.is_server_ready() and client.is_model_ready(STAGE_MODEL)


def test_one_bad_request_fails_alone_and_the_server_stays_up(server: LocalServer) -> None:
    """Requests sent together meet in one dynamic batch of the stage: only the bad one fails."""
    good = _rows(8, seed=3)
    bad = list(good)
    fields = bad[3].split(b"\t")
    fields[13 + 6] = b"zz"  # C7
    bad[3] = b"\t".join(fields)
    expected = rows_reference(good)
    assert isinstance(expected, dict)

    def send(rows: list[bytes]) -> dict[str, np.ndarray] | str:
        try:
            return _infer("grpc", server.grpc_url, STAGE_MODEL, rows)
        except InferenceServerException as exc:
            return str(exc.message())

    with ThreadPoolExecutor(6) as pool:
        answers = list(pool.map(send, [good, bad, good, good, bad, good] * 4))
    for index, answer in enumerate(answers):
        if index % 6 in (1, 4):
            assert answer == "row 3: C7: categorical id 'zz' is not 1 to 16 hex digits", answer
        else:
            assert isinstance(answer, dict), answer
            assert_rows_equal(answer, expected)
    with grpcclient.InferenceServerClient(server.grpc_url) as client:
        assert client.is_server_ready() and client.is_model_ready(STAGE_MODEL)


def test_a_config_that_does_not_match_fails_the_load_saying_how(
    start_triton: Callable[..., LocalServer], tmp_path: Path
) -> None:
    def wrong(config: Any) -> None:
        del config.output[1]
        config.output[0].dims[:] = [12]

    _write_changed(tmp_path, "mismatched", wrong)
    server = start_triton(tmp_path, model_control_mode=ModelControlMode.EXPLICIT)
    with grpcclient.InferenceServerClient(server.grpc_url) as client:
        with pytest.raises(InferenceServerException) as caught:
            client.load_model("mismatched")
        # Live, not ready: with strict readiness a model that failed its load makes it unready.
        assert client.is_server_live()
    message = caught.value.message()
    assert (
        "model 'mismatched': config.pbtxt does not match the stage: 2 outputs expected, got 1; "
        "output 'dense_features' must be TYPE_FP32 [13], got TYPE_FP32 [12]"
    ) in message, message
