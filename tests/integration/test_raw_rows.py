"""Raw rows in, through the real local tritonserver: ``<model>_raw`` (the raw-row stage, then the
model) answers as the model does on rows preprocessed by the client, over HTTP and gRPC, for
both families and every precision, on synthetic rows and on the edge rows; a bad row fails its
own request naming the row and the field, its neighbours are answered and the server stays up.
The bundle's clients send a file's text with ``--raw`` (a bad row named by its file line), and
the documentation's ``curl`` example scores a row."""

from __future__ import annotations

import csv
import json
import re
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from bundle.errors import ClientError
from bundle.schema import OUTPUT, RAW_ROWS_INPUT, raw_model_name
from clients.evaluate import evaluate
from clients.options import ClientOptions
from clients.predict import PredictOptions, predict_file
from criteo.tsv import parse_lines, to_batch
from export.raw_rows import STAGE_MODEL
from server import LocalServer

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]

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
    return {RAW_ROWS_INPUT: np.array([row.encode() for row in rows], dtype=np.object_).reshape(-1, 1)}


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


@pytest.mark.parametrize("family", ["dlrm", "wide_deep"])
def test_the_familys_raw_row_model_scores_with_its_int8_variant(
    exported_server: LocalServer, raw_rows: list[str], family: str
) -> None:
    url = exported_server.grpc_url
    expected = _infer("grpc", url, f"{family}_onnx_int8", _preprocessed(raw_rows))
    answered = _infer("grpc", url, raw_model_name(family), _raw(raw_rows))
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


def _client(server: LocalServer, protocol: str, shared_memory: str = "none") -> ClientOptions:
    url = server.grpc_url if protocol == "grpc" else server.http_url
    return ClientOptions(url=url, protocol=protocol, shared_memory=shared_memory)  # type: ignore[arg-type]


def _probabilities(path: Path) -> np.ndarray:
    return np.loadtxt(path, skiprows=1, dtype=np.float64)


@pytest.mark.parametrize(("protocol", "mode"), [("grpc", "sync"), ("http", "async")])
def test_infer_raw_sends_the_file_text_and_scores_as_the_tensors_do(
    exported_server: LocalServer, labeled_file: Path, tmp_path: Path, protocol: str, mode: str
) -> None:
    """A labeled file, 1,000 rows in requests of 300 (the last one short), its label cut off."""
    client = _client(exported_server, protocol)
    rows = PredictOptions(batch_size=300, mode=mode, max_rows=1000)  # type: ignore[arg-type]
    predict_file(client, "dlrm_onnx_int8", labeled_file, rows, tmp_path / "tensors.csv")
    raw = PredictOptions(batch_size=300, mode=mode, max_rows=1000, raw=True)  # type: ignore[arg-type]
    summary = predict_file(client, "dlrm_onnx_int8_raw", labeled_file, raw, tmp_path / "raw.csv")
    assert (summary.rows, summary.batches) == (1000, 4)
    answered, expected = _probabilities(tmp_path / "raw.csv"), _probabilities(tmp_path / "tensors.csv")
    assert answered.shape == expected.shape == (1000,)
    np.testing.assert_allclose(answered, expected, rtol=0, atol=1e-6)


def test_evaluate_raw_keeps_the_labels(exported_server: LocalServer, labeled_file: Path) -> None:
    client = _client(exported_server, "grpc")
    options = PredictOptions(batch_size=512, max_rows=2000)
    tensors = evaluate(client, ["wide_deep_onnx"], labeled_file, options)
    raw = evaluate(client, ["wide_deep_onnx_raw"], labeled_file, PredictOptions(512, max_rows=2000, raw=True))
    assert raw.rows == tensors.rows == 2000
    assert raw.scores[0].auc == pytest.approx(tensors.scores[0].auc, abs=1e-6)
    assert raw.scores[0].logloss == pytest.approx(tensors.scores[0].logloss, abs=1e-6)


def test_infer_raw_names_a_bad_row_by_its_file_line(
    exported_server: LocalServer, labeled_file: Path, tmp_path: Path
) -> None:
    """Through the CLI: one ``error:`` line with the file, the line and the field; exit 1."""
    lines = labeled_file.read_text().splitlines()[:40]
    fields = lines[32].split("\t")
    fields[1 + 13 + 6] = "zz"  # C7 of line 33
    lines[32] = "\t".join(fields)
    bad = tmp_path / "bad.tsv"
    bad.write_text("\n".join(lines) + "\n")
    argv = [sys.executable, "-m", "clients", "infer", "--protocol", "grpc", "--url", exported_server.grpc_url,
            "--model", "dlrm_onnx_raw", "--raw", "--input", str(bad), "--batch-size", "16"]  # fmt: skip
    done = subprocess.run(argv, capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert done.returncode == 1, done.stdout + done.stderr
    errors = [line for line in done.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1, done.stderr
    assert f"{bad}:33: C7: categorical id 'zz' is not 1 to 16 hex digits" in errors[0], errors[0]
    with grpcclient.InferenceServerClient(exported_server.grpc_url) as client:
        assert client.is_server_ready() and client.is_model_ready("dlrm_onnx_raw")


def test_rows_and_tensors_sent_to_the_wrong_model_say_which_to_use(
    exported_server: LocalServer, labeled_file: Path, tmp_path: Path
) -> None:
    client = _client(exported_server, "http")
    raw = PredictOptions(batch_size=8, max_rows=8, raw=True)
    with pytest.raises(ClientError, match="its raw-row model is 'dlrm_onnx_raw'"):
        predict_file(client, "dlrm_onnx", labeled_file, raw, tmp_path / "out.csv")
    with pytest.raises(ClientError, match="is a raw-row model: it takes the rows as text"):
        predict_file(
            client, "dlrm_onnx_raw", labeled_file, PredictOptions(8, max_rows=8), tmp_path / "out.csv"
        )
    shared = _client(exported_server, "http", shared_memory="system")
    with pytest.raises(ClientError, match="is BYTES, whose size varies by row: shared memory cannot"):
        predict_file(shared, "dlrm_onnx_raw", labeled_file, raw, tmp_path / "out.csv")
    assert not (tmp_path / "out.csv").exists() and not (tmp_path / "o.csv").exists()


def test_the_documented_curl_example_scores_a_row(exported_server: LocalServer) -> None:
    """docs/clients.md's ``curl`` block, as written but for the server's port."""
    page = (ROOT / "docs" / "clients.md").read_text()
    found = re.search(r"<!-- run: served -->\n```bash\n(.*?)```", page, re.DOTALL)
    assert found is not None, "docs/clients.md has no block marked <!-- run: served -->"
    block = found.group(1)
    assert "127.0.0.1:8000" in block
    script = block.replace("127.0.0.1:8000", exported_server.http_url)
    done = subprocess.run(
        ["bash", "-euo", "pipefail", "-c", script], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    answer = json.loads(done.stdout)
    assert answer["model_name"] == "dlrm_onnx_int8_raw"
    (output,) = answer["outputs"]
    assert (output["name"], output["datatype"], output["shape"]) == (OUTPUT, "FP32", [1, 1])
    row = json.loads(re.search(r"-d '(.*)'", block, re.DOTALL).group(1))["inputs"][0]["data"][0]  # type: ignore[union-attr]
    expected = _infer("http", exported_server.http_url, "dlrm_onnx_int8", _preprocessed([row]))
    np.testing.assert_allclose(np.asarray(output["data"]).reshape(1, 1), expected, rtol=0, atol=1e-6)


def test_a_sweep_drives_a_raw_row_model_with_every_engine(
    exported_server: LocalServer, tmp_path: Path
) -> None:
    """locust, the driver and (where installed) perf_analyzer send the pool's rows as text to
    ``dlrm_onnx_int8_raw``, over gRPC and HTTP: a step for every (protocol, engine), every request
    answered, and the server counts them at the raw-row model. On a busy machine perf_analyzer's
    windows may never agree: its step is then in the report without figures, saying so, and the
    run goes on; every figure a step has is checked."""
    from loadtest.sweeps.perf_analyzer import STEP_CSV, UNSTABLE
    from loadtest.sweeps.perf_analyzer_install import locate

    engines = "locust,driver" + (",perf_analyzer" if locate()[0] is not None else "")
    model = raw_model_name("dlrm_onnx_int8")
    with grpcclient.InferenceServerClient(exported_server.grpc_url) as client:
        before = client.get_inference_statistics(model, as_json=True)["model_stats"][0]["inference_stats"]
    out = tmp_path / "sweep"
    argv = [sys.executable, "-m", "loadtest", "sweep", "--model", model, "--protocol", "grpc", "--protocol",
            "http", "--url", exported_server.grpc_url, "--url", exported_server.http_url, "--engine", engines,
            "--batch-size", "16", "--concurrency", "1", "--duration", "1", "--warmup", "0.3", "--no-baseline",
            "--out", str(out)]  # fmt: skip
    done = subprocess.run(argv, capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    steps = json.loads((out / "report.json").read_text())["steps"]
    # Each pair exactly once, in the JSON and in steps.csv, with or without figures.
    pairs = sorted((p, e) for p in ("grpc", "http") for e in engines.split(","))
    assert sorted((s["protocol"], s["engine"]) for s in steps) == pairs
    with open(out / "steps.csv", newline="") as handle:
        assert sorted((r["protocol"], r["engine"]) for r in csv.DictReader(handle)) == pairs
    markdown = (out / "report.md").read_text()
    for step in steps:
        assert step["model"] == model and step["batch_size"] == 16 and step["concurrency"] == 1, step
        if step["failure"]:
            # Only perf_analyzer's own stability rule may leave a step without figures (locust and
            # the driver report whatever they measured); the reason is its line, in the report too.
            assert step["engine"] == "perf_analyzer" and UNSTABLE in step["failure"], step
            assert "\n" not in step["failure"] and step["requests"] == 0 and step["errors"] == 0, step
            assert step["samples_per_s"] is None and step["p50_ms"] is None and step["p99_ms"] is None, step
            assert f"no figures: {step['failure']}" in markdown
            continue
        assert step["requests"] > 0 and step["errors"] == 0 and step["errors_total"] == 0, step
        assert step["samples_per_s"] == pytest.approx(step["requests_per_s"] * 16), step
        assert 0 < step["p50_ms"] <= step["p90_ms"] <= step["p95_ms"] <= step["p99_ms"], step
        assert step["server"] is not None and step["server"]["requests"] > 0, step
        if step["engine"] == "perf_analyzer":
            # Its figures are its own, from the CSV it wrote (each request one row of text, -b 16).
            folder = out / "raw" / "steps" / f"triton-{model}-{step['protocol']}-perf_analyzer-b16-c1"
            with open(folder / STEP_CSV, newline="") as handle:
                (row,) = list(csv.DictReader(handle))
            assert step["samples_per_s"] == pytest.approx(float(row["Inferences/Second"]))
            assert step["p50_ms"] == pytest.approx(float(row["p50 latency"]) / 1000)
            assert step["p99_ms"] == pytest.approx(float(row["p99 latency"]) / 1000)
        else:
            assert step["p99_ms"] <= step["max_ms"], step
    assert any(not step["failure"] for step in steps)
    with grpcclient.InferenceServerClient(exported_server.grpc_url) as client:
        after = client.get_inference_statistics(model, as_json=True)["model_stats"][0]["inference_stats"]
    answered = int(after["success"]["count"]) - int(before.get("success", {}).get("count", 0))
    assert answered >= sum(step["requests"] for step in steps)
    assert int(after.get("fail", {}).get("count", 0)) == int(before.get("fail", {}).get("count", 0))


def test_the_raw_rows_benchmark_measures_both_paths_and_splits_the_server_time(
    exported_repository: Path, tmp_path: Path
) -> None:
    """``python -m lab raw-rows`` at a tiny size: both paths answered, the raw path's server
    time split into its parts, the input forms timed, the report written."""
    out = tmp_path / "raw_rows"
    argv = [sys.executable, "-m", "lab", "raw-rows", "--repository", str(exported_repository),
            "--model", "dlrm_onnx_int8", "--batch-size", "1,64", "--concurrency", "1", "--rounds", "1",
            "--seconds", "0.5", "--warmup", "0.2", "--out", str(out)]  # fmt: skip
    done = subprocess.run(argv, capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    assert "the raw path reaches" in done.stdout
    document = json.loads((out / "raw_rows.json").read_text())
    assert document["stage"] == STAGE_MODEL and document["raw_model"] == "dlrm_onnx_int8_raw"
    steps = document["steps"]
    assert {(s["path"], s["batch_size"]) for s in steps} == {
        (p, b) for p in ("preprocessed", "raw") for b in (1, 64)
    }
    for step in steps:
        assert step["samples_per_s"] > 0 and step["errors"] == 0, step
        server = step["server_ms"]
        assert server["request"] > 0 and server["model compute"] > 0
        if step["path"] == "raw":
            assert server["stage parse"] > 0
            parts = sum(v for k, v in server.items() if k != "request")
            assert parts == pytest.approx(server["request"])
    for timing in document["in_process"]:
        assert all(value > 0 for key, value in timing.items() if key.endswith(" ms"))
    markdown = (out / "raw_rows.md").read_text()
    assert "## Where a raw request's time goes in the server" in markdown
    assert (out / "raw_rows.png").stat().st_size > 0
