"""The bundle's DLRMv3 (HSTU) against MLCommons' reference, from committed numbers.

``tests/reference/dlrmv3/*.json`` hold, for two model shapes, the reference's config, the
rule that rebuilds its seeded weights, and its scores of each user run alone on its
pure-PyTorch CPU kernels (histories empty, short, at the limit and past it, the contextual
token zeroed and not, one candidate and the most). The bundle's model must give each user
those scores within 1e-5, alone and batched with the others.
"""

from __future__ import annotations

import copy
import json
import subprocess
import sys
import warnings
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from bundle.errors import ConfigError
from models.dlrmv3 import Dlrmv3, Dlrmv3Config, fill_uniform, load_state, pad_users

ROOT = Path(__file__).resolve().parents[2]
REFERENCE = ROOT / "tests" / "reference" / "dlrmv3"
SHAPES = ("tiny", "small")
TOLERANCE = 1e-5


def _reference(shape: str) -> dict[str, Any]:
    """A shape's reference run, its config (a file beside it) read in."""
    document = json.loads((REFERENCE / f"{shape}.json").read_text())
    document["config"] = json.loads((REFERENCE / document["config"]).read_text())
    return document


def _model(document: dict[str, Any]) -> Dlrmv3:
    model = Dlrmv3(Dlrmv3Config.from_dict(document["config"])).eval()
    fill_uniform(model, document["fill"]["seed"], document["fill"]["scale"])
    return model


def _scores(model: Dlrmv3, users: list[dict[str, Any]]) -> torch.Tensor:
    with torch.no_grad():
        return model(**pad_users(users))


def _expected(model: Dlrmv3, user: dict[str, Any]) -> torch.Tensor:
    return torch.tensor([user["scores"][task.name] for task in model.config.tasks]).T


@pytest.mark.parametrize("shape", SHAPES)
def test_each_user_alone_scores_as_the_reference(shape: str) -> None:
    document = _reference(shape)
    model = _model(document)
    config = model.config
    assert document["reference"]["commit"].startswith("b66003e1")
    kept = {user["label"]: user["history_kept"] for user in document["users"]}
    # The cases the reference's semantics turn on are all there.
    assert min(kept.values()) == 0 and max(kept.values()) == config.max_uih_len
    assert any(len(u["uih_item_id"]) > config.max_uih_len for u in document["users"])
    assert {u["contextual_token_zeroed"] for u in document["users"]} == {True, False}
    assert max(len(u["candidate_item_id"]) for u in document["users"]) == config.max_num_candidates_inference
    for user in document["users"]:
        scores = _scores(model, [user])[0, : len(user["candidate_item_id"])]
        expected = _expected(model, user)
        assert (scores - expected).abs().max().item() <= TOLERANCE, user["label"]


@pytest.mark.parametrize("shape", SHAPES)
def test_a_batch_of_users_gives_each_the_scores_it_gets_alone(shape: str) -> None:
    """The reference's own batch moves its users' scores (its attention scale is the batch's
    longest sequence); the bundle's does not."""
    document = _reference(shape)
    model = _model(document)
    users = document["users"]
    together = _scores(model, users)
    for row, user in enumerate(users):
        count = len(user["candidate_item_id"])
        alone = _scores(model, [user])[0, :count]
        assert (together[row, :count] - alone).abs().max().item() <= 1e-6, user["label"]
        assert (together[row, :count] - _expected(model, user)).abs().max().item() <= TOLERANCE
        assert not together[row, count:].any()  # past a user's candidates: zeros
    assert document["batched"]["max_abs_diff_vs_alone"] > 1e-3


def test_a_config_with_a_field_missing_or_contradictory_is_one_line_naming_it() -> None:
    config = _reference("tiny")["config"]
    broken = copy.deepcopy(config)
    del broken["hstu_config"]["hstu_attn_qk_dim"]
    with pytest.raises(ConfigError, match=r"hstu_config\.hstu_attn_qk_dim is missing"):
        Dlrmv3Config.from_dict(broken)
    wider = copy.deepcopy(config)
    wider["tables"]["item_id"]["embedding_dim"] = 7
    with pytest.raises(ConfigError, match=r"tables\.item_id\.embedding_dim is 7"):
        Dlrmv3Config.from_dict(wider)
    unsorted = copy.deepcopy(config)
    unsorted["multitask_configs"].insert(0, {"task_name": "t", "task_weight": 4, "task_type": "REGRESSION"})
    with pytest.raises(ConfigError, match="sorted by task_type"):
        Dlrmv3Config.from_dict(unsorted)
    text = copy.deepcopy(config)
    text["hstu_config"]["max_seq_len"] = "64"
    with pytest.raises(ConfigError, match=r"hstu_config\.max_seq_len is '64', expected an integer"):
        Dlrmv3Config.from_dict(text)
    with pytest.raises(ConfigError, match="multitask_configs is missing"):
        Dlrmv3Config.from_dict({k: v for k, v in config.items() if k != "multitask_configs"})


def test_a_random_checkpoint_loads_by_the_references_key_names(tmp_path: Path) -> None:
    config = REFERENCE / "config-small.json"
    done = subprocess.run(
        [sys.executable, "-m", "models", "random-dlrmv3", "--config", str(config),
         "--out", str(tmp_path / "m"), "--seed", "4"],
        capture_output=True, text=True, check=False, cwd=ROOT,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    state = torch.load(tmp_path / "m" / "model.pt", weights_only=True)
    assert state["_embedding_collection.embeddings.item_id.weight"].dtype == torch.float16
    assert "_hstu_transducer._stu_module._stu_layers.2._uvqk_weight" in state
    loaded = Dlrmv3(Dlrmv3Config.load(tmp_path / "m" / "config.json")).eval()
    load_state(loaded, tmp_path / "m" / "model.pt")
    seeded = Dlrmv3(loaded.config).eval()
    fill_uniform(seeded, 4, 0.1)
    users = _reference("small")["users"][:4]
    assert torch.equal(_scores(loaded, users), _scores(seeded, users))
    (tmp_path / "junk.pt").write_bytes(b"not a checkpoint")
    with pytest.raises(ConfigError, match="is no PyTorch state dict"):
        load_state(loaded, tmp_path / "junk.pt")
    other = Dlrmv3(Dlrmv3Config.from_dict(_reference("tiny")["config"]))
    with pytest.raises(ConfigError, match=r"does not match the config's DLRMv3|the config's model needs"):
        load_state(other, tmp_path / "m" / "model.pt")


def test_the_export_writes_a_checked_model_or_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import export.dlrmv3 as exporter
    from bundle.errors import ExportError
    from bundle.repository import read_config, read_report

    document = _reference("tiny")
    model = _model(document)
    torch.save(model.state_dict(), tmp_path / "model.pt")
    config = REFERENCE / "config-tiny.json"
    repository = tmp_path / "repo"
    monkeypatch.setattr(exporter, "TOLERANCE", -1.0)  # no file can pass: the export must leave nothing
    with pytest.raises(ExportError, match="differs from the eager model"):
        exporter.export_dlrmv3(tmp_path / "model.pt", config, repository)
    assert not (repository / "dlrmv3").exists()
    monkeypatch.undo()
    report = exporter.export_dlrmv3(tmp_path / "model.pt", config, repository)
    assert report["variants"]["onnx_fp32"]["max_abs_diff"] <= exporter.TOLERANCE
    assert read_report(repository, "dlrmv3")["tasks"] == ["rating", "engagement"]
    served = read_config(repository / "dlrmv3" / "config.pbtxt")
    assert [output.name for output in served.output] == ["rating", "engagement"]
    assert {entry.target_name[0] for entry in served.batch_input} == {
        "uih_lengths", "candidate_lengths", "uih_width", "candidate_width",
    }  # fmt: skip
    # The ONNX file, run as Triton's ragged batching feeds it, scores a batch as each user alone.
    import onnxruntime as ort

    session = ort.InferenceSession(str(repository / "dlrmv3" / "1" / "model.onnx"))
    users = document["users"]
    served_scores = session.run(None, exporter.ragged_feeds(users))
    expected = np.concatenate([_expected(model, user).numpy() for user in users])
    assert np.abs(np.stack(served_scores, axis=1) - expected).max() <= TOLERANCE


def test_a_training_runs_checkpoint_folder_loads_as_its_state_dict(tmp_path: Path) -> None:
    """The reference's training saves the tables with torch.distributed.checkpoint under
    ``sparse/`` and the rest in ``non_sparse.ckpt`` (``dense_dict``, beside the optimizer's)."""
    import torch.distributed.checkpoint as dcp

    from bundle.errors import ConfigError
    from export.dlrmv3 import load_checkpoint

    document = _reference("small")
    model = _model(document)
    state = model.state_dict()
    tables = {k: v.clone() for k, v in state.items() if "_embedding_collection" in k}
    dense = {k: v.clone() for k, v in state.items() if k not in tables}
    run = tmp_path / "run" / "1000"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # "assuming the intent is to save in a single process"
        dcp.save(tables, checkpoint_id=run / "sparse")
    torch.save(
        {"dense_dict": dense, "optimizer_dict": {"state": {}, "param_groups": []}}, run / "non_sparse.ckpt"
    )
    loaded = Dlrmv3(model.config).eval()
    load_checkpoint(loaded, run)
    users = document["users"]
    assert torch.equal(_scores(loaded, users), _scores(model, users))
    (run / "non_sparse.ckpt").unlink()
    with pytest.raises(ConfigError, match="holds sparse/"):
        load_checkpoint(loaded, run)
