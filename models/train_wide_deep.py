"""Training of Wide & Deep on a Criteo file, written out as a TensorFlow SavedModel.

The logit model (sharing every weight with the served model) trains with
``BinaryCrossentropy(from_logits=True)``, which is numerically stable where a
loss on probabilities is not. The served model (sigmoid output) is validated
with :mod:`criteo.metrics` and exported with its ``config.json`` beside it::

    out/
      config.json      architecture, validation metrics, training options
      saved_model/     serving_default: dense_features, categorical_ids -> click_probability
"""

from __future__ import annotations

import logging
import shutil
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

import numpy as np
from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)

from bundle.errors import DataError
from criteo.metrics import logloss, roc_auc
from criteo.tsv import Batch
from models.config import TrainConfig, WideDeepConfig, save_config
from models.data import load_split

# keras comes through models.wide_deep, which quiets TensorFlow before importing it.
from models.wide_deep import build_wide_deep, export_saved_model, keras, logit_model

logger = logging.getLogger(__name__)

#: Folder of the SavedModel inside the output directory.
SAVED_MODEL_DIR = "saved_model"
#: Rows per step when predicting validation rows.
PREDICT_BATCH = 8192
#: Seconds between redraws of the progress bar.
REFRESH_SECONDS = 0.5


def predict_probabilities(model: keras.Model, rows: Batch) -> np.ndarray:
    """The served model's probabilities for ``rows``: ``B`` float32."""
    return np.asarray(
        model.predict(rows.inputs(), batch_size=PREDICT_BATCH, verbose=0), dtype=np.float32
    ).ravel()


def evaluate(model: keras.Model, rows: Batch) -> dict[str, float]:
    """ROC AUC and logloss of the served model on labeled ``rows``.

    Returns:
        ``{"auc": ..., "logloss": ..., "rows": ...}``.
    """
    if rows.labels is None:
        raise DataError("evaluate needs labeled rows")
    probabilities = predict_probabilities(model, rows)
    return {
        "auc": roc_auc(rows.labels, probabilities),
        "logloss": logloss(rows.labels, probabilities),
        "rows": len(rows),
    }


def _dataset(rows: Batch, batch_size: int, seed: int) -> Any:
    """A ``tf.data`` pipeline of shuffled (reshuffled every epoch) batches of ``rows``.

    Built here rather than by Keras from numpy arrays: the iterator of Keras'
    autotuned pipeline was slow to shut down at the end of every epoch on a
    2-core machine, for a good part of the epoch's own time (``small`` preset).
    This one shuts down at once.
    """
    from bundle.native import import_tensorflow

    tf = import_tensorflow()
    if rows.labels is None:
        raise DataError("training needs labeled rows")
    dataset = tf.data.Dataset.from_tensor_slices((rows.inputs(), rows.labels.reshape(-1, 1)))
    dataset = dataset.shuffle(len(rows), seed=seed, reshuffle_each_iteration=True)
    options = tf.data.Options()
    options.autotune.enabled = False
    return dataset.batch(batch_size).prefetch(2).with_options(options)


class RichProgress(keras.callbacks.Callback):
    """Drives a rich progress bar over all training steps, showing the running loss,
    and validates the served model after every epoch.

    Args:
        progress: a started :class:`rich.progress.Progress`.
        steps_per_epoch: batches in one epoch.
        epochs: number of epochs.
        served: the served (probability) model, sharing weights with the trained one.
        valid: labeled validation rows.
    """

    def __init__(
        self,
        progress: Progress,
        steps_per_epoch: int,
        epochs: int,
        served: keras.Model,
        valid: Batch,
    ) -> None:
        super().__init__()
        self.progress = progress
        self.steps_per_epoch = steps_per_epoch
        self.epochs = epochs
        self.served = served
        self.valid = valid
        self.epoch = 0
        self.metrics: dict[str, float] = {}
        self._last_refresh = 0.0
        self.task = progress.add_task("training", total=steps_per_epoch * epochs, loss=float("nan"), epoch=1)

    def on_epoch_begin(self, epoch: int, logs: dict[str, Any] | None = None) -> None:
        self.epoch = epoch
        self.progress.update(self.task, epoch=epoch + 1)

    def on_train_batch_end(self, batch: int, logs: dict[str, Any] | None = None) -> None:
        loss = float((logs or {}).get("loss", float("nan")))
        self.progress.update(self.task, advance=1, loss=loss)
        now = time.monotonic()
        if now - self._last_refresh >= REFRESH_SECONDS:
            self._last_refresh = now
            self.progress.refresh()

    def on_epoch_end(self, epoch: int, logs: dict[str, Any] | None = None) -> None:
        self.metrics = evaluate(self.served, self.valid)
        logger.info(
            "epoch %d/%d: train loss %.4f, validation AUC %.4f, logloss %.4f (%d rows)",
            epoch + 1,
            self.epochs,
            float((logs or {}).get("loss", float("nan"))),
            self.metrics["auc"],
            self.metrics["logloss"],
            self.metrics["rows"],
        )


def train_wide_deep(
    data: Path,
    out: Path,
    model_config: WideDeepConfig,
    train: TrainConfig,
    valid: Path | None = None,
) -> dict[str, float]:
    """Train Wide & Deep on a labeled Criteo file and write the served model.

    Args:
        data: labeled Criteo TSV (optionally ``.gz``).
        out: output folder; gets ``saved_model/`` and ``config.json``.
        model_config: architecture.
        train: training options (epochs, batch size, learning rate, seed, rows).
        valid: a separate labeled validation file, or None to hold out the last
            ``train.valid_fraction`` of ``data``.

    Returns:
        Validation metrics of the final model: ``{"auc", "logloss", "rows"}``.
    """
    keras.utils.set_random_seed(train.seed)
    train_rows, valid_rows = load_split(Path(data), valid, train)
    if train_rows.labels is None or valid_rows.labels is None:
        raise DataError("load_split returned unlabeled rows")
    logger.info(
        "training Wide & Deep (%d table rows, embedding_dim %d, deep_mlp %s) on %d rows, validating on %d",
        model_config.embedding_rows,
        model_config.embedding_dim,
        list(model_config.deep_mlp),
        len(train_rows),
        len(valid_rows),
    )

    served = build_wide_deep(model_config)
    trained = logit_model(served)
    trained.compile(
        optimizer=keras.optimizers.Adam(learning_rate=train.learning_rate),
        loss=keras.losses.BinaryCrossentropy(from_logits=True),
    )
    steps_per_epoch = -(-len(train_rows) // train.batch_size)
    start = time.perf_counter()
    with Progress(
        TextColumn("[bold]{task.description}[/] epoch {task.fields[epoch]}"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("loss {task.fields[loss]:.4f}"),
        TimeElapsedColumn(),
        TimeRemainingColumn(),
        console=Console(stderr=True),
        # Redrawn from the training callback (at most every REFRESH_SECONDS) rather
        # than by rich's refresh thread, which would compete with TensorFlow's threads.
        auto_refresh=False,
    ) as progress:
        callback = RichProgress(progress, steps_per_epoch, train.epochs, served, valid_rows)
        trained.fit(
            _dataset(train_rows, train.batch_size, train.seed),
            epochs=train.epochs,
            shuffle=False,  # the dataset reshuffles itself every epoch
            verbose=0,
            callbacks=[callback],
        )
    seconds = time.perf_counter() - start
    metrics = callback.metrics
    logger.info(
        "trained in %.1f s (%.0f rows/s): validation AUC %.4f, logloss %.4f",
        seconds,
        len(train_rows) * train.epochs / seconds,
        metrics["auc"],
        metrics["logloss"],
    )

    out = Path(out)
    saved_model = out / SAVED_MODEL_DIR
    if (saved_model / "saved_model.pb").is_file():
        # A previous run's SavedModel: replace it rather than mix variable files.
        shutil.rmtree(saved_model)
    export_saved_model(served, saved_model)
    save_config(
        model_config,
        out,
        extra={
            "validation": metrics,
            "train": asdict(train),
            "train_rows": len(train_rows),
            "train_seconds": round(seconds, 2),
        },
    )
    logger.info("wrote %s and %s", saved_model, out / "config.json")
    return metrics
