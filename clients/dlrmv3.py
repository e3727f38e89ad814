"""DLRMv3 users through the server: a file of users in, one request per user, scores out.

A users file is JSON Lines, one user a line, the request contract's names
(:func:`bundle.schema.dlrmv3_inputs`): ``user_id`` (an int), the history's ``uih_item_id``,
``uih_category_id``, ``uih_timestamp``, ``uih_action_weight`` (lists of one length, oldest
first, possibly empty) and the candidates' ``candidate_item_id``, ``candidate_category_id``
(lists of one length, at least one), and, for ``evaluate``, ``labels``: each task's 0/1 per
candidate. ``python -m models dlrmv3-users`` writes such files.
"""

from __future__ import annotations

import asyncio
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
from clients.options import ClientOptions
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
    return _checked(client.infer_outputs(model, user_request(user), tasks), model, user)


@dataclass(frozen=True)
class Summary:
    users: int
    candidates: int
    seconds: float


def _checked(answer: dict[str, np.ndarray], model: str, user: dict[str, Any]) -> dict[str, list[float]]:
    count = len(user[DLRMV3_CANDIDATE_INPUTS[0]])
    scores = {}
    for task, values in answer.items():
        flat = values.reshape(-1)
        if flat.size != count:
            raise ClientError(f"model {model!r} answered {flat.size} {task} scores for {count} candidates")
        scores[task] = flat.astype(float).tolist()
    return scores


async def _score_async(
    options: ClientOptions, model: str, users: list[dict[str, Any]], tasks: Sequence[str], max_in_flight: int
) -> list[dict[str, list[float]]]:
    """Every user's scores over one asyncio client, ``max_in_flight`` requests pending at once,
    in the users' order."""
    from clients.aio import AsyncTritonClient

    gate = asyncio.Semaphore(max(1, max_in_flight))
    async with AsyncTritonClient.from_options(options) as client:

        async def one(index: int, user: dict[str, Any]) -> dict[str, list[float]]:
            async with gate:
                try:
                    answer = await client.infer_outputs(model, user_request(user), tasks)
                except ClientError as exc:
                    raise ClientError(f"user {index + 1}: {exc}") from exc.__cause__
            return _checked(answer, model, user)

        return list(await asyncio.gather(*(one(i, user) for i, user in enumerate(users))))


def infer_file(
    options: ClientOptions,
    model: str,
    path: Path,
    out: Path | None,
    max_users: int | None = None,
    mode: str = "sync",
    max_in_flight: int = 4,
) -> Summary:
    """Every user of ``path`` through ``model``, one request a user (``mode``: ``sync``, one in
    flight; ``async``, up to ``max_in_flight`` on an asyncio client); a line of JSON per user, in
    the file's order (its index, ``user_id`` and each task's scores), to ``out`` or standard
    output."""
    with TritonClient.from_options(options) as client:
        tasks = tasks_of(client.model_spec(model))
        users = list(read_users(path, max_users))
        started = time.perf_counter()
        if mode == "async":
            scored = asyncio.run(_score_async(options, model, users, tasks, max_in_flight))
        else:
            scored = []
            for index, user in enumerate(users):
                try:
                    scored.append(score_user(client, model, user, tasks))
                except ClientError as exc:
                    raise ClientError(f"{path} user {index + 1}: {exc}") from exc.__cause__
        seconds = time.perf_counter() - started
    lines = [
        json.dumps({"user": index, DLRMV3_USER_INPUT: user[DLRMV3_USER_INPUT], **scores})
        for index, (user, scores) in enumerate(zip(users, scored, strict=True))
    ]
    if out is not None:
        out.write_text("".join(line + "\n" for line in lines), encoding="utf-8")
    else:
        for line in lines:
            print(line)
    candidates = sum(len(user[DLRMV3_CANDIDATE_INPUTS[0]]) for user in users)
    return Summary(len(users), candidates, seconds)


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
