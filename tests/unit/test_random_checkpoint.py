"""python -m models random-dlrm: an untrained DLRM checkpoint of any size, as `train dlrm` writes one."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest
import torch

from bundle.errors import ConfigError
from bundle.schema import NUM_CATEGORICAL
from criteo.tables import table_offsets
from models import random_checkpoint
from models.config import DLRMConfig, load_config
from models.random_checkpoint import write_random_dlrm

SIZES = tuple(30 + 11 * t for t in range(NUM_CATEGORICAL))


def test_it_writes_what_the_export_loads(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from export.importers.onnx_dlrm import DLRMExporter

    monkeypatch.setattr(random_checkpoint, "CHUNK_ROWS", 16)  # several chunks per table
    config = DLRMConfig.preset("tiny", table_sizes=SIZES)
    written: list[int] = []
    path = write_random_dlrm(config, tmp_path / "dlrm", seed=3, on_rows=written.append)
    assert sum(written) == config.embedding_rows
    assert sorted(p.name for p in path.parent.iterdir()) == ["config.json", "model.pt"]  # scratch file gone
    assert load_config(path.parent) == config
    exporter = DLRMExporter(path.parent)  # memory-mapped, as any checkpoint
    weight = exporter.model.embedding.weight.detach().numpy()
    assert weight.shape == (config.embedding_rows, config.embedding_dim) and np.all(np.isfinite(weight))
    for start, size in zip(table_offsets(SIZES), SIZES, strict=True):
        rows = weight[start : start + size]
        assert np.abs(rows).max() <= math.sqrt(1.0 / size) and rows.std() > 0  # the model's own init range
    assert np.array_equal(exporter.table_rows(5, 2, 9), weight[table_offsets(SIZES)[5] + 2 :][:7])
    again = write_random_dlrm(config, tmp_path / "again", seed=3)
    state = torch.load(again, weights_only=True)
    assert torch.equal(state["embedding.weight"], exporter.model.embedding.weight.detach())  # seeded


def test_too_little_disk_is_one_clear_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    class Usage:
        free = 1000

    monkeypatch.setattr(random_checkpoint.shutil, "disk_usage", lambda _: Usage())
    with pytest.raises(ConfigError, match=r"written twice while model\.pt is saved"):
        write_random_dlrm(DLRMConfig.preset("tiny", table_sizes=SIZES), tmp_path)
