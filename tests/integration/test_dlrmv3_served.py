"""DLRMv3 (HSTU) through the real local tritonserver, over HTTP and gRPC.

The checkpoints are MLCommons' reference models of ``tests/reference/dlrmv3/`` (two shapes, their
seeded weights rebuilt from the numbers there), exported by the real CLI. Each user is one request;
its scores must be the reference's scores of that user run alone (histories past the limit cut
as the reference cuts them), one user at a time and eight clients at once, whoever the server
batches it with. A bad request gets one error line and the server answers the next.
"""

from __future__ import annotations

import json
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from tritonclient.utils import InferenceServerException

from bundle.repository import read_config
from bundle.schema import DLRMV3_CANDIDATE_INPUTS, DLRMV3_HISTORY_INPUTS, DLRMV3_MODEL
from clients.dlrmv3 import user_request
from models.dlrmv3 import Dlrmv3, Dlrmv3Config, fill_uniform
from server import LocalServer
from tests import raw_triton

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
REFERENCE = ROOT / "tests" / "reference" / "dlrmv3"
TOLERANCE = 1e-5
PROTOCOLS = ("http", "grpc")


@pytest.fixture(scope="module", params=["tiny", "small"])
def reference(request: pytest.FixtureRequest) -> dict[str, Any]:
    """Each shape's reference run (two shapes: 2 layers of width 32, 3 of width 48 with 4 heads)."""
    return json.loads((REFERENCE / f"{request.param}.json").read_text())


@pytest.fixture(scope="module")
def server(
    start_triton: Any, tmp_path_factory: pytest.TempPathFactory, reference: dict[str, Any]
) -> LocalServer:
    root = tmp_path_factory.mktemp("dlrmv3")
    config = REFERENCE / reference["config"]
    model = Dlrmv3(Dlrmv3Config.load(config))
    fill_uniform(model, reference["fill"]["seed"], reference["fill"]["scale"])
    torch.save(model.state_dict(), root / "model.pt")
    command = [sys.executable, "-m", "export", "dlrmv3", "--checkpoint", str(root / "model.pt"),
               "--config", str(config), "--repository", str(root / "repo")]  # fmt: skip
    done = subprocess.run(command, capture_output=True, text=True, check=False, cwd=ROOT)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    assert "dlrmv3: ONNX FP32" in done.stdout
    return start_triton(root / "repo")


def _client(server: LocalServer, protocol: str) -> Any:
    return raw_triton.client(server, protocol)


def _infer(client: Any, inputs: dict[str, np.ndarray], tasks: list[str]) -> dict[str, np.ndarray]:
    result = raw_triton.infer(client, DLRMV3_MODEL, inputs)
    return {task: result.as_numpy(task) for task in tasks}


def _tasks(reference: dict[str, Any]) -> list[str]:
    return [
        task["task_name"]
        for task in json.loads((REFERENCE / reference["config"]).read_text())["multitask_configs"]
    ]


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_each_user_gets_the_references_scores_of_it_alone(
    server: LocalServer, reference: dict[str, Any], protocol: str
) -> None:
    tasks = _tasks(reference)
    with _client(server, protocol) as client:
        for user in reference["users"]:
            answer = _infer(client, user_request(user), tasks)
            count = len(user["candidate_item_id"])
            for task in tasks:
                assert answer[task].shape == (1, count), (user["label"], answer[task].shape)
                expected = np.asarray(user["scores"][task], dtype=np.float32)
                assert np.abs(answer[task][0] - expected).max() <= TOLERANCE, (user["label"], task)


def test_eight_clients_at_once_each_get_their_users_scores(
    server: LocalServer, reference: dict[str, Any]
) -> None:
    """Concurrent users are batched by the server (ragged batching); none's scores move."""
    tasks, users = _tasks(reference), reference["users"]

    def send(worker: int) -> list[tuple[str, float]]:
        worst = []
        with _client(server, PROTOCOLS[worker % 2]) as client:
            for _ in range(3):
                for user in users[worker % 4 :: 2] + users[: worker % 3]:
                    answer = _infer(client, user_request(user), tasks)
                    for task in tasks:
                        expected = np.asarray(user["scores"][task], dtype=np.float32)
                        worst.append((user["label"], float(np.abs(answer[task][0] - expected).max())))
        return worst

    with ThreadPoolExecutor(8) as pool:
        results = [item for part in pool.map(send, range(8)) for item in part]
    assert max(difference for _, difference in results) <= TOLERANCE, max(results, key=lambda r: r[1])
    with _client(server, "grpc") as client:
        stats = client.get_inference_statistics(DLRMV3_MODEL, as_json=True)["model_stats"][0]
    executions, inferences = int(stats["execution_count"]), int(stats["inference_count"])
    assert inferences > executions, "the server batched no two users together"


def _limit(reference: dict[str, Any]) -> int:
    config = json.loads((REFERENCE / reference["config"]).read_text())
    return int(config["hstu_config"]["max_num_candidates_inference"])


def test_the_config_batches_users_and_says_what_it_checks(
    server: LocalServer, reference: dict[str, Any]
) -> None:
    config = read_config(Path(server.config.repository) / DLRMV3_MODEL / "config.pbtxt")
    assert config.max_batch_size > 1
    assert {entry.name for entry in config.input if entry.allow_ragged_batch} == set(
        DLRMV3_HISTORY_INPUTS + DLRMV3_CANDIDATE_INPUTS
    )
    assert config.parameters["ragged_max_elements"].string_value == f"candidate_item_id:{_limit(reference)}"


def _bad_requests(user: dict[str, Any], limit: int) -> list[tuple[str, dict[str, np.ndarray], str]]:
    good = user_request(user)
    many = {**user, "candidate_item_id": list(range(limit + 1)), "candidate_category_id": [1] * (limit + 1)}
    short = {**good, "uih_timestamp": good["uih_timestamp"][:, :-1]}
    negative = {**good, "uih_timestamp": -good["uih_timestamp"]}
    empty = {
        **good,
        "candidate_item_id": good["candidate_item_id"][:, :0],
        "candidate_category_id": good["candidate_category_id"][:, :0],
    }
    floats = {**good, "uih_item_id": good["uih_item_id"].astype(np.float32)}
    missing = {k: v for k, v in good.items() if k != "candidate_category_id"}
    return [
        ("too many candidates", user_request(many), f"at most {limit}"),
        ("lengths that disagree", short, "disagree on their number of values"),
        ("negative timestamps", negative, "negative value"),
        ("no candidate", empty, "holds no values"),
        ("a float id", floats, "data-type"),
        ("a missing input", missing, "candidate_category_id"),
    ]


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_a_bad_request_is_one_error_line_and_the_server_answers_the_next(
    server: LocalServer, reference: dict[str, Any], protocol: str
) -> None:
    tasks, user = _tasks(reference), reference["users"][7]
    with _client(server, protocol) as client:
        for what, inputs, says in _bad_requests(user, _limit(reference)):
            with pytest.raises(InferenceServerException) as caught:
                _infer(client, inputs, tasks)
            message = str(caught.value.message() if hasattr(caught.value, "message") else caught.value)
            assert says in message and "\n" not in message.strip(), (what, message)
            assert client.is_model_ready(DLRMV3_MODEL), what
            answer = _infer(client, user_request(user), tasks)
            assert np.abs(answer[tasks[0]][0] - np.asarray(user["scores"][tasks[0]])).max() <= TOLERANCE


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", *args], capture_output=True, text=True, check=False, cwd=ROOT
    )


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_the_bundles_clients_score_a_users_file(
    server: LocalServer, reference: dict[str, Any], protocol: str, tmp_path: Path
) -> None:
    """A users file written by ``models dlrmv3-users`` (labels drawn from the model itself), through
    ``clients infer`` and ``clients evaluate`` as a user runs them: every score the eager model's,
    and the AUC the eager model's too."""
    from criteo.metrics import roc_auc
    from models.dlrmv3 import load_state, pad_users

    root = Path(server.config.repository).parent
    config = REFERENCE / reference["config"]
    users_file = tmp_path / "users.jsonl"
    done = _cli("models", "dlrmv3-users", "--config", str(config), "--out", str(users_file), "--users", "40",
                "--seed", "3", "--labels-from", str(root / "model.pt"))  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    url = server.http_url if protocol == "http" else server.grpc_url
    scored = _cli("clients", "infer", "--model", DLRMV3_MODEL, "--input", str(users_file),
                  "--protocol", protocol, "--url", url)  # fmt: skip
    assert scored.returncode == 0, scored.stderr[-2000:]
    lines = [json.loads(line) for line in scored.stdout.splitlines() if line.strip()]
    users = [json.loads(line) for line in users_file.read_text().splitlines()]
    assert len(lines) == len(users) == 40
    model = Dlrmv3(Dlrmv3Config.load(config)).eval()
    load_state(model, root / "model.pt")
    with torch.no_grad():
        eager = model(**pad_users(users))
    tasks = _tasks(reference)
    for index, (line, user) in enumerate(zip(lines, users, strict=True)):
        count = len(user["candidate_item_id"])
        for column, task in enumerate(tasks):
            assert np.abs(np.asarray(line[task]) - eager[index, :count, column].numpy()).max() <= TOLERANCE
    # asyncio, eight users in flight: the same lines, in the file's order.
    concurrent = _cli("clients", "infer", "--model", DLRMV3_MODEL, "--input", str(users_file),
                      "--protocol", protocol, "--url", url, "--mode", "async",
                      "--max-in-flight", "8")  # fmt: skip
    assert concurrent.returncode == 0, concurrent.stderr[-2000:]
    again = [json.loads(line) for line in concurrent.stdout.splitlines() if line.strip()]
    assert [line["user"] for line in again] == list(range(40))
    for first, second in zip(lines, again, strict=True):
        for task in _tasks(reference):
            assert np.abs(np.asarray(first[task]) - np.asarray(second[task])).max() <= TOLERANCE
    evaluated = _cli("clients", "evaluate", "--model", DLRMV3_MODEL, "--input", str(users_file), "--protocol",
                     protocol, "--url", url, "--json")  # fmt: skip
    assert evaluated.returncode == 0, evaluated.stderr[-2000:]
    results = {row["task"]: row for row in json.loads(evaluated.stdout)["scores"]}
    for column, task in enumerate(tasks):
        labels = np.concatenate([user["labels"][task] for user in users])
        scores = np.concatenate(
            [eager[i, : len(u["candidate_item_id"]), column].numpy() for i, u in enumerate(users)]
        )
        # Popular items repeat, so scores tie; a served score 1e-7 off the eager one breaks a tie
        # the other way: the AUCs agree to 1e-4, not to the last digit.
        assert abs(results[task]["auc"] - roc_auc(labels, scores)) <= 1e-4
        assert results[task]["auc"] > 0.55  # labels drawn from the model's own probabilities
        assert results[task]["candidates"] == labels.size
    # A users file sent to a model that takes Criteo rows is one line.
    wrong = _cli("clients", "infer", "--model", "no_such_model", "--input", str(users_file), "--url", url,
                 "--protocol", protocol)  # fmt: skip
    assert wrong.returncode != 0 and len([line for line in wrong.stderr.splitlines() if line.strip()]) == 1
