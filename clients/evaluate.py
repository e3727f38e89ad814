"""AUC and logloss of served predictions, side by side for several model variants.

Each model gets one pass over a labeled file through the server; with a
reference ONNX file, ONNX Runtime in this process predicts the same rows and
every served model is compared with it (AUC difference, largest absolute
difference of the probabilities).
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np

from bundle.errors import ConfigError, DataError
from clients.batching import Rows
from clients.options import ClientOptions
from clients.predict import PredictOptions, run_file
from clients.reference import OnnxReference
from criteo.metrics import logloss, roc_auc


@dataclass(frozen=True)
class Score:
    """Metrics of one model's predictions on the file.

    Attributes:
        name: model name (or ``reference``).
        rows: rows scored.
        auc: ROC AUC.
        logloss: mean binary cross-entropy.
        seconds: wall time of the pass.
        auc_delta: ``auc - reference auc``; None without a reference.
        max_abs_diff: largest ``|p - p_reference|`` over the rows; None without a reference.
    """

    name: str
    rows: int
    auc: float
    logloss: float
    seconds: float
    auc_delta: float | None = None
    max_abs_diff: float | None = None


@dataclass(frozen=True)
class Evaluation:
    """Scores of every model on one labeled file.

    Attributes:
        input: the file.
        endpoint: ``protocol://host:port`` of the server.
        rows: rows in the file (or the row limit).
        positive_rate: share of label 1.
        scores: one per served model, in the order asked.
        reference: the in-process reference's score, if one was given.
        reference_file: its ONNX file.
    """

    input: str
    endpoint: str
    rows: int
    positive_rate: float
    scores: tuple[Score, ...]
    reference: Score | None = None
    reference_file: str | None = None

    def as_dict(self) -> dict[str, Any]:
        """JSON-ready fields (what ``clients evaluate --json`` prints)."""
        return asdict(self)


class _Collector:
    """A sink that keeps labels and ``N`` probabilities of one pass."""

    def __init__(self) -> None:
        self.labels: list[np.ndarray] = []
        self.probabilities: list[np.ndarray] = []

    def __call__(self, batch: Rows, probabilities: np.ndarray) -> None:
        if batch.labels is None:
            raise DataError("evaluate needs a labeled file (label, 13 counts, 26 ids per line)")
        self.labels.append(batch.labels)
        self.probabilities.append(np.asarray(probabilities, dtype=np.float32).reshape(-1))

    def arrays(self) -> tuple[np.ndarray, np.ndarray]:
        if not self.labels:
            raise DataError("the file holds no rows")
        return np.concatenate(self.labels), np.concatenate(self.probabilities)


def _reference_pass(
    reference: OnnxReference, path: Path, options: PredictOptions
) -> tuple[_Collector, float]:
    started = time.perf_counter()
    collector = _Collector()
    for batch in reference.batches(path, options.batch_size, options.max_rows):
        collector(batch, reference.predict(batch))
    return collector, time.perf_counter() - started


def evaluate(
    client: ClientOptions,
    models: list[str],
    path: Path,
    options: PredictOptions,
    reference: Path | None = None,
) -> Evaluation:
    """Score each served model on a labeled file; compare with an in-process reference if given.

    Args:
        client: the server endpoint and connection options.
        models: model names (e.g. ``dlrm_onnx``, ``dlrm_onnx_fp16``, ``dlrm_trt``).
        path: a labeled Criteo TSV file.
        options: batch size, sync/async, requests in flight, row limit.
        reference: an ONNX file to run with ONNX Runtime in this process on the same rows.

    Raises:
        ClientError: a server or model failure. DataError: an unlabeled or malformed file.
    """
    if not models:
        raise ConfigError("name at least one model to evaluate")
    if len(set(models)) != len(models):
        raise ConfigError(f"a model is named twice: {models}")
    expected: tuple[np.ndarray, np.ndarray] | None = None
    reference_score: Score | None = None
    labels: np.ndarray | None = None
    if reference is not None:
        collector, seconds = _reference_pass(OnnxReference(reference), path, options)
        labels, probabilities = collector.arrays()
        expected = (labels, probabilities)
        reference_score = Score(
            "reference", len(labels), roc_auc(labels, probabilities), logloss(labels, probabilities), seconds
        )
    scores = []
    for model in models:
        collector = _Collector()
        summary = run_file(client, model, path, options, collector)
        model_labels, probabilities = collector.arrays()
        if labels is not None and not np.array_equal(labels, model_labels):
            raise DataError(f"{path} gave different rows on two passes; is it being written to?")
        labels = model_labels
        auc = roc_auc(labels, probabilities)
        delta = diff = None
        if expected is not None and reference_score is not None:
            delta = auc - reference_score.auc
            diff = float(np.max(np.abs(probabilities.astype(np.float64) - expected[1])))
        scores.append(
            Score(model, len(labels), auc, logloss(labels, probabilities), summary.seconds, delta, diff)
        )
    if labels is None:  # unreachable: at least one model was scored; keeps the type checker informed
        raise DataError(f"{path} holds no rows")
    return Evaluation(
        input=str(path),
        endpoint=client.endpoint,
        rows=len(labels),
        positive_rate=float(np.mean(labels)),
        scores=tuple(scores),
        reference=reference_score,
        reference_file=None if reference is None else str(reference),
    )
