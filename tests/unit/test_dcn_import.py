"""TorchRec DLRM_DCN (DLRM-DCNv2) state dicts: read, rebuilt and exported, against TorchRec's own forward."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
import torch

from bundle.errors import ExportError
from bundle.schema import (
    CATEGORICAL_INPUT,
    DENSE_INPUT,
    LENGTHS_INPUT,
    NUM_CATEGORICAL,
    NUM_DENSE,
    OUTPUT,
    VALUES_INPUT,
)
from criteo.multihot import MLPERF_HOTNESS, BagBatch
from criteo.tsv import Batch
from export.importers.dlrm_sources import CheckpointExporter, open_dlrm_source
from export.importers.sources import SourceOptions
from tests.byom_torch import TABLE_SIZES, in_range
from tests.torchrec_dcn import (
    CROSS_LAYERS,
    CROSS_RANK,
    DIM,
    dcn_bag_logits,
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


def _in_range(ids: np.ndarray, hotness: tuple[int, ...]) -> np.ndarray:
    return np.mod(ids, np.repeat(np.asarray(TABLE_SIZES, dtype=np.int64), hotness)[None, :])


@pytest.mark.parametrize("hotness", [MLPERF_HOTNESS, (3,) * NUM_CATEGORICAL])
def test_multi_hot_bags_export_to_torchrecs_own_answers(dcn, hotness, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    torch.save(train_state(dcn), tmp_path / "dcn.pt")
    exporter = open_dlrm_source(tmp_path / "dcn.pt", SourceOptions(hotness=hotness))
    assert isinstance(exporter, CheckpointExporter)
    assert exporter.source["hotness"] == list(hotness)
    batch = exporter.model_rows(_batch(128, seed=6))
    assert batch.categorical.shape == (128, sum(hotness))
    expected = _sigmoid(dcn_logits(dcn, batch.dense, _in_range(batch.categorical, hotness), hotness))
    np.testing.assert_allclose(exporter.predict(batch), expected, atol=1e-6, rtol=0)
    exporter.to_onnx(tmp_path / "dcn.onnx", OPSET)
    graph = onnx.load(str(tmp_path / "dcn.onnx"))
    assert "Loop" not in {node.op_type for node in graph.graph.node}
    assert "ReduceSum" in {node.op_type for node in graph.graph.node}
    session = ort.InferenceSession(str(tmp_path / "dcn.onnx"), providers=["CPUExecutionProvider"])
    (answer,) = session.run([OUTPUT], {DENSE_INPUT: batch.dense, CATEGORICAL_INPUT: batch.categorical})
    np.testing.assert_allclose(answer, expected, atol=1e-5, rtol=0)


def test_multi_hot_bags_follow_the_feature_order(tmp_path: Path) -> None:
    """With --feature-order, C<k>'s bag is read by the table it names, wherever it lies in the state dict."""
    model = make_dcn(seed=9)
    torch.save(model.state_dict(), tmp_path / "dcn.pt")
    order = tuple(f"t_cat_{(i * 7 + 3) % NUM_CATEGORICAL}" for i in range(NUM_CATEGORICAL))
    hotness = tuple(1 + (i % 4) for i in range(NUM_CATEGORICAL))
    sizes = tuple(TABLE_SIZES[int(name.split("_")[-1])] for name in order)
    exporter = open_dlrm_source(tmp_path / "dcn.pt", SourceOptions(hotness=hotness, feature_order=order))
    batch = exporter.model_rows(_batch(64, seed=8))
    exporter.to_onnx(tmp_path / "dcn.onnx", OPSET)
    session = ort.InferenceSession(str(tmp_path / "dcn.onnx"), providers=["CPUExecutionProvider"])
    (answer,) = session.run([OUTPUT], {DENSE_INPUT: batch.dense, CATEGORICAL_INPUT: batch.categorical})
    # TorchRec's input in its own table order: table t's bag is column order.index(t_cat_t)'s.
    starts = np.concatenate(([0], np.cumsum(hotness)[:-1]))
    reduced = np.mod(batch.categorical, np.repeat(np.asarray(sizes, dtype=np.int64), hotness)[None, :])
    columns = [order.index(f"t_cat_{t}") for t in range(NUM_CATEGORICAL)]
    table_ids = np.concatenate([reduced[:, starts[c] : starts[c] + hotness[c]] for c in columns], axis=1)
    table_hotness = tuple(hotness[c] for c in columns)
    expected = _sigmoid(dcn_logits(model, batch.dense, table_ids, table_hotness))
    np.testing.assert_allclose(answer, expected, atol=1e-5, rtol=0)
    np.testing.assert_allclose(exporter.predict(batch), expected, atol=1e-6, rtol=0)


@pytest.mark.parametrize("permuted", [False, True])
def test_multi_hot_tables_split_hot_cold_answer_as_in_the_graph(tmp_path: Path, permuted: bool) -> None:
    """The hot/cold split of a multi-hot graph (the bags read in C1..C26 order, or in the state
    dict's own order under --feature-order): the stage in-process and the dense model answer as the
    all-in-graph graph, hot, cold and mixed bags alike."""
    from export.graphs.ids import graph_hotness
    from export.tables.hot_cold_graph import split_lookups, write_store
    from export.tables.hot_rows import HotSet
    from export.tables.placement import run_hot_cold

    model = make_dcn(seed=12)
    torch.save(model.state_dict(), tmp_path / "dcn.pt")
    order = (
        tuple(f"t_cat_{(i * 7 + 3) % NUM_CATEGORICAL}" for i in range(NUM_CATEGORICAL)) if permuted else None
    )
    hotness = tuple(1 + (i % 4) for i in range(NUM_CATEGORICAL))
    exporter = open_dlrm_source(tmp_path / "dcn.pt", SourceOptions(hotness=hotness, feature_order=order))
    graph = tmp_path / "dcn.onnx"
    exporter.to_onnx(graph, OPSET)
    assert graph_hotness(onnx.load(str(graph), load_external_data=False)) == hotness
    sizes = exporter.table_sizes
    store = write_store(graph, tmp_path / "rows", "float32", sizes)
    rng = np.random.default_rng(4)
    ids = tuple(rng.permutation(size)[: max(1, size // 3)].astype(np.int64) for size in sizes)
    counts = tuple(np.ones(i.size, dtype=np.int64) for i in ids)
    hot = HotSet(sizes, (16,) * NUM_CATEGORICAL, 10**6, ids, counts, sum(i.size for i in ids))
    dense = tmp_path / "dense.onnx"
    onnx.save(split_lookups(graph, hot, sizes), str(dense))
    batch = exporter.model_rows(_batch(96, seed=5))
    hits = hot.hit_rate(batch, hotness)
    assert 0.1 < hits < 0.9, hits
    session = ort.InferenceSession(str(graph), providers=["CPUExecutionProvider"])
    (expected,) = session.run([OUTPUT], {DENSE_INPUT: batch.dense, CATEGORICAL_INPUT: batch.categorical})
    np.testing.assert_allclose(run_hot_cold(dense, hot, store, batch), expected, atol=1e-6, rtol=0)


def test_hotness_is_refused_where_it_cannot_apply(tmp_path: Path) -> None:
    from bundle.errors import ConfigError
    from criteo.multihot import parse_hotness

    assert parse_hotness("mlperf") == MLPERF_HOTNESS and sum(MLPERF_HOTNESS) == 214
    assert parse_hotness("1") is not None and SourceOptions(hotness=parse_hotness("1")).hotness is None
    with pytest.raises(ConfigError, match="26 counts"):
        parse_hotness("1,2,3")
    with pytest.raises(ConfigError, match=">= 1"):
        parse_hotness("0")
    with pytest.raises(ConfigError, match="--hotness applies to TorchRec and facebookresearch state dicts"):
        open_dlrm_source(
            None, SourceOptions(hotness=MLPERF_HOTNESS, factory="tests.byom_torch:build_factory_model")
        )


def test_a_facebookresearch_dlrm_takes_multi_hot_bags(tmp_path: Path) -> None:
    """facebookresearch/dlrm sums bags too (``lS_o`` offsets of each table's bags): its own forward."""
    from tests.byom_torch import make_facebook_net, save_facebook_checkpoint

    net = make_facebook_net(seed=12)
    path = save_facebook_checkpoint(net, tmp_path / "fb.pt")
    hotness = tuple(1 + (i % 3) for i in range(NUM_CATEGORICAL))
    exporter = open_dlrm_source(path, SourceOptions(hotness=hotness))
    batch = exporter.model_rows(_batch(96, seed=13))
    reduced = _in_range(batch.categorical, hotness)
    starts = np.concatenate(([0], np.cumsum(hotness)[:-1]))
    bags = [
        torch.from_numpy(reduced[:, s : s + h].reshape(-1).copy())
        for s, h in zip(starts, hotness, strict=True)
    ]
    offsets = torch.stack([torch.arange(96) * h for h in hotness])
    with torch.no_grad():
        expected = net(torch.from_numpy(batch.dense), offsets, bags).numpy()
    np.testing.assert_allclose(exporter.predict(batch), expected, atol=1e-6, rtol=0)
    exporter.to_onnx(tmp_path / "fb.onnx", OPSET)
    session = ort.InferenceSession(str(tmp_path / "fb.onnx"), providers=["CPUExecutionProvider"])
    (answer,) = session.run([OUTPUT], {DENSE_INPUT: batch.dense, CATEGORICAL_INPUT: batch.categorical})
    np.testing.assert_allclose(answer, expected, atol=1e-5, rtol=0)


def test_a_dcn_with_equal_biases_exports_its_fp16_variant(tmp_path: Path) -> None:
    """TorchRec initialises the cross net's biases to zero: torch.onnx shares equal weights through
    Identity nodes, which must not turn the FP32 cross net's inputs into FP16."""
    from export.options import ExportOptions
    from export.pipeline import export_family

    model = make_dcn(seed=14)
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            if "crossnet.bias" in name:
                parameter.zero_()
    torch.save(train_state(model), tmp_path / "dcn.pt")
    exporter = open_dlrm_source(tmp_path / "dcn.pt", SourceOptions(hotness=(2,) * NUM_CATEGORICAL))
    results = export_family(
        exporter, ExportOptions(repository=tmp_path / "repo", int8=False, check_rows=1024, raw_rows=False)
    )
    assert [r.name for r in results] == ["dlrm_onnx", "dlrm_onnx_fp16"]
    graph = onnx.load(str(tmp_path / "repo" / "dlrm_onnx_fp16" / "1" / "model.onnx"))
    session = ort.InferenceSession(graph.SerializeToString(), providers=["CPUExecutionProvider"])
    batch = exporter.model_rows(_batch(32, seed=15))
    (answer,) = session.run([OUTPUT], {DENSE_INPUT: batch.dense, CATEGORICAL_INPUT: batch.categorical})
    expected = exporter.predict(batch)
    np.testing.assert_allclose(answer, expected, atol=5e-3, rtol=0)


def _bag_columns(bags: BagBatch) -> np.ndarray:
    return bags.value_columns()


def test_bags_of_any_size_export_to_torchrecs_own_answers(dcn, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    """Values and lengths, empty bags included, any int64 id: the graph, the export's own reference
    and TorchRec's forward on a KeyedJaggedTensor agree."""
    torch.save(train_state(dcn), tmp_path / "dcn.pt")
    exporter = open_dlrm_source(tmp_path / "dcn.pt", SourceOptions(variable_bags=True))
    assert isinstance(exporter, CheckpointExporter) and exporter.source["hotness"] == "variable"
    bags = exporter.model_rows(_batch(128, seed=6))
    assert isinstance(bags, BagBatch) and (bags.lengths == 0).sum() > 100
    bags = BagBatch(bags.dense, bags.values, None, bags.lengths)
    bags.lengths[3] = 0  # a row whose every bag is empty
    bags = BagBatch(bags.dense, bags.values[: int(bags.lengths.sum())], None, bags.lengths)
    in_range = np.mod(bags.values, np.asarray(TABLE_SIZES, dtype=np.int64)[_bag_columns(bags)])
    expected = _sigmoid(dcn_bag_logits(dcn, bags.dense, in_range, bags.lengths))
    np.testing.assert_allclose(exporter.predict(bags), expected, atol=1e-6, rtol=0)
    exporter.to_onnx(tmp_path / "dcn.onnx", OPSET)
    graph = onnx.load(str(tmp_path / "dcn.onnx"))
    assert [i.name for i in graph.graph.input] == [DENSE_INPUT, VALUES_INPUT, LENGTHS_INPUT]
    assert "Loop" not in {node.op_type for node in graph.graph.node}
    session = ort.InferenceSession(str(tmp_path / "dcn.onnx"), providers=["CPUExecutionProvider"])
    (answer,) = session.run([OUTPUT], bags.inputs())
    np.testing.assert_allclose(answer, expected, atol=1e-5, rtol=0)
    # One row alone, and a batch sliced out of the middle, give the same answers.
    for start, stop in ((0, 1), (50, 77)):
        (part,) = session.run([OUTPUT], bags.slice(start, stop).inputs())
        np.testing.assert_allclose(part, expected[start:stop], atol=1e-5, rtol=0)


def test_bag_lengths_that_do_not_fit_the_values_are_refused_by_the_graph(dcn, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    """With ONNX Runtime's full graph optimizations, as the server runs it: an error, never an answer."""
    torch.save(dcn.state_dict(), tmp_path / "dcn.pt")
    exporter = open_dlrm_source(tmp_path / "dcn.pt", SourceOptions(variable_bags=True))
    exporter.to_onnx(tmp_path / "dcn.onnx", OPSET)
    session = ort.InferenceSession(str(tmp_path / "dcn.onnx"), providers=["CPUExecutionProvider"])
    bags = exporter.model_rows(_batch(8, seed=2))
    dense, values, lengths = bags.dense, bags.values, bags.lengths.copy()
    short = lengths.copy()
    short[0, 0] += 1  # the lengths add up to one more than the values
    long = lengths.copy()
    long[long > 0] -= 1  # to fewer
    negative = lengths.copy()
    negative[2, 5], negative[2, 6] = -1, negative[2, 6] + 1  # a negative length, same sum
    for name, bad in (("more", short), ("fewer", long), ("negative", negative)):
        with pytest.raises(Exception, match="out of"):
            session.run([OUTPUT], {DENSE_INPUT: dense, VALUES_INPUT: values, LENGTHS_INPUT: bad})
        assert name


def test_bags_of_any_size_refuse_what_cannot_carry_them(tmp_path: Path) -> None:
    from bundle.errors import ConfigError

    torch.save(make_dcn(seed=1).state_dict(), tmp_path / "dcn.pt")
    with pytest.raises(ConfigError, match="no fixed hotness"):
        SourceOptions(variable_bags=True, hotness=MLPERF_HOTNESS)
    exporter = open_dlrm_source(tmp_path / "dcn.pt", SourceOptions(variable_bags=True))
    with pytest.raises(ConfigError, match="opset >= 16"):
        exporter.to_onnx(tmp_path / "dcn.onnx", 15)
    with pytest.raises(ExportError, match="TorchScript variant takes categorical_ids"):
        exporter.torch_serving()


def test_bags_of_any_size_follow_the_feature_order(tmp_path: Path) -> None:
    """With --feature-order, C<k>'s bag of any size is summed by the table it names."""
    model = make_dcn(seed=9)
    torch.save(model.state_dict(), tmp_path / "dcn.pt")
    order = tuple(f"t_cat_{(i * 7 + 3) % NUM_CATEGORICAL}" for i in range(NUM_CATEGORICAL))
    exporter = open_dlrm_source(tmp_path / "dcn.pt", SourceOptions(variable_bags=True, feature_order=order))
    bags = exporter.model_rows(_batch(64, seed=8))
    assert isinstance(bags, BagBatch)
    exporter.to_onnx(tmp_path / "dcn.onnx", OPSET)
    session = ort.InferenceSession(str(tmp_path / "dcn.onnx"), providers=["CPUExecutionProvider"])
    (answer,) = session.run([OUTPUT], bags.inputs())
    # TorchRec's input in its own table order: table t's bags are column order.index(t_cat_t)'s.
    sizes = np.asarray([TABLE_SIZES[int(name.split("_")[-1])] for name in order], dtype=np.int64)
    column_of = _bag_columns(bags)
    reduced = np.mod(bags.values, sizes[column_of])
    columns = [order.index(f"t_cat_{t}") for t in range(NUM_CATEGORICAL)]
    per_column = [reduced[column_of == c] for c in range(NUM_CATEGORICAL)]
    lengths = bags.lengths[:, columns]
    # Back to row-major values in table order, as dcn_bag_logits takes them.
    starts = [np.concatenate(([0], np.cumsum(bags.lengths[:, c]))) for c in range(NUM_CATEGORICAL)]
    values = np.concatenate(
        [per_column[c][starts[c][row] : starts[c][row + 1]] for row in range(len(bags)) for c in columns]
    )
    expected = _sigmoid(dcn_bag_logits(model, bags.dense, values, lengths))
    np.testing.assert_allclose(answer, expected, atol=1e-5, rtol=0)
    np.testing.assert_allclose(exporter.predict(bags), expected, atol=1e-6, rtol=0)
