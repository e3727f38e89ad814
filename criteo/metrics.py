"""Click-through-rate metrics: ROC AUC and logloss, in numpy."""

from __future__ import annotations

import numpy as np

from bundle.errors import DataError


def roc_auc(labels: np.ndarray, scores: np.ndarray) -> float:
    """Area under the ROC curve (ties get the average rank).

    Args:
        labels: ``N`` binary labels.
        scores: ``N`` predicted scores.

    Returns:
        The AUC in [0, 1].

    Raises:
        DataError: when only one class is present or the shapes differ.
    """
    y = np.asarray(labels, dtype=np.float64).ravel()
    s = np.asarray(scores, dtype=np.float64).ravel()
    if y.shape != s.shape:
        raise DataError(f"labels and scores differ in length: {y.size} vs {s.size}")
    positives = float(y.sum())
    negatives = float(y.size - positives)
    if positives == 0 or negatives == 0:
        raise DataError("AUC needs both positive and negative labels")
    order = np.argsort(s, kind="mergesort")
    sorted_scores = s[order]
    ranks = np.empty(s.size, dtype=np.float64)
    # Average ranks over ties so that equal scores count half.
    boundaries = np.flatnonzero(np.diff(sorted_scores)) + 1
    starts = np.concatenate(([0], boundaries))
    ends = np.concatenate((boundaries, [s.size]))
    average = (starts + ends + 1) / 2.0
    ranks[order] = np.repeat(average, ends - starts)
    return float((ranks[y == 1].sum() - positives * (positives + 1) / 2) / (positives * negatives))


def logloss(labels: np.ndarray, probabilities: np.ndarray, eps: float = 1e-7) -> float:
    """Mean binary cross-entropy of probabilities (clipped to ``[eps, 1 - eps]``)."""
    y = np.asarray(labels, dtype=np.float64).ravel()
    p = np.clip(np.asarray(probabilities, dtype=np.float64).ravel(), eps, 1 - eps)
    if y.shape != p.shape:
        raise DataError(f"labels and probabilities differ in length: {y.size} vs {p.size}")
    return float(-np.mean(y * np.log(p) + (1 - y) * np.log(1 - p)))
