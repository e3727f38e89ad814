"""export.tables.hot_cold_graph: row store from the graph, dense model with hot rows, and the stage reference.

Every model is compared with its all-in-graph ONNX export on the same raw ids:
the dense model fed with :func:`stage_reference`'s tensors must answer within
1e-6 (FP32 store). Models: the bundle's DLRM (one stacked table, torch export,
also with external data), a permuted stacked graph (as rebuilt TorchRec DLRMs
with ``--feature-order`` write it) with a 1-D table read by the same rows, and a
per-column graph (a deep and a wide table per column, Keras' negative-index
fix-up on some columns, ids of shape ``B`` and ``B x 1``) made safe by
``export.graphs.ids``. Wide & Deep (TensorFlow) is in test_hot_cold_graph_wide_deep.py.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from bundle.errors import ConfigError, ExportError
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
from export.graphs.ids import ensure_id_reduction
from export.graphs.onnx_io import save_model
from export.tables.hot_cold_graph import PREFIX, split_lookups, stage_reference, write_store
from export.tables.hot_rows import HotSet
from export.tables.lookups import find_lookups
from export.tables.row_store import RowStore

#: Different sizes per table, every table with hot and cold ids.
SIZES = tuple(2 + 3 * t for t in range(NUM_CATEGORICAL))
DIM = 4
TOLERANCE = 1e-6
I64 = np.iinfo(np.int64)
#: Ids at the int64 limits, negative, and far past every table.
EXTREMES = (I64.min, I64.max, I64.min + 1, I64.max - 1, -1, -(10**12) - 7, 10**12, 2**62 + 5)
#: Position j of the permuted graph reads column PERMUTATION[j].
PERMUTATION = tuple((7 * j + 3) % NUM_CATEGORICAL for j in range(NUM_CATEGORICAL))


def hot_set(sizes: tuple[int, ...] = SIZES, empty: bool = False, seed: int = 0) -> HotSet:
    """About a third of each table hot (at least one id), hottest first; ``empty``: none."""
    rng = np.random.default_rng(seed)
    ids = tuple(
        np.zeros(0, np.int64) if empty else rng.permutation(size)[: max(1, size // 3)].astype(np.int64)
        for size in sizes
    )
    counts = tuple(np.arange(len(i), 0, -1, dtype=np.int64) for i in ids)
    used = sum(len(i) for i in ids) * 40
    return HotSet(
        sizes, (40,) * NUM_CATEGORICAL, used, ids, counts, max(1, sum(int(c.sum()) for c in counts))
    )


def batches(hot: HotSet) -> dict[str, np.ndarray]:
    """Raw-id batches: all hot (N = 0), all cold, mixed, extremes, batch 1 (hot and cold)."""
    rng = np.random.default_rng(1)
    sizes = np.asarray(hot.table_sizes, dtype=np.int64)

    def pick(rows: int, cold: bool) -> np.ndarray:
        ids = np.empty((rows, NUM_CATEGORICAL), np.int64)
        for t, size in enumerate(hot.table_sizes):
            pool = np.setdiff1d(np.arange(size), hot.ids[t]) if cold else hot.ids[t]
            ids[:, t] = rng.choice(pool, rows) + size * rng.integers(-(10**6), 10**6, rows)
        return ids

    mixed = rng.integers(I64.min, I64.max, (32, NUM_CATEGORICAL), dtype=np.int64, endpoint=True)
    mixed[:16] = rng.integers(-3 * sizes, 3 * sizes, (16, NUM_CATEGORICAL))
    extremes = np.array([[value] * NUM_CATEGORICAL for value in EXTREMES], dtype=np.int64)
    extremes = np.concatenate([extremes, np.resize(np.array(EXTREMES, np.int64), (1, NUM_CATEGORICAL))])
    cases = {"all_cold": pick(16, cold=True), "mixed": mixed, "extremes": extremes}
    cases["batch_1_cold"] = pick(1, cold=True)
    if all(len(i) for i in hot.ids):
        cases["all_hot"] = pick(16, cold=False)
        cases["batch_1_hot"] = pick(1, cold=False)
    return cases


def dense_inputs(rows: int) -> np.ndarray:
    return np.linspace(0, 2, rows * NUM_DENSE, dtype=np.float32).reshape(rows, NUM_DENSE)


def max_diff(original: Path, dense: onnx.ModelProto, hot: HotSet, store: RowStore, ids: np.ndarray) -> float:
    """Largest |dense model - original| over ``ids``; also checks the cold count is what the ids make."""
    want = ort.InferenceSession(str(original), providers=["CPUExecutionProvider"]).run(
        [OUTPUT], {DENSE_INPUT: dense_inputs(len(ids)), CATEGORICAL_INPUT: ids}
    )[0]
    slots, positions, rows = stage_reference(ids, hot, hot.table_sizes, store)
    session = ort.InferenceSession(dense.SerializeToString(), providers=["CPUExecutionProvider"])
    feeds = {
        DENSE_INPUT: dense_inputs(len(ids)),
        HOT_SLOTS: slots,
        COLD_POSITIONS: positions,
        COLD_ROWS: rows,
    }
    (got,) = session.run([OUTPUT], feeds)
    assert got.shape == want.shape == (len(ids), 1)
    assert len(positions) == int((slots == 0).sum())
    return float(np.abs(got - want).max())


def check_dense_model(original: Path, dense: onnx.ModelProto, hot: HotSet) -> None:
    """Inputs, output, opset, and no table larger than its hot rows + 1."""
    source = onnx.load(str(original), load_external_data=False)
    assert [v.name for v in dense.graph.input] == [DENSE_INPUT, HOT_SLOTS, COLD_POSITIONS, COLD_ROWS]
    assert [v.name for v in dense.graph.output] == [OUTPUT]
    assert dense.graph.input[1].type.tensor_type.shape.dim[0].dim_param
    assert all(CATEGORICAL_INPUT not in node.input for node in dense.graph.node)
    assert list(dense.opset_import) == list(source.opset_import)
    old_tables = {lookup.table for lookup in find_lookups(source)}
    names = {t.name for t in dense.graph.initializer}
    assert not names & old_tables
    hot_tables = [t for t in dense.graph.initializer if t.name.startswith(PREFIX) and t.name.endswith("/hot")]
    assert len(hot_tables) == len(find_lookups(source))
    assert all(t.dims[0] <= 1 + hot.rows for t in hot_tables)
    assert all(t.data_location != TensorProto.EXTERNAL for t in dense.graph.initializer)
    onnx.checker.check_model(dense)


# --- models ---------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def dlrm(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The bundle's DLRM (tiny, untrained, per-table sizes), written by DLRMExporter."""
    import torch

    from export.importers.onnx_dlrm import DLRMExporter
    from models.config import DLRMConfig, save_config
    from models.dlrm import DLRM, WEIGHTS_FILE

    config = DLRMConfig.preset("tiny", table_sizes=SIZES)
    folder = tmp_path_factory.mktemp("dlrm")
    torch.manual_seed(0)
    save_config(config, folder)
    torch.save(DLRM(config).state_dict(), folder / WEIGHTS_FILE)
    path = folder / "dlrm.onnx"
    DLRMExporter(folder).to_onnx(path, 17)
    return path


def _graph(nodes: list, initializers: list, path: Path, opset: int = 17) -> Path:
    """``logit = sum(features) + sum(dense)`` -> sigmoid, saved and checked."""
    initializers.append(numpy_helper.from_array(np.array([1], dtype=np.int64), "axes_1"))
    # ReduceSum takes its axes as an input from opset 13, as an attribute before.
    axes_input, axes_attribute = (["axes_1"], {}) if opset >= 13 else ([], {"axes": [1]})
    nodes += [
        helper.make_node("ReduceSum", ["features", *axes_input], ["logit_ids"], keepdims=1, **axes_attribute),
        helper.make_node(
            "ReduceSum", [DENSE_INPUT, *axes_input], ["logit_dense"], keepdims=1, **axes_attribute
        ),
        helper.make_node("Add", ["logit_ids", "logit_dense"], ["logit"]),
        helper.make_node("Sigmoid", ["logit"], [OUTPUT]),
    ]
    inputs = [
        helper.make_tensor_value_info(DENSE_INPUT, TensorProto.FLOAT, ["batch", NUM_DENSE]),
        helper.make_tensor_value_info(CATEGORICAL_INPUT, TensorProto.INT64, ["batch", NUM_CATEGORICAL]),
    ]
    outputs = [helper.make_tensor_value_info(OUTPUT, TensorProto.FLOAT, ["batch", 1])]
    model = helper.make_model(
        helper.make_graph(nodes, "g", inputs, outputs, initializers),
        opset_imports=[helper.make_opsetid("", opset)],
    )
    model.ir_version = 8
    onnx.checker.check_model(model)
    onnx.save_model(model, str(path))
    return path


def per_column_graph(
    path: Path,
    columns: range | tuple[int, ...] = range(NUM_CATEGORICAL),
    deep_width: Callable[[int], int] = lambda k: DIM,
    opset: int = 17,
    ids_elsewhere: bool = False,
) -> Path:
    """A deep table (``size x D``, ids of shape ``B``, Keras' fix-up on even columns) and a wide table
    (``size x 1``, ids of shape ``B x 1``) per column; the deep rows pass a ReLU layer."""
    rng = np.random.default_rng(2)
    nodes: list = []
    inits = [numpy_helper.from_array(np.array(0, dtype=np.int64), "zero")]
    deep, wide = [], []
    for k in columns:
        size, width = SIZES[k], deep_width(k)
        inits += [
            numpy_helper.from_array(rng.normal(0, 0.3, (size, width)).astype(np.float32), f"deep{k}"),
            numpy_helper.from_array(rng.normal(0, 0.3, (size, 1)).astype(np.float32), f"wide{k}"),
            numpy_helper.from_array(np.array(k, dtype=np.int64), f"k{k}"),
            numpy_helper.from_array(np.array([k], dtype=np.int64), f"start{k}"),
            numpy_helper.from_array(np.array([k + 1], dtype=np.int64), f"stop{k}"),
        ]
        nodes.append(helper.make_node("Gather", [CATEGORICAL_INPUT, f"k{k}"], [f"col{k}"], axis=1))
        source = f"col{k}"
        if k % 2 == 0:  # x < 0 ? x + n : x, as tf2onnx writes Keras' Embedding
            inits.append(numpy_helper.from_array(np.array(size, dtype=np.int64), f"n{k}"))
            nodes += [
                helper.make_node("Less", [f"col{k}", "zero"], [f"neg{k}"]),
                helper.make_node("Not", [f"neg{k}"], [f"pos{k}"]),
                helper.make_node("Cast", [f"neg{k}"], [f"negi{k}"], to=TensorProto.INT64),
                helper.make_node("Cast", [f"pos{k}"], [f"posi{k}"], to=TensorProto.INT64),
                helper.make_node("Add", [f"col{k}", f"n{k}"], [f"wrapped{k}"]),
                helper.make_node("Mul", [f"negi{k}", f"wrapped{k}"], [f"a{k}"]),
                helper.make_node("Mul", [f"col{k}", f"posi{k}"], [f"b{k}"]),
                helper.make_node("Add", [f"a{k}", f"b{k}"], [f"fixed{k}"]),
            ]
            source = f"fixed{k}"
        nodes += [
            helper.make_node("Cast", [source], [f"c32_{k}"], to=TensorProto.INT32),
            helper.make_node("Gather", [f"deep{k}", f"c32_{k}"], [f"e{k}"]),  # B x D
            helper.make_node("Slice", [CATEGORICAL_INPUT, f"start{k}", f"stop{k}", "axes_1"], [f"s{k}"]),
            helper.make_node("Gather", [f"wide{k}", f"s{k}"], [f"w{k}"]),  # B x 1 x 1
        ]
        deep.append(f"e{k}")
        wide.append(f"w{k}")
    hidden_width = sum(deep_width(k) for k in columns)
    inits += [
        numpy_helper.from_array(rng.normal(0, 0.5, (hidden_width, 8)).astype(np.float32), "kernel"),
        numpy_helper.from_array(np.array([-1, len(columns)], dtype=np.int64), "wide_shape"),
    ]
    nodes += [
        helper.make_node("Concat", deep, ["deep"], axis=1),
        helper.make_node("MatMul", ["deep", "kernel"], ["hidden"]),
        helper.make_node("Relu", ["hidden"], ["relu"]),
        helper.make_node("Concat", wide, ["wide_rows"], axis=1),
        helper.make_node("Reshape", ["wide_rows", "wide_shape"], ["wide"]),
        helper.make_node("Concat", ["relu", "wide"], ["looked_up" if ids_elsewhere else "features"], axis=1),
    ]
    if ids_elsewhere:  # the ids also feed the logit directly, not only lookups
        nodes += [
            helper.make_node("Cast", [CATEGORICAL_INPUT], ["ids_float"], to=TensorProto.FLOAT),
            helper.make_node("Concat", ["looked_up", "ids_float"], ["features"], axis=1),
        ]
    return _graph(nodes, inits, path, opset)


def permuted_graph(path: Path) -> Path:
    """A stacked table read as a rebuilt TorchRec DLRM with ``--feature-order`` does: columns permuted
    (a constant Gather on axis 1), Mod by the sizes in table order, Add of the offsets; a 1-D wide table
    read with the same rows."""
    rng = np.random.default_rng(3)
    sizes = [SIZES[c] for c in PERMUTATION]
    rows = sum(sizes)
    inits = [
        numpy_helper.from_array(np.asarray(PERMUTATION, dtype=np.int64), "columns"),
        numpy_helper.from_array(np.asarray([sizes], dtype=np.int64), "sizes"),
        numpy_helper.from_array(np.asarray([table_offsets(sizes)], dtype=np.int64), "offsets"),
        numpy_helper.from_array(rng.normal(0, 0.3, (rows, DIM)).astype(np.float32), "stacked"),
        numpy_helper.from_array(rng.normal(0, 0.3, rows).astype(np.float32), "stacked_wide"),
        numpy_helper.from_array(rng.normal(0, 0.5, (NUM_CATEGORICAL * DIM, 8)).astype(np.float32), "kernel"),
        numpy_helper.from_array(np.array([-1, NUM_CATEGORICAL * DIM], dtype=np.int64), "flat"),
    ]
    nodes = [
        helper.make_node("Gather", [CATEGORICAL_INPUT, "columns"], ["in_table_order"], axis=1),
        helper.make_node("Mod", ["in_table_order", "sizes"], ["reduced"], fmod=0),
        helper.make_node("Add", ["reduced", "offsets"], ["rows"]),
        helper.make_node("Gather", ["stacked", "rows"], ["embedded"]),  # B x 26 x D
        helper.make_node("Reshape", ["embedded", "flat"], ["embedded_flat"]),
        helper.make_node("MatMul", ["embedded_flat", "kernel"], ["hidden"]),
        helper.make_node("Relu", ["hidden"], ["relu"]),
        helper.make_node("Gather", ["stacked_wide", "rows"], ["wide"]),  # B x 26
        helper.make_node("Concat", ["relu", "wide"], ["features"], axis=1),
    ]
    return _graph(nodes, inits, path)


@pytest.fixture(scope="module")
def per_column(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = per_column_graph(tmp_path_factory.mktemp("per_column") / "model.onnx")
    reduction = ensure_id_reduction(path)  # the user's graph fails on ids past its tables
    assert reduction.added and reduction.table_sizes == SIZES
    return path


@pytest.fixture(scope="module")
def permuted(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return permuted_graph(tmp_path_factory.mktemp("permuted") / "model.onnx")


@pytest.fixture(scope="module")
def dlrm_external(tmp_path_factory: pytest.TempPathFactory, dlrm: Path) -> Path:
    """The DLRM with its weights in ``model.onnx.data`` (as exports over 2 GB are written)."""
    path = tmp_path_factory.mktemp("external") / "model.onnx"
    files = save_model(onnx.load(str(dlrm)), path, threshold=0)
    assert len(files) == 2
    return path


MODELS = ("dlrm", "dlrm_external", "permuted", "per_column")


@pytest.fixture(params=MODELS)
def model(request: pytest.FixtureRequest) -> Path:
    return request.getfixturevalue(request.param)


# --- tests ----------------------------------------------------------------------------------------


def test_lookups_are_found_and_placed(dlrm: Path, permuted: Path, per_column: Path) -> None:
    (fused,) = find_lookups(onnx.load(str(dlrm)))
    assert fused.fused and fused.columns == tuple(range(NUM_CATEGORICAL))
    assert fused.row_offsets == table_offsets(SIZES) and fused.divisors == SIZES
    assert (fused.store_column, fused.store_range, fused.width) == ("embedding", (0, 8), 8)

    deep, wide = find_lookups(onnx.load(str(permuted)))
    assert deep.columns == wide.columns == PERMUTATION
    assert deep.divisors == tuple(SIZES[c] for c in PERMUTATION)
    assert deep.row_offsets == table_offsets([SIZES[c] for c in PERMUTATION])
    assert (deep.store_range, wide.store_range, wide.table_shape[1:]) == ((0, DIM), (DIM, DIM + 1), ())

    lookups = find_lookups(onnx.load(str(per_column)))
    assert len(lookups) == 2 * NUM_CATEGORICAL
    assert {(lk.columns, lk.store_column) for lk in lookups} == {
        ((k,), column) for k in range(NUM_CATEGORICAL) for column in ("embedding", "wide")
    }
    assert all(lk.row_offsets == (0,) and lk.divisors == (SIZES[lk.columns[0]],) for lk in lookups)


def test_store_holds_every_row_of_the_graph(
    dlrm: Path, dlrm_external: Path, per_column: Path, tmp_path: Path
):
    weight = numpy_helper.to_array(
        next(t for t in onnx.load(str(dlrm)).graph.initializer if t.name == "embedding.weight")
    )
    for source in (dlrm, dlrm_external):
        store = write_store(source, tmp_path / source.parent.name, "float32", SIZES)
        assert dict(store.spec.columns) == {"embedding": (0, 8)}
        np.testing.assert_array_equal(np.asarray(store.data), weight)
        store.verify()

    store = write_store(per_column, tmp_path / "per_column", "float32", SIZES)
    assert dict(store.spec.columns) == {"embedding": (0, DIM), "wide": (DIM, DIM + 1)}
    tables = {t.name: numpy_helper.to_array(t) for t in onnx.load(str(per_column)).graph.initializer}
    for k in range(NUM_CATEGORICAL):
        np.testing.assert_array_equal(
            store.table(k), np.concatenate([tables[f"deep{k}"], tables[f"wide{k}"]], 1)
        )

    half = write_store(dlrm, tmp_path / "fp16", "float16", SIZES)
    np.testing.assert_array_equal(np.asarray(half.data), weight.astype(np.float16))


@pytest.mark.parametrize("empty", [False, True], ids=["hot-and-cold", "nothing-hot"])
def test_dense_model_answers_as_the_whole_graph(model: Path, empty: bool, tmp_path: Path) -> None:
    hot = hot_set(empty=empty)
    store = write_store(model, tmp_path / "store", "float32", SIZES)
    dense = split_lookups(model, hot, SIZES)
    check_dense_model(model, dense, hot)
    cases = batches(hot)
    diffs = {name: max_diff(model, dense, hot, store, ids) for name, ids in cases.items()}
    assert max(diffs.values()) <= TOLERANCE, diffs
    if not empty:
        assert {"all_hot", "all_cold", "mixed", "extremes", "batch_1_hot", "batch_1_cold"} <= set(diffs)
        assert len(stage_reference(cases["all_hot"], hot, SIZES, store)[1]) == 0  # N = 0


def test_hot_table_is_row_zero_then_each_columns_hot_rows(dlrm: Path) -> None:
    hot = hot_set()
    dense = split_lookups(dlrm, hot, SIZES)
    (table,) = [numpy_helper.to_array(t) for t in dense.graph.initializer if t.name.endswith("/hot")]
    weight = numpy_helper.to_array(
        next(t for t in onnx.load(str(dlrm)).graph.initializer if t.name == "embedding.weight")
    )
    offsets = table_offsets(SIZES)
    expected = np.concatenate(
        [np.zeros((1, 8), np.float32)] + [weight[offsets[t] + hot.ids[t]] for t in range(26)]
    )
    np.testing.assert_array_equal(table, expected)


def test_stage_reference_follows_the_contract(tmp_path: Path, dlrm: Path) -> None:
    hot = hot_set()
    store = write_store(dlrm, tmp_path / "store", "float32", SIZES)
    ids = batches(hot)["mixed"]
    slots, positions, rows = stage_reference(ids, hot, SIZES, store)
    assert slots.dtype == positions.dtype == np.int64 and rows.dtype == np.float32
    reduced = np.mod(ids, np.asarray(SIZES))
    for b in range(len(ids)):
        for t in range(NUM_CATEGORICAL):
            hits = np.flatnonzero(hot.ids[t] == reduced[b, t])
            assert slots[b, t] == (hits[0] + 1 if hits.size else 0)
    np.testing.assert_array_equal(positions, np.flatnonzero(slots.reshape(-1) == 0))
    assert np.all(np.diff(positions) > 0)
    np.testing.assert_array_equal(rows, store.rows(positions % 26, reduced.reshape(-1)[positions]))
    with pytest.raises(ConfigError, match="same 26 tables"):
        stage_reference(ids, hot_set(tuple(s + 1 for s in SIZES)), SIZES, store)


def test_graph_without_lookups_is_refused(tmp_path: Path) -> None:
    rng = np.random.default_rng(0)
    inits = [
        numpy_helper.from_array(rng.normal(size=(10, DIM)).astype(np.float32), "table"),
        numpy_helper.from_array(np.array([0, 1], dtype=np.int64), "fixed_rows"),
        numpy_helper.from_array(np.array([-1, 2 * DIM], dtype=np.int64), "shape"),
        numpy_helper.from_array(np.array([1], dtype=np.int64), "one"),
    ]
    nodes = [  # a Gather on a table, but by constant rows: not an embedding lookup of the ids
        helper.make_node("Gather", ["table", "fixed_rows"], ["rows"]),
        helper.make_node("Reshape", ["rows", "shape"], ["flat"]),
        helper.make_node("ReduceSum", [CATEGORICAL_INPUT, "one"], ["id_sum"], keepdims=1),
        helper.make_node("Cast", ["id_sum"], ["id_float"], to=TensorProto.FLOAT),
        helper.make_node("Mul", ["flat", "id_float"], ["features"]),
    ]
    path = _graph(nodes, inits, tmp_path / "model.onnx")
    with pytest.raises(ExportError, match="no embedding lookups"):
        split_lookups(path, hot_set(), SIZES)
    with pytest.raises(ExportError, match="no embedding lookups"):
        write_store(path, tmp_path / "store", "float32", SIZES)


def test_lookups_that_do_not_fit_one_store_are_refused(tmp_path: Path) -> None:
    missing = per_column_graph(tmp_path / "missing.onnx", columns=range(NUM_CATEGORICAL - 1))
    with pytest.raises(
        ExportError, match=r"embedding \(width 4\) for 25 columns.*no embedding lookup for C26"
    ):
        find_lookups(onnx.load(str(missing)))
    widths = per_column_graph(tmp_path / "widths.onnx", deep_width=lambda k: 3 if k == 5 else DIM)
    with pytest.raises(ExportError, match=r"widths \[1, 3, 4\].*width 3 are neither"):
        find_lookups(onnx.load(str(widths)))


def test_other_refusals(tmp_path: Path, dlrm: Path) -> None:
    with pytest.raises(ExportError, match=r"reduces C1 into 2 rows, table_sizes says 3"):
        split_lookups(dlrm, hot_set(), tuple(s + 1 for s in SIZES))
    old = per_column_graph(tmp_path / "opset10.onnx", opset=10)
    with pytest.raises(ExportError, match=r"opset >= 11 \(ScatterND\); the graph has 10"):
        split_lookups(old, hot_set(), SIZES)
    elsewhere = per_column_graph(tmp_path / "elsewhere.onnx", ids_elsewhere=True)
    with pytest.raises(ExportError, match=r"reads more than its embedding lookups.*categorical_ids"):
        split_lookups(elsewhere, hot_set(), SIZES)
    with pytest.raises(ConfigError, match="hot set was chosen"):
        split_lookups(dlrm, hot_set(tuple(s + 1 for s in SIZES)), SIZES)
