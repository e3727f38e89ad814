"""Rows as text for a raw-row model, offline: a file's text as the clients send it (labels cut, bad
rows pointed at their line), the load tests' pool that holds the same rows as tensors and as text,
and the requests built from it (gRPC, HTTP, perf_analyzer's input data)."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import numpy as np
import pytest
from tritonclient.grpc import service_pb2
from tritonclient.utils import deserialize_bytes_tensor

from bundle.errors import ClientError, DataError
from bundle.schema import CATEGORICAL_INPUT, DENSE_INPUT, RAW_ROWS_INPUT, is_raw_model, raw_model_name
from clients.batching import located, row_text_batches
from clients.validation import ModelSpec
from criteo.synth import SynthConfig, write_tsv
from criteo.tsv import iter_row_text, parse_lines, read_batch, to_batch
from loadtest.engine.payload import PayloadPool, build_pool
from loadtest.engine.wire import http_bodies, http_header_length, serialised_requests, tensor_bytes
from loadtest.sweeps.perf_analyzer import write_input_data


@pytest.fixture(scope="module")
def labeled(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("rows") / "rows.tsv"
    write_tsv(SynthConfig(rows=50, seed=3), path)
    return path


def _tensors(text: list[bytes]) -> tuple[np.ndarray, np.ndarray]:
    batch = to_batch(parse_lines([row.decode() for row in text], fields=39))
    return batch.dense, batch.categorical


def test_a_labeled_file_is_sent_as_its_text_without_the_labels(labeled: Path, tmp_path: Path) -> None:
    chunks = list(row_text_batches(labeled, batch_size=16, max_rows=40))
    assert [len(c) for c in chunks] == [16, 16, 8] and [c.first_line for c in chunks] == [1, 17, 33]
    lines = labeled.read_bytes().splitlines()[:40]
    text = [row for c in chunks for row in c.rows[:, 0]]
    assert text == [line.split(b"\t", 1)[1] for line in lines]
    assert chunks[0].inputs()[RAW_ROWS_INPUT].dtype == np.object_
    assert chunks[0].inputs()[RAW_ROWS_INPUT].shape == (16, 1)
    expected = read_batch(labeled, 40)
    labels = np.concatenate([c.labels for c in chunks if c.labels is not None])
    np.testing.assert_array_equal(labels, expected.labels)
    # An unlabeled file (and a gzipped one) goes as it is.
    unlabeled = tmp_path / "unlabeled.tsv.gz"
    with gzip.open(unlabeled, "wb") as handle:
        handle.write(b"\r\n".join(text[:5]) + b"\r\n")
    (chunk,) = iter_row_text(unlabeled)
    assert chunk.labels is None and list(chunk.rows[:, 0]) == text[:5]


@pytest.mark.parametrize(
    ("content", "message"),
    [(b"", None), (b"\n", ":1: empty line"), (b"2" + b"\t" * 39 + b"\n", ":1: label: label must be 0 or 1")],
)
def test_row_text_refuses_an_empty_line_and_a_bad_label(
    tmp_path: Path, content: bytes, message: str | None
) -> None:
    path = tmp_path / "rows.tsv"
    path.write_bytes(content)
    if message is None:
        assert list(iter_row_text(path)) == []
        return
    with pytest.raises(DataError, match=message):
        list(iter_row_text(path))


def test_a_bad_row_named_by_the_server_is_pointed_at_its_file_line(labeled: Path) -> None:
    chunk = list(row_text_batches(labeled, batch_size=16))[1]
    said = ClientError(
        "model 'dlrm_onnx_raw': in ensemble 'dlrm_onnx_raw', row 3: C7: categorical id 'zz' is bad"
    )
    assert str(located(chunk, said)) == (
        f"{labeled}:20: C7: categorical id 'zz' is bad (model 'dlrm_onnx_raw': in ensemble 'dlrm_onnx_raw')"
    )
    other = ClientError("model 'dlrm_onnx_raw': server unavailable")
    assert located(chunk, other) is other
    assert located(chunk, ClientError("row 99: out of this request")).args == ("row 99: out of this request",)


def _spec(name: str, inputs: list[dict[str, object]]) -> ModelSpec:
    metadata = {"name": name, "versions": ["1"], "inputs": inputs, "outputs": [
        {"name": "click_probability", "datatype": "FP32", "shape": [-1, 1]}]}  # fmt: skip
    return ModelSpec.from_server(metadata, {"max_batch_size": 64})


def test_validation_takes_bytes_and_says_which_model_takes_what() -> None:
    raw = _spec("dlrm_onnx_raw", [{"name": RAW_ROWS_INPUT, "datatype": "BYTES", "shape": [-1, 1]}])
    rows = np.array([[b"1\t2"], [b"3\t4"]], dtype=np.object_)
    pairs, count = raw.validate({RAW_ROWS_INPUT: rows})
    assert count == 2 and pairs[0][0].datatype == "BYTES"
    with pytest.raises(ClientError, match="'dlrm_onnx_raw' is a raw-row model: it takes the rows as text"):
        raw.validate(
            {DENSE_INPUT: np.zeros((2, 13), np.float32), CATEGORICAL_INPUT: np.zeros((2, 26), np.int64)}
        )
    with pytest.raises(ClientError, match="is BYTES, whose size varies by row: shared memory cannot"):
        raw.row_bytes()
    tensors = _spec("dlrm_onnx", [
        {"name": DENSE_INPUT, "datatype": "FP32", "shape": [-1, 13]},
        {"name": CATEGORICAL_INPUT, "datatype": "INT64", "shape": [-1, 26]},
    ])  # fmt: skip
    with pytest.raises(ClientError, match="not rows as text; its raw-row model is 'dlrm_onnx_raw'"):
        tensors.validate({RAW_ROWS_INPUT: rows})
    assert is_raw_model(raw_model_name("dlrm_onnx")) and not is_raw_model("dlrm_onnx")


def test_a_pool_holds_the_same_rows_as_tensors_and_as_text(labeled: Path, tmp_path: Path) -> None:
    for pool in (build_pool(8, batches=3), build_pool(8, data=labeled, batches=3)):
        assert pool.text is not None and pool.text.shape == (24,)
        dense, ids = _tensors(list(pool.text))
        np.testing.assert_array_equal(dense, pool.dense)
        np.testing.assert_array_equal(ids, pool.categorical)
        batch = pool.batch(1, "text")[RAW_ROWS_INPUT]
        assert batch.dtype == np.object_ and batch.shape == (8, 1) and batch[0, 0] == pool.text[8]
        loaded = PayloadPool.load(pool.save(tmp_path / "pool.npz"))
        assert loaded.text is not None and list(loaded.text) == list(pool.text)
        grown = loaded.rebatched(50)  # fewer rows than one batch: they repeat, text and tensors alike
        assert grown.text is not None and len(grown.text) == 50 and grown.text[24] == pool.text[0]
        np.testing.assert_array_equal(_tensors(list(grown.text))[1], grown.categorical)
    stream = PayloadPool(pool.dense, pool.categorical, 8, "stream")
    with pytest.raises(DataError, match="holds no row text for a raw-row model"):
        stream.batch(0, "text")


def test_requests_for_a_raw_row_model_carry_the_text(tmp_path: Path) -> None:
    pool = build_pool(4, batches=3)
    assert pool.text is not None
    messages = serialised_requests("dlrm_onnx_raw", pool)
    assert len(messages) == 3
    message = service_pb2.ModelInferRequest.FromString(messages[2])
    (tensor,) = message.inputs
    assert (tensor.name, tensor.datatype, list(tensor.shape)) == (RAW_ROWS_INPUT, "BYTES", [4, 1])
    assert list(deserialize_bytes_tensor(message.raw_input_contents[0])) == list(pool.text[8:12])
    plain = service_pb2.ModelInferRequest.FromString(serialised_requests("dlrm_onnx", pool)[0])
    assert [t.name for t in plain.inputs] == [DENSE_INPUT, CATEGORICAL_INPUT]
    # HTTP: the rows' sizes vary, the JSON headers are padded to one length.
    length = http_header_length(pool, "text")
    for index, body in enumerate(http_bodies(pool, "text")):
        header = json.loads(body[:length])
        (entry,) = header["inputs"]
        content = body[length:]
        assert entry["parameters"]["binary_data_size"] == len(content)
        assert content == tensor_bytes(pool.batch(index, "text")[RAW_ROWS_INPUT])
    # perf_analyzer: one row's text per entry.
    path = write_input_data(pool, tmp_path / "input.json", rows=5, form="text")
    entries = json.loads(path.read_text())["data"]
    assert [e[RAW_ROWS_INPUT] for e in entries] == [[row.decode()] for row in pool.text[:5]]
