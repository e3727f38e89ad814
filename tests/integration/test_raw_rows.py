"""Raw rows in, through the real local tritonserver: ``<model>_raw`` (the raw-row stage, then the
model) answers as the model does on rows preprocessed by the client, over HTTP and gRPC, for
both families and every precision, on synthetic rows and on the edge rows; a bad row fails its
own request naming the row and the field, its neighbours are answered and the server stays up."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from bundle.schema import OUTPUT
from criteo.tsv import parse_lines, to_batch
from export.raw_rows import RAW_INPUT, STAGE_MODEL, raw_model_name
from server import LocalServer

pytestmark = pytest.mark.integration

MODELS = ("dlrm_onnx", "dlrm_onnx_fp16", "dlrm_onnx_int8", "wide_deep_onnx", "wide_deep_onnx_int8")
ROWS = 64


def _edge_rows(base: str) -> list[str]:
    """Rows at the rules' edges, built from an unlabeled row."""
    fields = base.split("\t")
    counts, ids = fields[:13], fields[13:]
    rows = []
    rows.append("\t".join([""] * 13 + [""] * 26))  # every field missing
    rows.append("\t".join(["-5", "-999999999999999999", *counts[2:], *ids]))  # negative counts
    rows.append("\t".join(["999999999999999999", "0", *counts[2:], *ids]))  # a huge count
    rows.append("\t".join([*counts, *(i.upper() for i in ids)]))  # upper-case hex
    rows.append("\t".join([*counts, *(i.lower() for i in ids)]))  # lower-case hex
    wide = ["8000000000000000", "ffffffffffffffff", "7FFFFFFFFFFFFFFF", "FFFFFFFFFFFFFFFE"]
    rows.append("\t".join([*counts, *wide, *ids[4:]]))  # ids at and past 2^63
    return rows


@pytest.fixture(scope="module")
def raw_rows(labeled_file: Path) -> list[str]:
    """Unlabeled rows: synthetic ones, then the edge rows."""
    lines = labeled_file.read_text().splitlines()[:ROWS]
    unlabeled = [line.split("\t", 1)[1] for line in lines]
    return unlabeled + _edge_rows(unlabeled[0])


def _preprocessed(rows: list[str]) -> dict[str, np.ndarray]:
    return to_batch(parse_lines(rows, fields=39)).inputs()


def _infer(protocol: str, url: str, model: str, inputs: dict[str, np.ndarray]) -> np.ndarray:
    module: Any = grpcclient if protocol == "grpc" else httpclient
    with module.InferenceServerClient(url) as client:
        tensors = []
        for name, array in inputs.items():
            datatype = (
                "BYTES" if array.dtype == np.object_ else ("FP32" if array.dtype == np.float32 else "INT64")
            )
            tensor = module.InferInput(name, list(array.shape), datatype)
            tensor.set_data_from_numpy(array)
            tensors.append(tensor)
        result = client.infer(model, tensors, outputs=[module.InferRequestedOutput(OUTPUT)])
        return np.asarray(result.as_numpy(OUTPUT))


def _raw(rows: list[str]) -> dict[str, np.ndarray]:
    return {RAW_INPUT: np.array([row.encode() for row in rows], dtype=np.object_).reshape(-1, 1)}


@pytest.mark.parametrize("protocol", ["http", "grpc"])
@pytest.mark.parametrize("model", MODELS)
def test_raw_rows_score_as_rows_preprocessed_by_the_client(
    exported_server: LocalServer, raw_rows: list[str], model: str, protocol: str
) -> None:
    url = exported_server.grpc_url if protocol == "grpc" else exported_server.http_url
    expected = _infer(protocol, url, model, _preprocessed(raw_rows))
    answered = _infer(protocol, url, raw_model_name(model), _raw(raw_rows))
    assert answered.shape == expected.shape == (len(raw_rows), 1)
    np.testing.assert_allclose(answered, expected, rtol=0, atol=1e-6)


def test_one_bad_row_fails_its_own_request_naming_row_and_field(
    exported_server: LocalServer, raw_rows: list[str]
) -> None:
    """Requests sent together (one dynamic batch of the stage, where they meet): the one with a
    bad row gets one line naming it, the others their scores; the server stays ready."""
    model = raw_model_name("dlrm_onnx")
    good = raw_rows[:8]
    fields = good[3].split("\t")
    fields[13 + 6] = "zz"  # C7
    bad = [*good[:3], "\t".join(fields), *good[4:]]
    expected = _infer("http", exported_server.http_url, "dlrm_onnx", _preprocessed(good))

    def send(rows: list[str]) -> np.ndarray | str:
        try:
            return _infer("grpc", exported_server.grpc_url, model, _raw(rows))
        except InferenceServerException as exc:
            return str(exc.message())

    with ThreadPoolExecutor(6) as pool:
        answers = list(pool.map(send, [good, bad, good, good, bad, good]))
    for index, answer in enumerate(answers):
        if index in (1, 4):
            assert isinstance(answer, str) and "row 3: C7: categorical id 'zz'" in answer, answer
            assert "\n" not in answer
        else:
            assert not isinstance(answer, str), answer
            np.testing.assert_allclose(answer, expected, rtol=0, atol=1e-6)
    with grpcclient.InferenceServerClient(exported_server.grpc_url) as client:
        assert (
            client.is_server_ready() and client.is_model_ready(model) and client.is_model_ready(STAGE_MODEL)
        )


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (lambda row: row + "\t0", "row 0: expected 39 tab-separated fields, got 40"),
        (lambda row: "x" + row, "row 0: I1: count 'x"),
        (
            lambda row: row.rsplit("\t", 1)[0] + "\t" + "f" * 17,
            "row 0: C26: categorical id 'fffffffffffffffff'",
        ),
    ],
)
def test_a_malformed_row_is_refused_in_one_line(
    exported_server: LocalServer, raw_rows: list[str], change: Any, message: str
) -> None:
    with pytest.raises(InferenceServerException, match=message):
        _infer(
            "http", exported_server.http_url, raw_model_name("wide_deep_onnx"), _raw([change(raw_rows[0])])
        )
