"""Bring your own DLRM: each PyTorch form a user may have, exported with the CLI and served by
the real local tritonserver, answers what the source framework itself answers.

Forms: a facebookresearch/dlrm checkpoint (``--save-model``) and its bare state dict, a TorchScript
trace of that model, a TorchRec DLRM state dict (with ``--feature-order``), a ``torch.export``
program, ``--factory`` returning a module with ``nn.EmbeddingBag`` tables, and a TorchRec
``DLRMTrain(DLRM_DCN)`` state dict (DLRM-DCNv2) built with the real ``torchrec`` package, saved
with ``torch.save`` and as a ``torch.distributed.checkpoint`` folder. The
expected answers come from the test's own modules (:mod:`tests.byom_torch`) and from TorchRec's own
forward (:mod:`tests.torchrec_dcn`) on ids reduced into the tables.
Each form has its own repository and server (one family, one model name), started in turn.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnx
import pytest
import torch
import torch.distributed.checkpoint as dcp

from bundle.schema import NUM_CATEGORICAL, NUM_DENSE
from clients.triton import TritonClient
from criteo.tsv import Batch
from server import LocalServer
from tests.byom_torch import (
    FACTORY_ENV,
    FacebookAdapter,
    TorchRecDLRM,
    facebook_probabilities,
    in_range,
    make_facebook_net,
    save_facebook_checkpoint,
    torchrec_feature_order,
    torchrec_logits,
    torchrec_sizes,
)
from tests.torchrec_dcn import dcn_logits, make_dcn, train_state

pytestmark = [pytest.mark.integration, pytest.mark.filterwarnings("ignore::torch.jit.TracerWarning")]

ROOT = Path(__file__).resolve().parents[2]
MODELS = ("dlrm_onnx", "dlrm_onnx_fp16")
#: FP16 weights and activations (the interaction and sigmoid kept FP32) move a probability by ~1e-4.
FP16_TOLERANCE = 2e-3
INT64 = np.iinfo(np.int64)
EXTREME_IDS = np.array([INT64.min, INT64.max, -1, 10**12, -(10**15), 2**62 + 5], dtype=np.int64)

Expected = Callable[[np.ndarray, np.ndarray], np.ndarray]


@dataclass(frozen=True)
class Form:
    """One way to bring the model: the CLI arguments, the detected format, the source's own answer."""

    args: tuple[str, ...]
    format: str
    expected: Expected
    env: tuple[tuple[str, str], ...] = ()


def _cli(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """``python -m export dlrm ...`` in its own process, from the repository root."""
    environment = {**os.environ, "PYTHONPATH": str(ROOT), **(env or {})}
    return subprocess.run(
        [sys.executable, "-m", "export", "dlrm", *args],
        capture_output=True,
        text=True,
        check=False,
        cwd=ROOT,
        env=environment,
    )


@pytest.fixture(scope="module")
def forms(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Form]:
    """Every form's file, written from the test's own modules, and how to check it."""
    root = tmp_path_factory.mktemp("byom_dlrm_sources")
    net = make_facebook_net(seed=21)
    checkpoint = save_facebook_checkpoint(net, root / "dlrm_checkpoint.pt")
    bare = save_facebook_checkpoint(net, root / "dlrm_state_dict.pt", bare=True)
    adapter = FacebookAdapter(net).eval()
    example = (
        torch.rand(4, NUM_DENSE),
        torch.from_numpy(in_range(np.arange(104).reshape(4, NUM_CATEGORICAL))),
    )
    torch.jit.save(torch.jit.trace(adapter, example), root / "dlrm_traced.pt")
    batch = torch.export.Dim("batch")
    program = torch.export.export(adapter, example, dynamic_shapes=({0: batch}, {0: batch}))
    torch.export.save(program, root / "dlrm_program.pt2")
    torch.manual_seed(22)
    torchrec = TorchRecDLRM(torchrec_sizes()).eval()
    torch.save({f"model.{k}": v for k, v in torchrec.state_dict().items()}, root / "torchrec.pt")

    dcn = make_dcn(seed=23)
    torch.save(train_state(dcn), root / "dlrm_dcn.pt")
    dcp.save(train_state(dcn), checkpoint_id=root / "dlrm_dcn_run")

    def facebook(dense: np.ndarray, ids: np.ndarray) -> np.ndarray:
        return facebook_probabilities(net, dense, ids)

    def dcn_probabilities(dense: np.ndarray, ids: np.ndarray) -> np.ndarray:
        logits = dcn_logits(dcn, dense, ids).astype(np.float64)
        return (1 / (1 + np.exp(-logits))).astype(np.float32)

    def torchrec_probabilities(dense: np.ndarray, ids: np.ndarray) -> np.ndarray:
        logits = torchrec_logits(torchrec, dense, ids).astype(np.float64)
        return (1 / (1 + np.exp(-logits))).astype(np.float32)

    order = ",".join(torchrec_feature_order())
    return {
        "facebookresearch_checkpoint": Form(
            ("--checkpoint", str(checkpoint)), "facebookresearch_dlrm_checkpoint", facebook
        ),
        "facebookresearch_state_dict": Form(
            ("--checkpoint", str(bare)), "facebookresearch_dlrm_state_dict", facebook
        ),
        "torchscript": Form(("--checkpoint", str(root / "dlrm_traced.pt")), "torchscript", facebook),
        "torch_export": Form(("--checkpoint", str(root / "dlrm_program.pt2")), "torch_export", facebook),
        "torchrec": Form(
            ("--checkpoint", str(root / "torchrec.pt"), "--feature-order", order),
            "torchrec_dlrm_state_dict",
            torchrec_probabilities,
        ),
        "factory": Form(
            ("--factory", "tests.byom_torch:build_factory_model"),
            "factory",
            facebook,
            env=((FACTORY_ENV, str(checkpoint)),),
        ),
        "torchrec_dcn": Form(
            ("--checkpoint", str(root / "dlrm_dcn.pt")), "torchrec_dlrm_dcn_state_dict", dcn_probabilities
        ),
        "torchrec_dcn_distributed_checkpoint": Form(
            ("--checkpoint", str(root / "dlrm_dcn_run")),
            "torchrec_dlrm_dcn_distributed_checkpoint",
            dcn_probabilities,
        ),
    }


@dataclass(frozen=True)
class Served:
    form: Form
    repository: Path
    server: LocalServer


@pytest.fixture(
    scope="module",
    params=[
        "facebookresearch_checkpoint",
        "facebookresearch_state_dict",
        "torchscript",
        "torchrec",
        "torch_export",
        "factory",
        "torchrec_dcn",
        "torchrec_dcn_distributed_checkpoint",
    ],
)
def served(
    request: pytest.FixtureRequest,
    forms: dict[str, Form],
    start_triton,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[Served]:
    """One form exported with the CLI into its own repository, served by its own tritonserver."""
    form = forms[request.param]
    repository = tmp_path_factory.mktemp(f"byom_{request.param}") / "model_repository"
    done = _cli(
        *form.args, "--repository", str(repository), "--no-int8", "--check-rows", "1024", env=dict(form.env)
    )
    assert done.returncode == 0, f"export failed:\n{done.stdout}\n{done.stderr}"
    server = start_triton(repository)
    yield Served(form, repository, server)
    server.stop()


def _rows(rows: int, seed: int, extreme: bool = False) -> Batch:
    rng = np.random.default_rng(seed)
    dense = np.log1p(rng.integers(0, 1000, (rows, NUM_DENSE))).astype(np.float32)
    ids = rng.integers(-(2**40), 2**40, (rows, NUM_CATEGORICAL), dtype=np.int64)
    if extreme:
        ids = np.resize(EXTREME_IDS, ids.shape)
        ids[::2, ::3] = rng.integers(INT64.min, INT64.max, ids[::2, ::3].shape, dtype=np.int64)
    return Batch(dense, ids, None)


def _infer(served: Served, protocol: str, model: str, batch: Batch) -> np.ndarray:
    url = served.server.http_url if protocol == "http" else served.server.grpc_url
    with TritonClient(url, protocol) as client:  # type: ignore[arg-type]
        return client.infer(model, batch.inputs())


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_served_answer_is_the_source_frameworks_own(served: Served, protocol: str) -> None:
    batch = _rows(256, seed=1)
    expected = served.form.expected(batch.dense, in_range(batch.categorical))
    fp32 = _infer(served, protocol, "dlrm_onnx", batch)
    assert fp32.shape == (256, 1) and fp32.dtype == np.float32
    np.testing.assert_allclose(fp32, expected, atol=1e-5, rtol=0)
    assert float(np.std(expected)) > 1e-3  # the rows tell the tables apart: not a constant model
    fp16 = _infer(served, protocol, "dlrm_onnx_fp16", batch)
    np.testing.assert_allclose(fp16, expected, atol=FP16_TOLERANCE, rtol=0)


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_out_of_range_and_negative_ids_give_valid_probabilities(served: Served, protocol: str) -> None:
    batch = _rows(48, seed=2, extreme=True)
    for model in MODELS:
        answer = _infer(served, protocol, model, batch)
        assert answer.shape == (48, 1)
        assert np.all(np.isfinite(answer) & (answer >= 0) & (answer <= 1)), model
    expected = served.form.expected(batch.dense, in_range(batch.categorical))
    np.testing.assert_allclose(_infer(served, protocol, "dlrm_onnx", batch), expected, atol=1e-5, rtol=0)


def test_graphs_have_no_loop_and_the_report_records_the_format(served: Served) -> None:
    for model in MODELS:
        graph = onnx.load(str(served.repository / model / "1" / "model.onnx"))
        assert "Loop" not in {node.op_type for node in graph.graph.node}, model
    report = json.loads((served.repository / "dlrm_onnx" / "export_report.json").read_text())
    assert report["source"]["format"] == served.form.format
    assert (
        report["source"]["table_sizes"] is not None
        and len(report["source"]["table_sizes"]) == NUM_CATEGORICAL
    )


def test_a_file_that_is_no_model_is_one_error_line(tmp_path: Path) -> None:
    path = tmp_path / "notes.pt"
    path.write_text("these are notes, not a model\n")
    done = _cli("--checkpoint", str(path), "--repository", str(tmp_path / "repo"), "--no-int8")
    assert done.returncode == 1, done.stderr
    assert done.stderr.strip().splitlines() == [done.stderr.strip()]
    assert done.stderr.startswith(f"error: {path}: a text file, not a model; expected a facebookresearch")


def test_a_checkpoint_with_a_table_missing_is_one_error_line(tmp_path: Path) -> None:
    net = make_facebook_net(seed=3)
    state = {k: v for k, v in net.state_dict().items() if not k.startswith("emb_l.25.")}
    path = tmp_path / "missing.pt"
    torch.save({"epoch": 0, "state_dict": state}, path)
    done = _cli("--checkpoint", str(path), "--repository", str(tmp_path / "repo"), "--no-int8")
    assert done.returncode == 1, done.stderr
    assert done.stderr.strip().splitlines() == [done.stderr.strip()]
    assert (
        done.stderr.startswith("error: ")
        and "found tables emb_l.0..emb_l.24 (25), missing emb_l.25" in done.stderr
    )
    assert not (tmp_path / "repo" / "dlrm_onnx").exists()
