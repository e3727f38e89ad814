"""Checks that an exported graph computes what its framework computes."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from bundle.errors import ConfigError, ExportError
from bundle.onnx_session import inference_session
from bundle.schema import CATEGORICAL_INPUT, DENSE_INPUT, NUM_CATEGORICAL, NUM_DENSE, OUTPUT
from criteo.metrics import roc_auc
from criteo.multihot import BagBatch
from criteo.synth import SynthConfig, generate_lines
from criteo.tsv import Batch, parse_lines, read_batch, to_batch


@dataclass(frozen=True)
class ParityResult:
    """One comparison of a graph's output with a reference output.

    Attributes:
        rows: rows compared.
        max_abs_diff: largest absolute difference of the probabilities.
        auc: AUC of the candidate on the labeled rows (None without labels).
        auc_delta: candidate AUC minus reference AUC (None without labels).
    """

    rows: int
    max_abs_diff: float
    auc: float | None
    auc_delta: float | None


def check_rows(data: Path | None, rows: int, seed: int = 20261122) -> Batch:
    """Labeled rows for the checks: the first ``rows`` of ``data``, or synthetic ones."""
    if data is not None:
        batch = read_batch(data, rows)
        if len(batch) < rows:
            raise ExportError(f"{data} has {len(batch)} rows; the checks need {rows}")
        return batch
    lines = [line for chunk in generate_lines(SynthConfig(rows=rows, seed=seed)) for line in chunk]
    return to_batch(parse_lines(lines, path="<synthetic>"))


def extreme_id_rows(batch: Batch, rows: int = 64) -> Batch:
    """Copies of the first ``rows`` rows with ids at the int64 limits, negative
    and far beyond any table: each must still give a valid probability."""
    base = batch.slice(0, rows)
    ids = base.categorical.copy()
    info = np.iinfo(np.int64)
    extremes = np.array([info.min, info.max, -1, -(2**40) - 3, 2**62 + 11, 10**12], dtype=np.int64)
    if isinstance(base, BagBatch):  # bags of any size: every other value extreme
        ids[::2] = extremes[np.arange(ids[::2].size) % extremes.size]
        return base.with_values(ids)
    ids[:] = extremes[np.arange(ids.size).reshape(ids.shape) % extremes.size]
    ids[:, ::2] = base.categorical[:, ::2] * -7
    return Batch(base.dense.copy(), ids, base.labels)


def batch_arrays(batch: Batch) -> tuple[np.ndarray, np.ndarray]:
    """``batch``'s inputs as a framework takes them: ``B x 13`` float32 and ``B x 26`` int64.

    Raises:
        ExportError: the arrays have other shapes.
    """
    dense = np.asarray(batch.dense, dtype=np.float32)
    ids = np.asarray(batch.categorical, dtype=np.int64)
    if dense.ndim != 2 or dense.shape[1] != NUM_DENSE or ids.shape != (len(dense), NUM_CATEGORICAL):
        raise ExportError(
            f"expected {DENSE_INPUT} B x {NUM_DENSE} and {CATEGORICAL_INPUT} "
            f"B x {NUM_CATEGORICAL}, got {dense.shape} and {ids.shape}"
        )
    return dense, ids


def onnx_session(path: Path, quiet: bool = False) -> Any:
    """An ONNX Runtime (CPU) session of the graph at ``path``, as the export's checks run it.

    Args:
        path: the ``.onnx`` file (external data beside it is found).
        quiet: log fatal errors only (for a graph expected to fail on purpose).

    Raises:
        ExportError: ONNX Runtime cannot load it.
    """
    return inference_session(path, quiet=quiet, error=ExportError)


def onnx_cuda_session(path: Path) -> tuple[Any, str]:
    """An ONNX Runtime session of the graph at ``path`` on the CUDA provider, where one runs here.

    Returns:
        ``(session, "")``; or ``(None, why not)`` when this onnxruntime has no CUDA
        provider (the CPU build) or its CUDA provider did not start (no usable GPU).

    Raises:
        ExportError: ONNX Runtime cannot load the graph at all.
    """
    try:
        return inference_session(path, device="gpu", error=ExportError), ""
    except ConfigError as exc:  # no CUDA here: the check is skipped, with the reason
        return None, str(exc)


def run_session(session: Any, batch: Batch, chunk: int = 4096) -> np.ndarray:
    """Probabilities of an ONNX Runtime ``session`` for ``batch``, ``chunk`` rows per call: ``B x 1``."""
    outputs = []
    for start in range(0, len(batch), chunk):
        part = batch.slice(start, start + chunk)
        outputs.append(session.run([OUTPUT], part.inputs())[0])
    return np.concatenate(outputs)


def run_onnx(path: Path, batch: Batch, chunk: int = 4096) -> np.ndarray:
    """Probabilities of the ONNX graph at ``path`` under ONNX Runtime (CPU): ``B x 1``."""
    return run_session(onnx_session(path), batch, chunk)


def compare(candidate: np.ndarray, reference: np.ndarray, labels: np.ndarray | None) -> ParityResult:
    """Compare two ``B x 1`` probability arrays (and their AUCs when labels are given)."""
    if candidate.shape != reference.shape:
        raise ExportError(f"output shapes differ: {candidate.shape} vs {reference.shape}")
    if candidate.dtype != np.float32:
        raise ExportError(f"the exported graph returned {candidate.dtype}, not float32")
    if not np.all(np.isfinite(candidate)):
        raise ExportError("the exported graph returned non-finite probabilities")
    if np.any((candidate < 0) | (candidate > 1)):
        raise ExportError("the exported graph returned values outside [0, 1]")
    diff = float(np.max(np.abs(candidate.astype(np.float64) - reference.astype(np.float64))))
    if labels is None:
        return ParityResult(len(candidate), diff, None, None)
    auc = roc_auc(labels, candidate)
    return ParityResult(len(candidate), diff, auc, auc - roc_auc(labels, reference))
