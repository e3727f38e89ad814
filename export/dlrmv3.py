"""DLRMv3 (HSTU) from a checkpoint to a served model: ONNX FP32, checked, in a repository.

``python -m export dlrmv3 --checkpoint model.pt --config config.json --repository REPO``
loads the checkpoint (the reference's ``state_dict`` key names) into the bundle's model
(:mod:`models.dlrmv3`), writes it as ONNX with Triton's ragged batching of users around it
(:class:`RaggedDlrmv3`), checks the file under ONNX Runtime against the eager model, and only
then moves ``dlrmv3`` into the repository (all or nothing).

The served contract (:func:`bundle.schema.dlrmv3_inputs`): one user a request, every input
INT64; the model gets a batch of users as Triton's ragged batching makes it, each history and
candidate input the users' values concatenated, with ``batch_input``s for each user's counts
and the batch's longest (:func:`bundle.repository.build_dlrmv3_config`), and answers one
output per task, every user's candidates concatenated, which Triton cuts back into each
request's ``[1, C]``.
"""

from __future__ import annotations

import logging
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from bundle.errors import ExportError
from bundle.repository import (
    CONFIG_NAME,
    MODEL_FILE,
    ServingConfig,
    build_dlrmv3_config,
    write_config,
    write_report,
)
from bundle.schema import (
    DLRMV3_CANDIDATE_INPUTS,
    DLRMV3_CANDIDATE_LENGTHS,
    DLRMV3_CANDIDATE_WIDTH,
    DLRMV3_HISTORY_INPUTS,
    DLRMV3_HISTORY_LENGTHS,
    DLRMV3_HISTORY_WIDTH,
    DLRMV3_MODEL,
    DLRMV3_USER_INPUT,
)
from bundle.staging import RepositoryWrite
from models.dlrmv3 import Dlrmv3, Dlrmv3Config, load_state, load_state_dict, pad_users, synthetic_users

log = logging.getLogger(__name__)

#: The ONNX opset: ``BitwiseAnd`` (the action bitmask) is there from 18 on.
OPSET = 18
#: The largest difference from the eager model an exported variant may show, on any score.
TOLERANCE = 1e-5
#: The model's inputs in the exported graph's order: the request's, then Triton's batch inputs.
GRAPH_INPUTS = (
    DLRMV3_USER_INPUT,
    *DLRMV3_HISTORY_INPUTS,
    *DLRMV3_CANDIDATE_INPUTS,
    DLRMV3_HISTORY_LENGTHS,
    DLRMV3_CANDIDATE_LENGTHS,
    DLRMV3_HISTORY_WIDTH,
    DLRMV3_CANDIDATE_WIDTH,
)


def _padded(flat: torch.Tensor, lengths: torch.Tensor, width: int) -> torch.Tensor:
    """Users' values concatenated (``flat``, ``sum(lengths)``) as ``(B, width)``, zeros past each
    user's own (``flat`` may be empty)."""
    starts = torch.cumsum(lengths, 0) - lengths
    columns = torch.arange(width, device=flat.device).view(1, -1)
    valid = columns < lengths.view(-1, 1)
    spare = torch.cat([flat, torch.zeros(1, dtype=flat.dtype, device=flat.device)])
    index = torch.where(valid, starts.view(-1, 1) + columns, torch.full_like(columns, flat.shape[0]))
    return spare[index]


class RaggedDlrmv3(nn.Module):
    """The model as Triton's ragged batching of users feeds it (see the module); its outputs,
    one per task, each every user's candidates concatenated."""

    def __init__(self, model: Dlrmv3) -> None:
        super().__init__()
        self.model = model

    def forward(
        self,
        user_id: torch.Tensor,
        uih_item_id: torch.Tensor,
        uih_category_id: torch.Tensor,
        uih_timestamp: torch.Tensor,
        uih_action_weight: torch.Tensor,
        candidate_item_id: torch.Tensor,
        candidate_category_id: torch.Tensor,
        uih_lengths: torch.Tensor,
        candidate_lengths: torch.Tensor,
        uih_width: torch.Tensor,
        candidate_width: torch.Tensor,
    ) -> tuple[torch.Tensor, ...]:
        # One batch size for every per-user tensor (an exported program then knows they agree,
        # instead of guarding against one of them being 1).
        users = user_id.shape[0]
        history = uih_lengths.to(torch.int64).reshape(users)
        candidates = candidate_lengths.to(torch.int64).reshape(users)
        width_h, width_c = uih_width.shape[0], candidate_width.shape[0]
        scores = self.model(
            user_id.reshape(-1),
            _padded(uih_item_id, history, width_h),
            _padded(uih_category_id, history, width_h),
            _padded(uih_timestamp, history, width_h),
            _padded(uih_action_weight, history, width_h),
            history,
            _padded(candidate_item_id, candidates, width_c),
            _padded(candidate_category_id, candidates, width_c),
            candidates,
        )
        # Each of the batch's candidates (users in order, each user's in order): its user and its
        # place among that user's, from the inputs' shapes alone (no shape depends on values).
        flat = torch.arange(candidate_item_id.shape[0], device=scores.device)
        starts = torch.cumsum(candidates, 0) - candidates
        owner = (flat.view(-1, 1) >= starts.view(1, -1)).sum(dim=1) - 1
        owner = torch.clamp(owner, min=0)
        place = flat - starts[owner]  # < that user's count <= width_c
        chosen = scores[owner, place]  # (sum(C), T)
        return tuple(chosen[:, task] for task in range(scores.shape[-1]))


def ragged_feeds(users: list[dict[str, Any]]) -> dict[str, np.ndarray]:
    """What Triton hands the model for a batch of one-user requests (:data:`GRAPH_INPUTS`)."""
    feeds: dict[str, np.ndarray] = {
        DLRMV3_USER_INPUT: np.asarray([[int(user[DLRMV3_USER_INPUT])] for user in users], dtype=np.int64)
    }
    for name in DLRMV3_HISTORY_INPUTS + DLRMV3_CANDIDATE_INPUTS:
        feeds[name] = np.concatenate([np.asarray(user[name], dtype=np.int64).reshape(-1) for user in users])
    history = np.asarray([len(user[DLRMV3_HISTORY_INPUTS[0]]) for user in users], dtype=np.int32)
    candidates = np.asarray([len(user[DLRMV3_CANDIDATE_INPUTS[0]]) for user in users], dtype=np.int32)
    feeds[DLRMV3_HISTORY_LENGTHS], feeds[DLRMV3_CANDIDATE_LENGTHS] = history, candidates
    feeds[DLRMV3_HISTORY_WIDTH] = np.zeros(int(history.max()), dtype=np.int32)
    feeds[DLRMV3_CANDIDATE_WIDTH] = np.zeros(int(candidates.max()), dtype=np.int32)
    return feeds


def write_onnx(model: Dlrmv3, path: Path) -> Path:
    """``model`` as ONNX (:class:`RaggedDlrmv3`), every count dynamic."""
    import warnings

    example = ragged_feeds(synthetic_users(model.config, 3, seed=1, history=(2, 6), candidates=(2, 4)))
    users, values_h, values_c = "users", "history_values", "candidate_values"
    axes: dict[str, dict[int, str]] = {DLRMV3_USER_INPUT: {0: users}}
    axes |= {name: {0: values_h} for name in DLRMV3_HISTORY_INPUTS}
    axes |= {name: {0: values_c} for name in DLRMV3_CANDIDATE_INPUTS}
    axes |= {DLRMV3_HISTORY_LENGTHS: {0: users}, DLRMV3_CANDIDATE_LENGTHS: {0: users}}
    axes |= {DLRMV3_HISTORY_WIDTH: {0: "history_width"}, DLRMV3_CANDIDATE_WIDTH: {0: "candidate_width"}}
    tasks = [task.name for task in model.config.tasks]
    axes |= {task: {0: values_c} for task in tasks}
    path.parent.mkdir(parents=True, exist_ok=True)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the tracer's notes on shapes read as ints
        torch.onnx.export(
            RaggedDlrmv3(model).eval(),
            tuple(torch.from_numpy(example[name]) for name in GRAPH_INPUTS),
            str(path),
            input_names=list(GRAPH_INPUTS),
            output_names=tasks,
            dynamic_axes=axes,
            opset_version=OPSET,
            dynamo=False,
        )
    return path


def check_users(config: Dlrmv3Config, seed: int = 0) -> list[list[dict[str, Any]]]:
    """The batches an export is checked on: single users (an empty history, the longest history
    the config keeps and past it, the most candidates, one candidate, others drawn), and one
    batch of eight users of different lengths."""
    longest, most = config.max_uih_len, config.max_num_candidates_inference
    edges = [
        synthetic_users(config, 1, seed, history=(0, 0), candidates=(1, 3))[0],
        synthetic_users(config, 1, seed + 1, history=(longest, longest), candidates=(most, most))[0],
        synthetic_users(config, 1, seed + 2, history=(longest + 5, longest + 5), candidates=(1, 1))[0],
    ]
    drawn = synthetic_users(config, 8, seed + 3)
    return [[user] for user in edges + drawn[:3]] + [drawn]


def eager_scores(model: Dlrmv3, users: list[dict[str, Any]]) -> list[np.ndarray]:
    """Each task's scores of ``users``' candidates, concatenated (each user scored as alone)."""
    with torch.no_grad():
        scores = model(**pad_users(users))
    counts = [len(user[DLRMV3_CANDIDATE_INPUTS[0]]) for user in users]
    rows = torch.cat([scores[row, :count] for row, count in enumerate(counts)])
    return [rows[:, task].numpy() for task in range(rows.shape[1])]


def check_onnx(model: Dlrmv3, path: Path) -> float:
    """The largest difference between ``path`` under ONNX Runtime and the eager model over
    :func:`check_users`.

    Raises:
        ExportError: above :data:`TOLERANCE` (the users and the difference named).
    """
    import onnxruntime as ort

    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    worst = 0.0
    for users in check_users(model.config):
        served = session.run(None, ragged_feeds(users))
        expected = eager_scores(model, users)
        difference = max(float(np.abs(a - b).max()) for a, b in zip(served, expected, strict=True))
        if not difference <= TOLERANCE:
            lengths = [(len(u[DLRMV3_HISTORY_INPUTS[0]]), len(u[DLRMV3_CANDIDATE_INPUTS[0]])) for u in users]
            raise ExportError(
                f"dlrmv3 ONNX differs from the eager model by {difference:.3g} (> {TOLERANCE:g}) "
                f"on users of (history, candidates) {lengths}"
            )
        worst = max(worst, difference)
    return worst


#: A training run's checkpoint folder (the reference's ``save_dmp_checkpoint``): the tables in a
#: ``torch.distributed.checkpoint`` folder, the rest in a ``torch.save`` under ``dense_dict``.
SPARSE_FOLDER = "sparse"
DENSE_FILE = "non_sparse.ckpt"
DENSE_KEY = "dense_dict"


def load_checkpoint(model: Dlrmv3, path: Path) -> None:
    """Load a DLRMv3 checkpoint into ``model``: a ``torch.save`` of its state dict, or a training
    run's folder (:data:`SPARSE_FOLDER` and :data:`DENSE_FILE`).

    Raises:
        ConfigError: neither, or a state that is not the config's model.
    """
    path = Path(path)
    if not path.is_dir():
        load_state(model, path)
        return
    from bundle.errors import ConfigError
    from export.importers.distributed_checkpoint import is_distributed_checkpoint, load_distributed_checkpoint

    sparse, dense = path / SPARSE_FOLDER, path / DENSE_FILE
    if not is_distributed_checkpoint(sparse) or not dense.is_file():
        raise ConfigError(
            f"{path} is a folder: a DLRMv3 checkpoint folder holds {SPARSE_FOLDER}/ (a "
            f"torch.distributed.checkpoint of the tables) and {DENSE_FILE}"
        )
    try:
        saved = torch.load(dense, map_location="cpu", weights_only=True)
    except Exception as exc:  # torch raises many kinds for a file that is no checkpoint
        first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
        raise ConfigError(f"{dense} is no PyTorch checkpoint: {first}") from None
    if not isinstance(saved, dict) or not isinstance(saved.get(DENSE_KEY), dict):
        raise ConfigError(f"{dense} holds no {DENSE_KEY!r} (the dense part of a DLRMv3 training checkpoint)")
    tables = load_distributed_checkpoint(sparse)
    load_state_dict(model, {**saved[DENSE_KEY], **tables}, str(path))


def export_dlrmv3(
    checkpoint: Path, config_path: Path, repository: Path, serving: ServingConfig | None = None
) -> dict[str, Any]:
    """Export ``checkpoint`` (:func:`load_checkpoint`) of the model ``config_path`` describes
    into ``repository`` as :data:`bundle.schema.DLRMV3_MODEL`; its report (also written beside
    its config as ``export_report.json``).

    Raises:
        ConfigError: the config or the checkpoint is not a DLRMv3 (named).
        ExportError: the ONNX file does not answer as the eager model.
    """
    serving = serving or ServingConfig()
    config = Dlrmv3Config.load(config_path)
    model = Dlrmv3(config).eval()
    load_checkpoint(model, checkpoint)
    started = time.perf_counter()
    with RepositoryWrite(repository, "export dlrmv3") as write:
        staged = write.staged / DLRMV3_MODEL
        onnx_path = write_onnx(model, staged / "1" / MODEL_FILE)
        difference = check_onnx(model, onnx_path)
        report = {
            "model": DLRMV3_MODEL,
            "source": {"checkpoint": str(checkpoint), "config": str(config_path)},
            "variants": {
                "onnx_fp32": {"max_abs_diff": difference, "tolerance": TOLERANCE, "opset": OPSET},
            },
            "checked_on": "single users (an empty history, the longest kept, past it, the most candidates) "
            "and a batch of eight, against the eager model",
            "tasks": [task.name for task in config.tasks],
            "max_uih_len": config.max_uih_len,
            "max_num_candidates_inference": config.max_num_candidates_inference,
            "seconds": round(time.perf_counter() - started, 1),
        }
        tasks = tuple(task.name for task in config.tasks)
        limit = config.max_num_candidates_inference
        write_config(staged, build_dlrmv3_config(DLRMV3_MODEL, serving, tasks, limit))
        write_report(write.staged, DLRMV3_MODEL, report)
        assert (staged / CONFIG_NAME).is_file()
        write.put(staged, repository / DLRMV3_MODEL)
        write.commit()
    log.info("dlrmv3: ONNX FP32 within %.2g of the eager model; %s", difference, repository / DLRMV3_MODEL)
    return report
