"""A ranking variant beside each exported ONNX model, checked against it on the tiled rows.

``<model>_ranking`` (:func:`bundle.schema.ranking_model_name`) takes one user and its
candidates a request (:mod:`export.ranking.graph`); its config batches users with
Triton's ragged batching (:func:`bundle.repository.build_ranking_config`). Before it is
kept, the check rows are dealt into users of several sizes (the user's features from
the first row of its group, each row a candidate) and the variant must give, for every
candidate, the flat model's answer on its tiled row within :data:`TOLERANCE`, both one
user a call and :data:`CHECK_USERS` users a call.
"""

from __future__ import annotations

import itertools
import logging
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from bundle.errors import ExportError
from bundle.repository import MODEL_FILE, ServingConfig, add_ranking_model, clear_model, version_dir
from bundle.schema import CATEGORICAL_INPUT, DENSE_INPUT, FeatureSplit, ranking_feeds, ranking_model_name
from criteo.tsv import Batch
from export.graphs.ids import graph_hotness
from export.graphs.onnx_io import save_model
from export.graphs.parity import ParityResult, onnx_session
from export.ranking.graph import ranking_graph
from export.tables.lookups import load_graph

log = logging.getLogger(__name__)

#: Max |ranking - flat on the tiled rows| over the check's candidates.
TOLERANCE = 1e-6
#: Candidates per user of the check, dealt in turn (1 and odd sizes catch an off-by-one).
CHECK_SIZES = (1, 7, 64, 3, 200, 16)
#: Users per call of the batched half of the check.
CHECK_USERS = 8
#: Candidates of the check at most (the check rows' first ones).
CHECK_CANDIDATES = 2048


@dataclass(frozen=True)
class RankingVariant:
    """A ranking variant written, and its check."""

    name: str
    path: Path
    parity: ParityResult
    seconds: float
    once: int
    lookups: int


def user_requests(
    rows: Batch, split: FeatureSplit, hotness: tuple[int, ...] | None, sizes: tuple[int, ...] = CHECK_SIZES
) -> list[dict[str, np.ndarray]]:
    """``rows`` dealt into one-user requests of ``sizes`` candidates in turn (the last one takes
    what is left): the user's part from its first row, each row a candidate."""
    requests = []
    start = 0
    for size in itertools.cycle(sizes):
        if start >= len(rows):
            break
        stop = min(start + size, len(rows))
        requests.append(split.split(rows.dense[start:stop], rows.categorical[start:stop], hotness))
        start = stop
    return requests


def check_ranking(
    flat: Any,
    ranking: Any,
    requests: list[dict[str, np.ndarray]],
    split: FeatureSplit,
    hotness: tuple[int, ...] | None,
) -> ParityResult:
    """The ranking session against the flat one, one user a call and :data:`CHECK_USERS` a call,
    each call beside the flat model on the same users' tiled rows: the largest difference of all.

    (The flat model on another batch of rows may round a row's last bits otherwise: ONNX
    Runtime's threads share a batch's work out by its size.)

    Raises:
        ExportError: an answer of another shape, or a non-finite one.
    """
    worst = 0.0
    rows = 0
    for users in (1, CHECK_USERS):
        for start in range(0, len(requests), users):
            group = requests[start : start + users]
            tiled = [split.tile(request, hotness) for request in group]
            dense = np.concatenate([part for part, _ in tiled])
            ids = np.concatenate([part for _, part in tiled])
            reference = flat.run(None, {DENSE_INPUT: dense, CATEGORICAL_INPUT: ids})[0]
            got = ranking.run(None, ranking_feeds(group, split, hotness))[0]
            if got.shape != reference.shape:
                raise ExportError(
                    f"the ranking variant answered shape {list(got.shape)}, expected {list(reference.shape)}"
                )
            if not np.all(np.isfinite(got)):
                raise ExportError("the ranking variant answered non-finite probabilities")
            worst = max(worst, float(np.max(np.abs(got.astype(np.float64) - reference.astype(np.float64)))))
            rows += len(reference) if users == 1 else 0
    return ParityResult(rows, worst, None, None)


def write_ranking_variant(
    repository: Path,
    model: str,
    split: FeatureSplit,
    serving: ServingConfig,
    rows: Batch,
    report: dict[str, Any],
    fp16: bool = False,
) -> RankingVariant:
    """Write ``<model>_ranking`` from ``model``'s ONNX graph in ``repository``, check it, add its config.

    Args:
        repository: the (staging) repository holding ``model``.
        model: a flat ONNX model's name (``dlrm_onnx_int8``).
        split: which features are the user's.
        serving: how Triton serves the flat model (the variant batches users with its settings).
        rows: check rows (the first :data:`CHECK_CANDIDATES`).
        report: fields the variant's export report starts from.
        fp16: the graph is the FP16 variant.

    Raises:
        ExportError: the graph cannot be made ranking, or its check fails; nothing is left.
    """
    name = ranking_model_name(model)
    source_path = version_dir(repository, model, 1) / MODEL_FILE
    path = version_dir(repository, name, 1) / MODEL_FILE
    clear_model(repository, name)
    try:
        start = time.perf_counter()
        source, folder = load_graph(source_path)
        hotness = graph_hotness(source)
        made = ranking_graph(source, split)
        save_model(made.model, path, source_dir=folder)
        requests = user_requests(rows.slice(0, min(len(rows), CHECK_CANDIDATES)), split, hotness)
        parity = check_ranking(
            onnx_session(source_path, quiet=True), onnx_session(path, quiet=True), requests, split, hotness
        )
        if parity.max_abs_diff > TOLERANCE:
            raise ExportError(
                f"{path}: the ranking variant differs from {model} on the tiled rows by "
                f"{parity.max_abs_diff:.3g} (tolerance {TOLERANCE:g})"
            )
        seconds = time.perf_counter() - start
        add_ranking_model(
            repository,
            name,
            serving,
            split,
            report={
                **report,
                "model": name,
                "checked_against": f"{model} on the tiled rows ({len(requests)} users)",
                "parity": {"rows": parity.rows, "max_abs_diff": parity.max_abs_diff},
                "user_features": split.text,
                "lookups_once": made.once,
                "lookups": made.lookups,
                "lookups_tiled": list(made.tiled),
                "seconds": round(seconds, 3),
            },
            hotness=hotness,
            fp16=fp16,
        )
        log.info(
            "%s: %d of %d lookups once per user; max abs diff %.3g against %s on %d candidates of %d users",
            name, made.once, made.lookups, parity.max_abs_diff, model, parity.rows, len(requests),
        )  # fmt: skip
        return RankingVariant(name, path, parity, seconds, made.once, made.lookups)
    except BaseException:
        clear_model(repository, name)
        raise
