"""export.tables.hot_cold_graph on the bundle's Wide & Deep (TensorFlow): deep and wide tables in one store.

Apart from test_hot_cold_graph.py so that TensorFlow and PyTorch never load into one
process. The tiny model is built, given non-zero wide weights (training starts
them at zero, which would hide a wrong wide lookup), saved as the SavedModel
training writes and exported by WideDeepExporter; the dense model fed with
:func:`export.tables.hot_cold_graph.stage_reference` must answer as the export within 1e-6.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import numpy_helper

from bundle.schema import (
    CATEGORICAL_INPUT,
    COLD_POSITIONS,
    COLD_ROWS,
    DENSE_INPUT,
    HOT_SLOTS,
    NUM_CATEGORICAL,
    NUM_DENSE,
    OUTPUT,
)
from criteo.tables import table_offsets
from export.tables.hot_cold_graph import split_lookups, stage_reference, write_store
from export.tables.hot_rows import HotSet
from export.tables.lookups import find_lookups

SIZES = tuple(2 + 3 * t for t in range(NUM_CATEGORICAL))
TOLERANCE = 1e-6
I64 = np.iinfo(np.int64)


@pytest.fixture(scope="module")
def exported(tmp_path_factory: pytest.TempPathFactory) -> Path:
    import keras

    from export.importers.onnx_wide_deep import WideDeepExporter
    from models.config import WideDeepConfig, save_config
    from models.wide_deep import LOGIT_LAYER, build_wide_deep, export_saved_model

    config = WideDeepConfig.preset("tiny", table_sizes=SIZES)
    keras.utils.set_random_seed(0)
    model = build_wide_deep(config)
    wide = model.get_layer(LOGIT_LAYER).params["wide_table"]
    wide.assign(np.random.default_rng(0).normal(0, 0.3, wide.shape).astype(np.float32))
    folder = tmp_path_factory.mktemp("wide_deep")
    save_config(config, folder)
    export_saved_model(model, folder / "saved_model")
    path = folder / "model.onnx"
    WideDeepExporter(folder).to_onnx(path, 17)
    return path


def _hot(empty: bool) -> HotSet:
    rng = np.random.default_rng(0)
    ids = tuple(
        np.zeros(0, np.int64) if empty else rng.permutation(size)[: max(1, size // 3)].astype(np.int64)
        for size in SIZES
    )
    counts = tuple(np.ones(len(i), np.int64) for i in ids)
    row_bytes = (4 * 8 + 4,) * NUM_CATEGORICAL
    return HotSet(SIZES, row_bytes, sum(len(i) for i in ids) * row_bytes[0], ids, counts, 1)


def _batches(hot: HotSet) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(1)

    def pick(rows: int, cold: bool) -> np.ndarray:
        ids = np.empty((rows, NUM_CATEGORICAL), np.int64)
        for t, size in enumerate(SIZES):
            pool = np.setdiff1d(np.arange(size), hot.ids[t]) if cold else hot.ids[t]
            ids[:, t] = rng.choice(pool, rows) - size * rng.integers(-(10**6), 10**6, rows)
        return ids

    extremes = [I64.min, I64.max, -1, 2**62 + 5, -(10**12) - 7]
    cases = {
        "all_cold": pick(16, cold=True),
        "mixed": rng.integers(I64.min, I64.max, (32, NUM_CATEGORICAL), dtype=np.int64, endpoint=True),
        "extremes": np.array([[value] * NUM_CATEGORICAL for value in extremes], dtype=np.int64),
        "batch_1_cold": pick(1, cold=True),
    }
    if all(len(i) for i in hot.ids):
        cases["all_hot"] = pick(16, cold=False)
        cases["batch_1_hot"] = pick(1, cold=False)
    return cases


def test_lookups_store_columns_and_rows(exported: Path, tmp_path: Path) -> None:
    lookups = {lookup.table: lookup for lookup in find_lookups(onnx.load(str(exported)))}
    assert set(lookups) == {"deep_table", "wide_table"}
    assert lookups["deep_table"].store_range == (0, 8) and lookups["wide_table"].store_range == (8, 9)
    assert lookups["wide_table"].row_offsets == table_offsets(SIZES) == lookups["deep_table"].row_offsets
    store = write_store(exported, tmp_path / "store", "float32", SIZES)
    tables = {t.name: numpy_helper.to_array(t) for t in onnx.load(str(exported)).graph.initializer}
    np.testing.assert_array_equal(store.column("embedding"), tables["deep_table"])
    np.testing.assert_array_equal(store.column("wide")[:, 0], tables["wide_table"])
    assert np.abs(tables["wide_table"]).max() > 0


@pytest.mark.parametrize("empty", [False, True], ids=["hot-and-cold", "nothing-hot"])
def test_dense_model_answers_as_the_whole_graph(exported: Path, empty: bool, tmp_path: Path) -> None:
    hot = _hot(empty)
    store = write_store(exported, tmp_path / "store", "float32", SIZES)
    dense = split_lookups(exported, hot, SIZES)
    assert [v.name for v in dense.graph.input] == [DENSE_INPUT, HOT_SLOTS, COLD_POSITIONS, COLD_ROWS]
    assert {t.name for t in dense.graph.initializer}.isdisjoint({"deep_table", "wide_table"})
    assert all(t.dims[0] <= 1 + hot.rows for t in dense.graph.initializer if t.name.endswith("/hot"))
    onnx.checker.check_model(dense)
    original = ort.InferenceSession(str(exported), providers=["CPUExecutionProvider"])
    served = ort.InferenceSession(dense.SerializeToString(), providers=["CPUExecutionProvider"])
    diffs = {}
    for name, ids in _batches(hot).items():
        numbers = np.linspace(0, 3, len(ids) * NUM_DENSE, dtype=np.float32).reshape(len(ids), NUM_DENSE)
        (want,) = original.run([OUTPUT], {DENSE_INPUT: numbers, CATEGORICAL_INPUT: ids})
        slots, positions, rows = stage_reference(ids, hot, SIZES, store)
        if name == "all_hot":
            assert positions.size == 0
        feeds = {DENSE_INPUT: numbers, HOT_SLOTS: slots, COLD_POSITIONS: positions, COLD_ROWS: rows}
        (got,) = served.run([OUTPUT], feeds)
        diffs[name] = float(np.abs(got - want).max())
    assert max(diffs.values()) <= TOLERANCE, diffs
