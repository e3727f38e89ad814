"""DLRMv3 users through the server: a file of users in, one request per user, scores out.

A users file is JSON Lines, one user a line, the request contract's names
(:func:`bundle.schema.dlrmv3_inputs`): ``user_id`` (an int), the history's ``uih_item_id``,
``uih_category_id``, ``uih_timestamp``, ``uih_action_weight`` (lists of one length, oldest
first, possibly empty) and the candidates' ``candidate_item_id``, ``candidate_category_id``
(lists of one length, at least one), and, for ``evaluate``, ``labels``: each task's 0/1 per
candidate. ``python -m models dlrmv3-users`` writes such files.
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from bundle.errors import ClientError, DataError
from bundle.schema import DLRMV3_CANDIDATE_INPUTS, DLRMV3_HISTORY_INPUTS, DLRMV3_USER_INPUT, dlrmv3_inputs
from clients.triton import TritonClient
from clients.validation import ModelSpec
from criteo.metrics import logloss, roc_auc

LABELS = "labels"


def is_dlrmv3(spec: ModelSpec) -> bool:
    """Whether a served model takes DLRMv3 requests (one user: its history and candidates)."""
    return {tensor.name for tensor in spec.inputs} == {spec.name for spec in dlrmv3_inputs()}


def tasks_of(spec: ModelSpec) -> list[str]:
    """A DLRMv3 model's outputs, one per task, in the server's order."""
    return [tensor.name for tensor in spec.outputs]


def _ints(value: Any, where: str, name: str) -> list[int]:
    if not isinstance(value, list) or not all(isinstance(v, int) and not isinstance(v, bool) for v in value):
        raise DataError(f"{where}: {name} must be a list of integers")
    return value


def read_users(path: Path, max_users: int | None = None) -> Iterator[dict[str, Any]]:
    """The users of a users file, in order, each checked (one clear line naming the line).

    Raises:
        DataError: unreadable, not JSON, a field missing or of another type, lists that disagree
            on their length, no candidate.
    """
    try:
        handle = open(path, encoding="utf-8")  # noqa: SIM115 (closed below, lines read lazily)
    except OSError as exc:
        raise DataError(f"cannot read users file {path}: {exc.strerror}") from None
    with handle:
        count = 0
        for number, line in enumerate(handle, start=1):
            if not line.strip():
                continue
            if max_users is not None and count >= max_users:
                return
            where = f"{path}:{number}"
            try:
                user = json.loads(line)
            except json.JSONDecodeError as exc:
                raise DataError(f"{where}: not JSON ({exc.msg})") from None
            if not isinstance(user, dict):
                raise DataError(f"{where}: expected a JSON object of one user")
            missing = [
                n
                for n in (DLRMV3_USER_INPUT, *DLRMV3_HISTORY_INPUTS, *DLRMV3_CANDIDATE_INPUTS)
                if n not in user
            ]
            if missing:
                raise DataError(f"{where}: missing {', '.join(missing)}")
            if not isinstance(user[DLRMV3_USER_INPUT], int):
                raise DataError(f"{where}: {DLRMV3_USER_INPUT} must be an integer")
            for group in (DLRMV3_HISTORY_INPUTS, DLRMV3_CANDIDATE_INPUTS):
                lengths = {name: len(_ints(user[name], where, name)) for name in group}
                if len(set(lengths.values())) > 1:
                    raise DataError(f"{where}: lists of different lengths {lengths}")
            if not user[DLRMV3_CANDIDATE_INPUTS[0]]:
                raise DataError(f"{where}: no candidate")
            count += 1
            yield user


def user_request(user: dict[str, Any]) -> dict[str, np.ndarray]:
    """One user as a request: ``user_id`` ``[1, 1]``, each list ``[1, n]``, INT64."""
    inputs = {DLRMV3_USER_INPUT: np.asarray([[int(user[DLRMV3_USER_INPUT])]], dtype=np.int64)}
    for name in DLRMV3_HISTORY_INPUTS + DLRMV3_CANDIDATE_INPUTS:
        inputs[name] = np.asarray(user[name], dtype=np.int64).reshape(1, -1)
    return inputs


def score_user(
    client: TritonClient, model: str, user: dict[str, Any], tasks: Sequence[str]
) -> dict[str, list[float]]:
    """One user's scores per task, one per candidate.

    Raises:
        ClientError: the server refused the user (its line), or answered another count.
    """
    answer = client.infer_outputs(model, user_request(user), tasks)
    count = len(user[DLRMV3_CANDIDATE_INPUTS[0]])
    scores = {}
    for task in tasks:
        values = answer[task].reshape(-1)
        if values.size != count:
            raise ClientError(f"model {model!r} answered {values.size} {task} scores for {count} candidates")
        scores[task] = values.astype(float).tolist()
    return scores


@dataclass(frozen=True)
class Summary:
    users: int
    candidates: int
    seconds: float


def infer_file(
    client: TritonClient, model: str, path: Path, out: Path | None, max_users: int | None = None
) -> Summary:
    """Every user of ``path`` through ``model``, one request a user; a line of JSON per user
    (its index, ``user_id`` and each task's scores) to ``out`` or standard output."""
    tasks = tasks_of(client.model_spec(model))
    started = time.perf_counter()
    users = candidates = 0
    sink = open(out, "w", encoding="utf-8") if out is not None else None  # noqa: SIM115
    try:
        for index, user in enumerate(read_users(path, max_users)):
            try:
                scores = score_user(client, model, user, tasks)
            except ClientError as exc:
                raise ClientError(f"{path} user {index + 1}: {exc}") from exc.__cause__
            line = json.dumps({"user": index, DLRMV3_USER_INPUT: user[DLRMV3_USER_INPUT], **scores})
            if sink is not None:
                sink.write(line + "\n")
            else:
                print(line)
            users += 1
            candidates += len(user[DLRMV3_CANDIDATE_INPUTS[0]])
    finally:
        if sink is not None:
            sink.close()
    return Summary(users, candidates, time.perf_counter() - started)


def normalized_entropy(labels: np.ndarray, probabilities: np.ndarray) -> float:
    """Log loss over the entropy of the labels' base rate (1: no better than the base rate)."""
    rate = float(np.mean(labels))
    if rate in (0.0, 1.0):
        return math.nan
    base = -(rate * math.log(rate) + (1 - rate) * math.log(1 - rate))
    return logloss(labels, probabilities) / base


def evaluate_file(
    client: TritonClient, models: Sequence[str], path: Path, max_users: int | None = None
) -> list[dict[str, Any]]:
    """Per model and task: AUC and normalized entropy of the served scores against the file's
    labels, over every candidate.

    Raises:
        DataError: a user without labels for a task the model scores, or labels of another count.
    """
    users = list(read_users(path, max_users))
    results = []
    for model in models:
        tasks = tasks_of(client.model_spec(model))
        scores: dict[str, list[float]] = {task: [] for task in tasks}
        labels: dict[str, list[int]] = {task: [] for task in tasks}
        started = time.perf_counter()
        for index, user in enumerate(users):
            given = user.get(LABELS)
            count = len(user[DLRMV3_CANDIDATE_INPUTS[0]])
            for task in tasks:
                if (
                    not isinstance(given, dict)
                    or not isinstance(given.get(task), list)
                    or len(given[task]) != count
                ):
                    raise DataError(
                        f"{path} user {index + 1}: needs {LABELS}.{task}, one 0/1 per candidate ({count})"
                    )
                labels[task].extend(int(v) for v in given[task])
            for task, values in score_user(client, model, user, tasks).items():
                scores[task].extend(values)
        seconds = time.perf_counter() - started
        for task in tasks:
            y, p = np.asarray(labels[task], dtype=np.float64), np.asarray(scores[task], dtype=np.float64)
            results.append(
                {
                    "model": model, "task": task, "users": len(users), "candidates": int(y.size),
                    "positive_rate": float(y.mean()) if y.size else math.nan,
                    "auc": roc_auc(y, p), "normalized_entropy": normalized_entropy(y, p), "seconds": seconds,
                }
            )  # fmt: skip
    return results
