"""TorchRec DLRM_DCN (DLRM-DCNv2) state dicts: read, rebuilt and exported, against TorchRec's own forward."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnxruntime as ort
import pytest
import torch

from bundle.errors import ExportError
from bundle.schema import CATEGORICAL_INPUT, DENSE_INPUT, NUM_CATEGORICAL, NUM_DENSE, OUTPUT
from criteo.tsv import Batch
from export.importers.dlrm_sources import CheckpointExporter, open_dlrm_source
from export.importers.sources import SourceOptions
from tests.byom_torch import TABLE_SIZES, in_range
from tests.torchrec_dcn import (
    CROSS_LAYERS,
    CROSS_RANK,
    DIM,
    dcn_logits,
    make_dcn,
    old_bias_state,
    train_state,
)

OPSET = 17


def _batch(rows: int, seed: int) -> Batch:
    rng = np.random.default_rng(seed)
    dense = np.log1p(rng.integers(0, 1000, (rows, NUM_DENSE))).astype(np.float32)
    ids = rng.integers(-(2**62), 2**62, (rows, NUM_CATEGORICAL), dtype=np.int64)
    return Batch(dense, ids, None)


def _sigmoid(logits: np.ndarray) -> np.ndarray:
    return (1 / (1 + np.exp(-logits.astype(np.float64)))).astype(np.float32)


@pytest.fixture(scope="module")
def dcn():  # type: ignore[no-untyped-def]
    return make_dcn(seed=3)


@pytest.mark.parametrize("form", ["state_dict", "dlrm_train", "old_bias"])
def test_dcn_state_dicts_export_to_torchrecs_own_answers(dcn, form: str, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    state = {"state_dict": dcn.state_dict, "dlrm_train": lambda: train_state(dcn)}.get(
        form, lambda: old_bias_state(dcn.state_dict())
    )()
    torch.save(state, tmp_path / "dcn.pt")
    exporter = open_dlrm_source(tmp_path / "dcn.pt", SourceOptions())
    assert isinstance(exporter, CheckpointExporter)
    layout = exporter.layout
    assert (layout.interaction, layout.cross_layers, layout.cross_rank, layout.dim) == (
        "dcn",
        CROSS_LAYERS,
        CROSS_RANK,
        DIM,
    )
    assert layout.cross_bias_column == (form == "old_bias")
    assert exporter.format == "torchrec_dlrm_dcn_state_dict"
    assert exporter.source["model"] == "DLRM_DCN"
    batch = _batch(200, seed=4)
    expected = _sigmoid(dcn_logits(dcn, batch.dense, in_range(batch.categorical)))
    assert float(np.std(expected)) > 1e-3
    # The export's parity reference (written as TorchRec writes it) and the rebuilt module.
    np.testing.assert_allclose(exporter.predict(batch), expected, atol=1e-6, rtol=0)
    with torch.no_grad():
        rebuilt = exporter.module(torch.from_numpy(batch.dense), torch.from_numpy(batch.categorical)).numpy()
    np.testing.assert_allclose(rebuilt, expected, atol=1e-6, rtol=0)
    exporter.to_onnx(tmp_path / "dcn.onnx", OPSET)
    session = ort.InferenceSession(str(tmp_path / "dcn.onnx"), providers=["CPUExecutionProvider"])
    (answer,) = session.run([OUTPUT], {DENSE_INPUT: batch.dense, CATEGORICAL_INPUT: batch.categorical})
    np.testing.assert_allclose(answer, expected, atol=1e-5, rtol=0)
    assert "Loop" not in {
        node.op_type for node in __import__("onnx").load(str(tmp_path / "dcn.onnx")).graph.node
    }


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (
            lambda s: s.pop("inter_arch.crossnet.V_kernels.1"),
            r"inter_arch\.crossnet\.V_kernels\.1 is missing",
        ),
        (
            lambda s: s.__setitem__("inter_arch.crossnet.W_kernels.0", torch.zeros(5, CROSS_RANK)),
            "W_kernels",
        ),
        (lambda s: s.__setitem__("inter_arch.crossnet.gate.0", torch.zeros(3)), "LowRankCrossNet"),
        (lambda s: s.__setitem__("over_arch.extra.weight", torch.zeros(3)), "over_arch.extra.weight"),
    ],
)
def test_a_dcn_the_importer_cannot_map_is_one_line_naming_the_key(
    dcn, change, message: str, tmp_path: Path
) -> None:  # type: ignore[no-untyped-def]
    state = dict(dcn.state_dict())
    change(state)
    torch.save(state, tmp_path / "dcn.pt")
    with pytest.raises(ExportError, match=message) as error:
        open_dlrm_source(tmp_path / "dcn.pt", SourceOptions())
    assert "\n" not in str(error.value)


def test_table_sizes_of_the_checkpoint_are_its_own(dcn, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    torch.save(dcn.state_dict(), tmp_path / "dcn.pt")
    exporter = open_dlrm_source(tmp_path / "dcn.pt", SourceOptions())
    assert exporter.table_sizes == TABLE_SIZES


def test_a_distributed_checkpoint_folder_imports(dcn, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    import torch.distributed.checkpoint as dcp

    state = {**train_state(dcn), "step": 7}  # a training run saves more than tensors
    dcp.save(state, checkpoint_id=tmp_path / "run")
    exporter = open_dlrm_source(tmp_path / "run", SourceOptions())
    assert isinstance(exporter, CheckpointExporter)
    assert exporter.format == "torchrec_dlrm_dcn_distributed_checkpoint"
    batch = _batch(64, seed=5)
    expected = _sigmoid(dcn_logits(dcn, batch.dense, in_range(batch.categorical)))
    np.testing.assert_allclose(exporter.predict(batch), expected, atol=1e-6, rtol=0)


class _Marker:
    """A pickle that would create a file if it were unpickled with plain pickle."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def __reduce__(self):  # type: ignore[no-untyped-def]
        return (open, (str(self.path), "w"))


def test_a_metadata_file_never_runs_code(dcn, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    import pickle

    import torch.distributed.checkpoint as dcp

    dcp.save(train_state(dcn), checkpoint_id=tmp_path / "run")
    marker = tmp_path / "ran"
    (tmp_path / "run" / ".metadata").write_bytes(pickle.dumps(_Marker(marker)))
    with pytest.raises(ExportError, match=r"not a torch\.distributed\.checkpoint metadata file") as error:
        open_dlrm_source(tmp_path / "run", SourceOptions())
    assert "\n" not in str(error.value)
    assert not marker.exists()
