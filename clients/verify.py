"""Served predictions vs ONNX Runtime in-process, for every model of a repository."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from bundle.errors import ClientError, ConfigError, DataError
from bundle.schema import INPUTS
from clients.reference import OnnxReference
from clients.triton import TritonClient
from criteo.synth import SynthConfig, generate_lines
from criteo.tsv import Batch, iter_row_text, parse_lines, read_batch, to_batch


@dataclass(frozen=True)
class VerifyResult:
    """Served vs in-process outputs of one model.

    Attributes:
        model: model name.
        rows: rows sent in each request.
        http_max_abs_diff: largest |served over HTTP - in-process|.
        grpc_max_abs_diff: largest |served over gRPC - in-process|.
    """

    model: str
    rows: int
    http_max_abs_diff: float
    grpc_max_abs_diff: float

    @property
    def max_abs_diff(self) -> float:
        return max(self.http_max_abs_diff, self.grpc_max_abs_diff)


def _synthetic_lines(rows: int, seed: int) -> list[str]:
    return [line for chunk in generate_lines(SynthConfig(rows=rows, seed=seed)) for line in chunk]


def sample_rows(data: Path | None, rows: int, seed: int = 7) -> Batch:
    """``rows`` rows of ``data``, or synthetic rows when no file is given."""
    if data is not None:
        return read_batch(data, rows)
    return to_batch(parse_lines(_synthetic_lines(rows, seed), path="<synthetic>"))


def sample_rows_with_text(data: Path | None, rows: int, seed: int = 7) -> tuple[Batch, np.ndarray]:
    """:func:`sample_rows` (same arguments), and the same rows as their unlabeled text, unparsed:
    a 1-D ``bytes`` array, one row each, what a raw-row model takes. Synthetic rows are
    generated once for both."""
    if data is not None:
        batch = read_batch(data, rows)
        chunk = next(iter_row_text(data, chunk_rows=len(batch)), None)
        if chunk is None:
            raise DataError(f"{data}: no rows")
        return batch, np.asarray(chunk.rows[:, 0].tolist(), dtype=np.bytes_)
    lines = _synthetic_lines(rows, seed)
    unlabeled = [line.rstrip("\r\n").split("\t", 1)[1].encode("ascii") for line in lines]
    return to_batch(parse_lines(lines, path="<synthetic>")), np.asarray(unlabeled, dtype=np.bytes_)


def _takes_the_schema(config_file: Path) -> bool:
    """Whether the model's inputs are the schema's (a hot/cold model's dense part and
    embedding stage take other tensors: only its ensemble serves the schema)."""
    # bundle.repository loads tritonclient's gRPC protobufs: imported where needed, so importing
    # this module (and the loadtest CLI that does) stays cheap.
    from bundle.repository import read_config

    try:
        config = read_config(config_file)
    except ConfigError:
        return False
    return sorted(t.name for t in config.input) == sorted(spec.name for spec in INPUTS)


def repository_models(repository: Path) -> list[str]:
    """Names of the models in ``repository`` that take the schema's inputs and have an ONNX
    version 1 (the file the in-process reference runs; a hot/cold model's ensemble has none)."""
    from bundle.repository import CONFIG_NAME, MODEL_FILE, version_dir

    return sorted(
        d.name
        for d in repository.iterdir()
        if (d / CONFIG_NAME).is_file()
        and (version_dir(repository, d.name) / MODEL_FILE).is_file()
        and _takes_the_schema(d / CONFIG_NAME)
    )


def in_process(model_file: Path, batch: Batch) -> np.ndarray:
    """Probabilities of ``model_file`` under ONNX Runtime in this process: ``B x 1``."""
    return OnnxReference(model_file).predict(batch)


def verify_repository(
    repository: Path, http_url: str, grpc_url: str, batch: Batch, models: list[str] | None = None
) -> list[VerifyResult]:
    """Send ``batch`` once over HTTP and once over gRPC to each model; compare with in-process ORT."""
    from bundle.repository import MODEL_FILE, version_dir

    names = models or repository_models(repository)
    if not names:
        raise ClientError(f"{repository} holds no ONNX models")
    results = []
    with TritonClient(http_url, "http") as http, TritonClient(grpc_url, "grpc") as grpc:
        for name in names:
            expected = in_process(version_dir(repository, name) / MODEL_FILE, batch)
            diffs = []
            for client in (http, grpc):
                served = client.infer(name, batch.inputs())
                if served.shape != expected.shape:
                    raise ClientError(f"{name}: served shape {served.shape}, expected {expected.shape}")
                diffs.append(float(np.max(np.abs(served.astype(np.float64) - expected))))
            results.append(VerifyResult(name, len(batch), diffs[0], diffs[1]))
    return results
