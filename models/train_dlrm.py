"""Training of the PyTorch DLRM on a Criteo TSV file.

The embedding table gets sparse gradients and ``SparseAdam`` (only the rows a
batch touched are updated, as in the reference DLRM's sparse SGD); the MLPs
get ``Adam``. The loss is binary cross-entropy on the logits. After training,
validation AUC and logloss are computed and saved with the weights.
"""

from __future__ import annotations

import logging
import os
import time
from dataclasses import asdict
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from bundle.errors import DataError
from criteo.metrics import logloss, roc_auc
from models.config import DLRMConfig, TrainConfig, save_config
from models.data import load_split

if TYPE_CHECKING:
    import torch

    from criteo.tsv import Batch

logger = logging.getLogger(__name__)


def _threads() -> int:
    """CPU cores this process may use (affinity-aware where the OS tells)."""
    if hasattr(os, "sched_getaffinity"):
        return max(1, len(os.sched_getaffinity(0)))
    return max(1, os.cpu_count() or 1)


def _tensors(batch: Batch) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    import torch

    if batch.labels is None:
        raise DataError("training needs labeled rows")
    labels = batch.labels
    return (
        torch.from_numpy(np.ascontiguousarray(batch.dense, dtype=np.float32)),
        torch.from_numpy(np.ascontiguousarray(batch.categorical, dtype=np.int64)),
        torch.from_numpy(np.ascontiguousarray(labels, dtype=np.float32)).unsqueeze(1),
    )


def train_dlrm(
    data: Path, out: Path, model_config: DLRMConfig, train: TrainConfig, valid: Path | None = None
) -> dict[str, float | int]:
    """Train a DLRM and save ``out/model.pt`` (state dict) and ``out/config.json``.

    Args:
        data: labeled Criteo TSV file (optionally ``.gz``).
        out: output directory (created).
        model_config: the architecture.
        train: epochs, batch size, learning rate (of both optimizers), seed, rows.
        valid: a separate labeled file for validation; None holds out the last
            ``train.valid_fraction`` of ``data``.

    Returns:
        Validation metrics: ``{"auc": float, "logloss": float, "rows": int}``.

    Raises:
        DataError: unreadable or unlabeled data, or too few rows to split.
    """
    import torch

    threads = _threads()
    previous_threads = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        return _train(data, out, model_config, train, valid, threads)
    finally:
        torch.set_num_threads(previous_threads)


def _train(
    data: Path, out: Path, model_config: DLRMConfig, train: TrainConfig, valid: Path | None, threads: int
) -> dict[str, float | int]:
    """The body of :func:`train_dlrm`, run with ``threads`` torch threads."""
    import torch
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    from models.dlrm import DLRM, WEIGHTS_FILE, predict_probabilities

    torch.manual_seed(train.seed)
    started = time.perf_counter()
    train_rows, valid_rows = load_split(data, valid, train, model_config.hotness)
    logger.info(
        "read %d training and %d validation rows in %.1f s",
        len(train_rows),
        len(valid_rows),
        time.perf_counter() - started,
    )

    model = DLRM(model_config, sparse=True)
    model.train()
    sparse_params = list(model.embedding.parameters())
    sparse_ids = {id(p) for p in sparse_params}
    dense_params = [p for p in model.parameters() if id(p) not in sparse_ids]
    dense_optimizer = torch.optim.Adam(dense_params, lr=train.learning_rate)
    sparse_optimizer = torch.optim.SparseAdam(sparse_params, lr=train.learning_rate)
    loss_fn = torch.nn.BCEWithLogitsLoss()

    dense, ids, labels = _tensors(train_rows)
    rows = len(train_rows)
    steps_per_epoch = (rows + train.batch_size - 1) // train.batch_size
    generator = torch.Generator().manual_seed(train.seed)
    fit_started = time.perf_counter()
    with Progress(
        TextColumn("[progress.description]{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("loss {task.fields[loss]:.4f}"),
        TimeElapsedColumn(),
        transient=False,
    ) as progress:
        task = progress.add_task("training DLRM", total=train.epochs * steps_per_epoch, loss=float("nan"))
        smoothed: float | None = None
        for epoch in range(train.epochs):
            order = torch.randperm(rows, generator=generator)
            for step in range(steps_per_epoch):
                index = order[step * train.batch_size : (step + 1) * train.batch_size]
                loss = loss_fn(model.logits(dense[index], ids[index]), labels[index])
                dense_optimizer.zero_grad(set_to_none=True)
                sparse_optimizer.zero_grad(set_to_none=True)
                loss.backward()
                dense_optimizer.step()
                sparse_optimizer.step()
                value = float(loss.item())
                smoothed = value if smoothed is None else 0.95 * smoothed + 0.05 * value
                progress.update(task, advance=1, loss=smoothed)
            logger.info("epoch %d/%d: smoothed training loss %.4f", epoch + 1, train.epochs, smoothed)
    fit_seconds = time.perf_counter() - fit_started

    probabilities = predict_probabilities(model, valid_rows)
    if valid_rows.labels is None:
        raise DataError("validation rows have no labels")
    metrics: dict[str, float | int] = {
        "auc": roc_auc(valid_rows.labels, probabilities),
        "logloss": logloss(valid_rows.labels, probabilities),
        "rows": len(valid_rows),
    }
    logger.info(
        "trained on %d rows x %d epochs in %.1f s (%d threads): validation AUC %.4f, logloss %.4f on %d rows",
        rows,
        train.epochs,
        fit_seconds,
        threads,
        metrics["auc"],
        metrics["logloss"],
        metrics["rows"],
    )

    out.mkdir(parents=True, exist_ok=True)
    torch.save(model.state_dict(), out / WEIGHTS_FILE)
    save_config(model_config, out, extra={"validation": dict(metrics), "train": asdict(train)})
    return metrics
