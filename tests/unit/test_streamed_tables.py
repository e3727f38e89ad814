"""export --stream-tables: a hot/cold export that never builds the all-in-graph graph.

Three DLRM checkpoints with other key names and per-table sizes (the bundle's own,
a facebookresearch/dlrm one, and a TorchRec state dict with its own feature order)
are exported hot/cold twice: the usual way (all-in-graph graph first, split from it)
and streamed (row store from the checkpoint's memory-mapped tables, layers from a
graph with placeholder tables). Both ways must write the same row store, bit for
bit, and dense models whose two stages give the same probabilities; the streamed
export is checked against the framework itself. What it cannot do is one clear error.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from bundle.errors import ConfigError
from bundle.schema import NUM_CATEGORICAL
from criteo.synth import SynthConfig, write_tsv
from criteo.tsv import read_batch
from export.graphs.parity import extreme_id_rows
from export.importers.dlrm_sources import open_dlrm_source
from export.importers.sources import SourceOptions
from export.options import ExportOptions, PlacementOptions
from export.pipeline import export_family
from export.tables.hot_rows import HotSet
from export.tables.placement import run_hot_cold
from export.tables.row_store import RowStore
from tests.byom_torch import (
    TORCHREC_ORDER,
    TORCHREC_TABLES,
    TorchRecDLRM,
    make_facebook_net,
    save_facebook_checkpoint,
    torchrec_sizes,
)

#: The bundle's tiny DLRM: a different size per table, 8 float32 values a row.
SIZES = tuple(30 + 11 * t for t in range(NUM_CATEGORICAL))


@pytest.fixture(scope="module")
def data(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("data") / "rows.tsv"
    write_tsv(SynthConfig(rows=1500, seed=5), path)
    return path


def _bundle(folder: Path) -> Any:
    from export.importers.onnx_dlrm import DLRMExporter
    from models.config import DLRMConfig, save_config
    from models.dlrm import DLRM, WEIGHTS_FILE

    config = DLRMConfig.preset("tiny", table_sizes=SIZES)
    save_config(config, folder)
    torch.manual_seed(0)
    torch.save(DLRM(config).state_dict(), folder / WEIGHTS_FILE)
    return DLRMExporter(folder)


def _facebook(folder: Path) -> Any:
    path = save_facebook_checkpoint(make_facebook_net(seed=2), folder / "fb.pt")
    return open_dlrm_source(path, SourceOptions())


def _torchrec(folder: Path) -> Any:
    torch.manual_seed(5)
    model = TorchRecDLRM(torchrec_sizes()).eval()
    path = folder / "tr.pt"
    torch.save({"model." + key: value for key, value in model.state_dict().items()}, path)
    order = tuple(TORCHREC_TABLES[i] for i in TORCHREC_ORDER)
    return open_dlrm_source(path, SourceOptions(feature_order=order))


SOURCES: dict[str, Callable[[Path], Any]] = {
    "bundle": _bundle,
    "facebookresearch": _facebook,
    "torchrec": _torchrec,
}


def _options(repository: Path, data: Path, stream: bool, **fields: Any) -> ExportOptions:
    budget = fields.pop("hot_budget", 512)
    placement = PlacementOptions("hot-cold", hot_budget=budget, stream_tables=stream, **fields)
    return ExportOptions(
        repository=repository, check_data=data, check_rows=1024, fp16=False, int8=False, placement=placement
    )


def _pair(repository: Path) -> tuple[HotSet, RowStore, Path]:
    return (
        HotSet.load(repository / "dlrm_embedding" / "1" / "hot_set.npz"),
        RowStore.open(repository / "dlrm_embedding" / "rows"),
        repository / "dlrm_dense" / "1" / "model.onnx",
    )


@pytest.mark.parametrize("source", list(SOURCES))
def test_streamed_tables_give_the_same_store_and_answers(source: str, data: Path, tmp_path: Path) -> None:
    exporter = SOURCES[source](tmp_path)
    usual, streamed = tmp_path / "usual", tmp_path / "streamed"
    export_family(exporter, _options(usual, data, stream=False))
    (result,) = export_family(exporter, _options(streamed, data, stream=True))

    assert result.name == "dlrm_onnx" and result.reference == "framework"
    assert not (streamed / "dlrm_onnx" / "1" / "model.onnx").exists()  # never built in the graph
    rows_file = Path("dlrm_embedding") / "rows" / "rows.bin"
    assert (streamed / rows_file).read_bytes() == (usual / rows_file).read_bytes()
    report = json.loads((streamed / "dlrm_onnx" / "export_report.json").read_text())
    assert (
        report["checked_against"] == "framework" and "streamed_tables" in report and "in_graph" not in report
    )
    assert report["parity"]["max_abs_diff"] <= 1e-5  # the framework's own forward, out-of-range ids too

    batch = read_batch(data, 512)
    for rows in (batch, extreme_id_rows(batch)):
        (hot_a, store_a, dense_a), (hot_b, store_b, dense_b) = _pair(usual), _pair(streamed)
        assert all(np.array_equal(a, b) for a, b in zip(hot_a.ids, hot_b.ids, strict=True))
        np.testing.assert_allclose(
            run_hot_cold(dense_b, hot_b, store_b, rows),
            run_hot_cold(dense_a, hot_a, store_a, rows),
            rtol=0,
            atol=1e-6,
        )


def test_a_streamed_fp16_store_and_its_variants(data: Path, tmp_path: Path) -> None:
    exporter = _bundle(tmp_path)
    repository = tmp_path / "repository"
    options = _options(repository, data, stream=True, store_dtype="float16")
    options = ExportOptions(**{**options.__dict__, "fp16": True, "int8": True})
    names = [result.name for result in export_family(exporter, options)]
    assert names == ["dlrm_onnx", "dlrm_onnx_fp16", "dlrm_onnx_int8"]
    store = RowStore.open(repository / "dlrm_embedding" / "rows")
    assert store.spec.dtype == "float16" and store.spec.table_sizes == SIZES


def test_what_cannot_be_streamed_is_one_clear_error(data: Path, tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="--stream-tables writes the row store straight"):
        PlacementOptions(stream_tables=True)
    with pytest.raises(ConfigError, match="--stream-tables writes the row store straight"):
        PlacementOptions("in-graph", stream_tables=True)
    exporter = _bundle(tmp_path)
    fits = ExportOptions(
        repository=tmp_path / "repository",
        check_data=data,
        check_rows=1024,
        placement=PlacementOptions(hot_budget=2**30, stream_tables=True),  # auto: the tables fit
    )
    export_family(exporter, _options(fits.repository, data, stream=True))  # an earlier hot/cold export
    before = sorted(p.name for p in fits.repository.iterdir())
    with pytest.raises(ConfigError, match="fit the hot budget, so they stay in the graph"):
        export_family(exporter, fits)
    assert sorted(p.name for p in fits.repository.iterdir()) == before  # refused: nothing removed

    class NotStreamed:  # e.g. a Keras model or a TorchScript file: no table rows to read
        family = "wide_deep"

        @property
        def source(self) -> dict[str, str]:
            return {"format": "keras_saved_model"}

    with pytest.raises(ConfigError, match="keras_saved_model is exported through its whole graph"):
        export_family(NotStreamed(), _options(tmp_path / "other", data, stream=True))  # type: ignore[arg-type]


def test_large_hot_tables_skip_the_fp16_converter_and_answer_alike(
    data: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import onnx

    from export.tables import hot_cold_variants

    exporter = _bundle(tmp_path)
    answers = {}
    for threshold in (hot_cold_variants.SET_ASIDE_BYTES, 0):  # the tiny tables: converted, then set aside
        monkeypatch.setattr(hot_cold_variants, "SET_ASIDE_BYTES", threshold)
        repository = tmp_path / f"set_aside_{threshold}"
        options = _options(repository, data, stream=True)
        export_family(exporter, ExportOptions(**{**options.__dict__, "fp16": True}))
        dense = repository / "dlrm_dense_fp16" / "1" / "model.onnx"
        (table,) = [t for t in onnx.load(str(dense)).graph.initializer if t.name.endswith("/hot")]
        assert table.data_type == onnx.TensorProto.FLOAT16 and table.dims[0] > 1
        hot, store, _ = _pair(repository)
        answers[threshold] = run_hot_cold(dense, hot, store, read_batch(data, 512))
    first, second = answers.values()
    np.testing.assert_allclose(first, second, rtol=0, atol=1e-6)


def test_tables_larger_than_available_memory_suggest_streaming(
    data: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    import psutil

    class Tight:
        available = 1000  # bytes: less than the tiny model's tables

    exporter = _bundle(tmp_path)
    monkeypatch.setattr(psutil, "virtual_memory", lambda: Tight())
    caplog.set_level("WARNING", logger="export.pipeline")
    export_family(exporter, _options(tmp_path / "usual", data, stream=False))
    assert "--stream-tables writes the row store straight from the checkpoint" in caplog.text
    caplog.clear()
    export_family(exporter, _options(tmp_path / "streamed", data, stream=True))
    assert "--stream-tables" not in caplog.text  # already streaming: nothing to suggest
