"""Bring your own PyTorch DLRM: detection, layouts, interaction order, errors (no server, tiny models)."""

from __future__ import annotations

import logging
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
import torch
from torch import nn

from bundle.errors import ConfigError, ExportError
from bundle.schema import CATEGORICAL_INPUT, DENSE_INPUT, NUM_CATEGORICAL, NUM_DENSE, OUTPUT
from criteo.tsv import Batch
from export.importers.dlrm_layouts import read_layout
from export.importers.dlrm_rebuild import (
    GatherDLRM,
    PairInteraction,
    reference_module,
    reference_probabilities,
)
from export.importers.dlrm_sources import CheckpointExporter, detect_format, open_dlrm_source
from export.importers.onnx_dlrm import DLRMExporter
from export.importers.sources import SourceOptions
from export.importers.torch_module import TorchModuleExporter, program_module
from export.importers.torch_onnx import interaction_nodes, loop_nodes, output_sigmoids, single_id_bags
from models.config import DLRMConfig, save_config
from models.dlrm import DLRM, WEIGHTS_FILE
from tests.byom_torch import (
    FACTORY_ENV,
    TABLE_SIZES,
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

# The test's own facebookresearch-layout module builds its pair lists with torch.tensor (as the source does).
pytestmark = pytest.mark.filterwarnings("ignore::torch.jit.TracerWarning")

OPSET = 17
INT64 = np.iinfo(np.int64)
EXTREMES = np.array([INT64.min, INT64.max, -1, 10**12, -(2**40) - 3, 2**62 + 11], dtype=np.int64)


def _batch(rows: int = 64, seed: int = 0, extreme: bool = False) -> Batch:
    rng = np.random.default_rng(seed)
    dense = rng.random((rows, NUM_DENSE), dtype=np.float32) * 3
    ids = rng.integers(-(2**62), 2**62, (rows, NUM_CATEGORICAL), dtype=np.int64)
    if extreme:
        ids[:] = np.resize(EXTREMES, ids.shape)
    return Batch(dense, ids, None)


def _run(path: Path, batch: Batch) -> np.ndarray:
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    return session.run([OUTPUT], {DENSE_INPUT: batch.dense, CATEGORICAL_INPUT: batch.categorical})[0]


@pytest.fixture(scope="module")
def fb_net() -> nn.Module:
    return make_facebook_net(seed=3)


@pytest.fixture(scope="module")
def torchrec_model() -> TorchRecDLRM:
    torch.manual_seed(5)
    return TorchRecDLRM(torchrec_sizes()).eval()


def _torchrec_file(model: TorchRecDLRM, path: Path, prefix: str = "model.") -> Path:
    torch.save({prefix + key: value for key, value in model.state_dict().items()}, path)
    return path


# --- detection ----------------------------------------------------------------------------------


def test_formats_are_told_apart_by_their_archives(fb_net: nn.Module, tmp_path: Path) -> None:
    adapter = FacebookAdapter(fb_net).eval()
    inputs = (torch.rand(4, NUM_DENSE), torch.zeros(4, NUM_CATEGORICAL, dtype=torch.int64))
    torch.jit.save(torch.jit.trace(adapter, inputs), tmp_path / "traced.pt")
    torch.jit.save(torch.jit.script(nn.Linear(2, 1)), tmp_path / "scripted.pt")
    batch = torch.export.Dim("batch")
    program = torch.export.export(adapter, inputs, dynamic_shapes=({0: batch}, {0: batch}))
    torch.export.save(program, tmp_path / "program.pt2")
    save_facebook_checkpoint(fb_net, tmp_path / "checkpoint.pt")
    assert detect_format(tmp_path / "traced.pt") == "torchscript"
    assert detect_format(tmp_path / "scripted.pt") == "torchscript"
    assert detect_format(tmp_path / "program.pt2") == "torch_export"
    assert detect_format(tmp_path / "checkpoint.pt") == "torch_save"


@pytest.mark.parametrize(
    ("content", "found"),
    [
        (b"hello, this is a README\n", "a text file"),
        (b"", "an empty file"),
        (b"\x80\x02\xff\x00" * 40, "binary"),
    ],
)
def test_a_file_that_is_no_model_gets_one_line(tmp_path: Path, content: bytes, found: str) -> None:
    path = tmp_path / "model.pt"
    path.write_bytes(content)
    with pytest.raises(ExportError) as error:
        open_dlrm_source(path, SourceOptions())
    message = str(error.value)
    assert "\n" not in message and found in message and "TorchScript" in message and "TorchRec" in message


def test_a_zip_that_is_no_model_and_a_missing_path(tmp_path: Path) -> None:
    import zipfile

    with zipfile.ZipFile(tmp_path / "x.zip", "w") as archive:
        archive.writestr("x/readme.txt", "no model")
    with pytest.raises(ExportError, match="zip archive of 1 files that is no PyTorch model"):
        open_dlrm_source(tmp_path / "x.zip", SourceOptions())
    with pytest.raises(ConfigError, match="not found"):
        open_dlrm_source(tmp_path / "absent.pt", SourceOptions())
    with pytest.raises(ConfigError, match="--checkpoint"):
        open_dlrm_source(None, SourceOptions())


def test_a_pickled_module_is_refused_without_running_it(fb_net: nn.Module, tmp_path: Path) -> None:
    torch.save(fb_net, tmp_path / "whole.pt")
    with pytest.raises(ExportError, match=r"pickles Python objects \(tests\.byom_torch\.FacebookDLRMNet\)"):
        open_dlrm_source(tmp_path / "whole.pt", SourceOptions())


def test_an_unknown_state_dict_names_both_layouts(tmp_path: Path) -> None:
    torch.save({"encoder.weight": torch.zeros(3, 3)}, tmp_path / "other.pt")
    with pytest.raises(ExportError) as error:
        open_dlrm_source(tmp_path / "other.pt", SourceOptions())
    assert "encoder.weight" in str(error.value) and "emb_l.<k>.weight" in str(error.value)
    assert "sparse_arch.embedding_bag_collection" in str(error.value)


def test_the_bundles_training_directory_goes_to_its_own_exporter(tmp_path: Path) -> None:
    config = DLRMConfig.preset("tiny", table_size=50)
    save_config(config, tmp_path)
    torch.save(DLRM(config).state_dict(), tmp_path / WEIGHTS_FILE)
    assert isinstance(open_dlrm_source(tmp_path, SourceOptions()), DLRMExporter)
    with pytest.raises(ConfigError, match=r"config\.json"):
        open_dlrm_source(tmp_path, SourceOptions(feature_order=tuple(f"t{i}" for i in range(26))))
    torch.save(DLRM(config).state_dict(), tmp_path / "bare.pt")
    with pytest.raises(ExportError, match=r"bundle's own model\.pt"):
        open_dlrm_source(tmp_path / "bare.pt", SourceOptions())
    (tmp_path / "empty").mkdir()
    with pytest.raises(ConfigError, match=r"directory without config\.json"):
        open_dlrm_source(tmp_path / "empty", SourceOptions())


# --- facebookresearch/dlrm ----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("kwargs", "interaction", "itself", "top_in"),
    [
        ({}, "dot", False, 4 + 351),
        ({"itself": True}, "dot", True, 4 + 378),
        ({"interaction": "cat"}, "cat", False, 4 + 26 * 4),
        ({"interaction": "cat", "bottom": (8, 6)}, "cat", False, 6 + 26 * 4),
    ],
)
def test_facebook_layout_is_read_from_the_weight_shapes(
    kwargs: dict[str, object], interaction: str, itself: bool, top_in: int
) -> None:
    net = make_facebook_net(seed=1, **kwargs)
    layout, state = read_layout({f"module.{k}": v for k, v in net.state_dict().items()}, "x.pt")
    assert (layout.interaction, layout.self_interaction) == (interaction, itself)
    assert layout.rows == TABLE_SIZES and layout.dim == 4
    assert layout.top == (16, 8, 1) and state["top_l.0.weight"].shape[1] == top_in
    batch = _batch(128, seed=2)
    reduced = in_range(batch.categorical)
    expected = facebook_probabilities(net, batch.dense, reduced)
    with torch.no_grad():
        rebuilt = GatherDLRM(layout, state, layout.rows)(
            torch.from_numpy(batch.dense), torch.from_numpy(batch.categorical)
        )
    reference = reference_probabilities(
        layout, reference_module(layout, state), torch.from_numpy(batch.dense), torch.from_numpy(reduced)
    )
    np.testing.assert_allclose(rebuilt.numpy(), expected, atol=1e-6)
    np.testing.assert_allclose(reference.numpy(), expected, atol=1e-6)


def test_facebook_checkpoint_exports_with_the_source_interaction(fb_net: nn.Module, tmp_path: Path) -> None:
    path = save_facebook_checkpoint(fb_net, tmp_path / "dlrm.pt")
    exporter = open_dlrm_source(path, SourceOptions())
    assert isinstance(exporter, CheckpointExporter) and exporter.family == "dlrm"
    exporter.to_onnx(tmp_path / "model.onnx", OPSET)
    model = onnx.load(str(tmp_path / "model.onnx"))
    assert not loop_nodes(model)
    assert [n.op_type for n in model.graph.node].count("Gather") == 2  # the lookup and the pair selection
    batch, extreme = _batch(200, seed=4), _batch(12, seed=5, extreme=True)
    expected = facebook_probabilities(fb_net, batch.dense, in_range(batch.categorical))
    np.testing.assert_allclose(exporter.predict(batch), expected, atol=1e-6)
    np.testing.assert_allclose(_run(tmp_path / "model.onnx", batch), expected, atol=1e-5)
    served = _run(tmp_path / "model.onnx", extreme)
    np.testing.assert_allclose(served, exporter.predict(extreme), atol=1e-5)
    assert np.all(np.isfinite(served) & (served >= 0) & (served <= 1))
    source = exporter.source
    assert source["format"] == "facebookresearch_dlrm_checkpoint" and source["id_reduction_added"] is True
    assert source["table_sizes"] == list(TABLE_SIZES) and exporter.table_sizes == TABLE_SIZES
    assert "lower triangle" in source["interaction"]
    keep = exporter.fp32_nodes(model)
    assert any(n.startswith("/interaction/") and "MatMul" in n for n in keep) and keep[-1] == "/Sigmoid"
    bare = open_dlrm_source(
        save_facebook_checkpoint(fb_net, tmp_path / "bare.pt", bare=True), SourceOptions()
    )
    assert bare.source["format"] == "facebookresearch_dlrm_state_dict"
    # torch.save's pre-1.6 format (a plain pickle, no zip) reads the same.
    torch.save(fb_net.state_dict(), tmp_path / "legacy.pt", _use_new_zipfile_serialization=False)
    legacy = open_dlrm_source(tmp_path / "legacy.pt", SourceOptions())
    np.testing.assert_allclose(legacy.predict(batch), expected, atol=1e-6)


def test_facebook_cat_interaction_keeps_only_the_sigmoid_fp32(tmp_path: Path) -> None:
    net = make_facebook_net(seed=2, interaction="cat")
    exporter = open_dlrm_source(
        save_facebook_checkpoint(net, tmp_path / "cat.pt", bare=True), SourceOptions()
    )
    exporter.to_onnx(tmp_path / "cat.onnx", OPSET)
    assert exporter.fp32_nodes(onnx.load(str(tmp_path / "cat.onnx"))) == ["/Sigmoid"]
    batch = _batch(64, seed=3)
    expected = facebook_probabilities(net, batch.dense, in_range(batch.categorical))
    np.testing.assert_allclose(_run(tmp_path / "cat.onnx", batch), expected, atol=1e-5)


def test_smaller_table_sizes_are_taken_larger_ones_refused(fb_net: nn.Module, tmp_path: Path) -> None:
    path = save_facebook_checkpoint(fb_net, tmp_path / "dlrm.pt", bare=True)
    smaller = tuple(max(1, size // 2) for size in TABLE_SIZES)
    exporter = open_dlrm_source(path, SourceOptions(table_sizes=smaller))
    assert exporter.table_sizes == smaller and exporter.source["table_sizes_from"] == "--table-sizes"
    batch = _batch(32)
    expected = facebook_probabilities(fb_net, batch.dense, in_range(batch.categorical, smaller))
    np.testing.assert_allclose(exporter.predict(batch), expected, atol=1e-6)
    with pytest.raises(ConfigError, match=r"exceed the checkpoint's tables: C1=4 > 3"):
        open_dlrm_source(path, SourceOptions(table_sizes=tuple(s + 1 for s in TABLE_SIZES)))
    with pytest.raises(ConfigError, match="--logits"):
        open_dlrm_source(path, SourceOptions(logits=True))
    with pytest.raises(ConfigError, match="--feature-order"):
        open_dlrm_source(path, SourceOptions(feature_order=tuple(f"t{i}" for i in range(26))))


def _fb_state(net: nn.Module, drop: tuple[str, ...] = (), add: dict[str, torch.Tensor] | None = None) -> dict:
    state = {k: v for k, v in net.state_dict().items() if not k.startswith(drop)}
    state.update(add or {})
    return state


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (
            {"drop": ("emb_l.25.",)},
            r"found tables emb_l.0..emb_l.24 \(25\), missing emb_l.25; expected emb_l.0..emb_l.25 \(26",
        ),
        (
            {"drop": ("emb_l.10.",)},
            r"found tables emb_l.0..emb_l.9, emb_l.11..emb_l.25 \(25\), missing emb_l.10; expected emb_l.0",
        ),
        (
            {"add": {"emb_l.26.weight": torch.zeros(5, 4)}},
            r"emb_l.0..emb_l.26 \(27\); expected emb_l.0..emb_l.25",
        ),
        ({"add": {"emb_l.3.weight_q": torch.zeros(5, 4)}}, r"quotient-remainder embedding \(--qr-flag\)"),
        ({"add": {"emb_l.3.embs.0.weight": torch.zeros(5, 2)}}, r"mixed-dimension embedding \(--md-flag\)"),
        ({"add": {"v_W_l.0": torch.zeros(5)}}, r"learned pooling weight \(--weighted-pooling\)"),
        ({"drop": ("top_l.2.",)}, r"top_l: Linear layers at indices \[0, 4\]; expected \[0, 2\]"),
        (
            {"add": {"bot_l.0.weight": torch.zeros(8, 12)}},
            "bot_l.0 takes 12 inputs; the layer before gives 13",
        ),
        ({"add": {"top_l.0.weight": torch.zeros(16, 300)}}, "the top MLP takes 300 inputs"),
    ],
)
def test_unsupported_facebook_checkpoints_get_one_line(
    fb_net: nn.Module, tmp_path: Path, change: dict, message: str
) -> None:
    path = tmp_path / "dlrm.pt"
    torch.save({"epoch": 1, "state_dict": _fb_state(fb_net, **change)}, path)
    with pytest.raises(ExportError, match=message) as error:
        open_dlrm_source(path, SourceOptions())
    assert "\n" not in str(error.value) and str(path) in str(error.value)


# --- TorchRec -----------------------------------------------------------------------------------


def test_torchrec_rebuild_and_reference_match_torchrecs_forward(
    torchrec_model: TorchRecDLRM, tmp_path: Path
) -> None:
    order = torchrec_feature_order()
    exporter = open_dlrm_source(
        _torchrec_file(torchrec_model, tmp_path / "tr.pt"), SourceOptions(feature_order=order)
    )
    assert isinstance(exporter, CheckpointExporter) and exporter.layout.logits
    assert exporter.table_sizes == TABLE_SIZES  # C1..C26's tables, through --feature-order
    batch = _batch(256, seed=7)
    reduced = in_range(batch.categorical)
    expected = 1 / (1 + np.exp(-torchrec_logits(torchrec_model, batch.dense, reduced).astype(np.float64)))
    np.testing.assert_allclose(exporter.predict(batch), expected, atol=1e-6)
    exporter.to_onnx(tmp_path / "tr.onnx", OPSET)
    assert not loop_nodes(onnx.load(str(tmp_path / "tr.onnx")))
    np.testing.assert_allclose(_run(tmp_path / "tr.onnx", batch), expected, atol=1e-5)
    source = exporter.source
    assert source["format"] == "torchrec_dlrm_state_dict" and "upper triangle" in source["interaction"]
    assert list(source["feature_order"]) == [f"C{i}" for i in range(1, 27)]
    assert list(source["feature_order"].values()) == list(order)


def test_torchrec_pair_order_is_the_upper_triangle(torchrec_model: TorchRecDLRM) -> None:
    """The same weights read with facebookresearch's lower-triangle order give another model."""
    import dataclasses

    state = {f"model.{k}": v for k, v in torchrec_model.state_dict().items()}
    layout, plain = read_layout(state, "tr.pt", torchrec_feature_order())
    upper = GatherDLRM(layout, plain, layout.rows)
    lower = GatherDLRM(layout, plain, layout.rows)
    lower.interaction = PairInteraction(dataclasses.replace(layout, codebase="facebookresearch").pairs())
    batch = _batch(64, seed=8)
    with torch.no_grad():
        dense, ids = torch.from_numpy(batch.dense), torch.from_numpy(batch.categorical)
        difference = (upper(dense, ids) - lower(dense, ids)).abs().max().item()
    assert difference > 1e-3
    assert layout.pairs()[:3] == [(0, 1), (0, 2), (0, 3)]
    assert dataclasses.replace(layout, codebase="facebookresearch").pairs()[:3] == [(1, 0), (2, 0), (2, 1)]


def test_torchrec_default_feature_order_is_the_state_dicts(
    torchrec_model: TorchRecDLRM, tmp_path: Path
) -> None:
    exporter = open_dlrm_source(
        _torchrec_file(torchrec_model, tmp_path / "tr.pt", prefix=""), SourceOptions()
    )
    assert isinstance(exporter, CheckpointExporter)
    assert exporter.layout.columns == tuple(range(NUM_CATEGORICAL))
    assert exporter.table_sizes == exporter.layout.rows


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (
            {"inter_arch.crossnet.kernels.0": torch.zeros(4, 4)},
            "not a parameter of DLRM_DCN's LowRankCrossNet",
        ),
        ({"inter_arch.interaction_branch1._mlp.0._linear.weight": torch.zeros(4, 4)}, "DLRM_Projection"),
        (
            {"sparse_arch.embedding_bag_collection.embedding_bags.extra.weight": torch.zeros(5, 4)},
            "found 27 tables",
        ),
    ],
)
def test_unsupported_torchrec_variants_get_one_line(
    torchrec_model: TorchRecDLRM, tmp_path: Path, extra: dict, message: str
) -> None:
    torch.save({**torchrec_model.state_dict(), **extra}, tmp_path / "tr.pt")
    with pytest.raises(ExportError, match=message) as error:
        open_dlrm_source(tmp_path / "tr.pt", SourceOptions())
    assert "\n" not in str(error.value)


def test_torchrec_feature_order_must_name_its_tables(torchrec_model: TorchRecDLRM, tmp_path: Path) -> None:
    path = _torchrec_file(torchrec_model, tmp_path / "tr.pt")
    wrong = (*torchrec_feature_order()[:-1], "t_nope")
    with pytest.raises(ConfigError, match="--feature-order names t_nope, not a table"):
        open_dlrm_source(path, SourceOptions(feature_order=wrong))


# --- modules: TorchScript, torch.export, --factory ----------------------------------------------


def test_torchscript_exports_embedding_bags_as_gathers(fb_net: nn.Module, tmp_path: Path) -> None:
    adapter = FacebookAdapter(fb_net).eval()
    inputs = (torch.rand(4, NUM_DENSE), torch.from_numpy(in_range(np.arange(104).reshape(4, 26))))
    torch.jit.save(torch.jit.trace(adapter, inputs), tmp_path / "ts.pt")
    exporter = open_dlrm_source(tmp_path / "ts.pt", SourceOptions())
    assert isinstance(exporter, TorchModuleExporter)
    exporter.to_onnx(tmp_path / "ts.onnx", OPSET)
    model = onnx.load(str(tmp_path / "ts.onnx"))
    assert not loop_nodes(model)
    assert exporter.table_sizes == TABLE_SIZES  # read from the graph's tables by export.graphs.ids
    assert exporter.source["id_reduction_added"] is True and exporter.source["format"] == "torchscript"
    batch, extreme = _batch(128, seed=9), _batch(12, seed=10, extreme=True)
    expected = facebook_probabilities(fb_net, batch.dense, in_range(batch.categorical))
    np.testing.assert_allclose(exporter.predict(batch), expected, atol=1e-6)
    np.testing.assert_allclose(_run(tmp_path / "ts.onnx", batch), expected, atol=1e-5)
    np.testing.assert_allclose(_run(tmp_path / "ts.onnx", extreme), exporter.predict(extreme), atol=1e-5)
    keep = exporter.fp32_nodes(model)
    assert any("MatMul" in name for name in keep) and keep[-1] == output_sigmoids(model)[0]


class _TwoIdBags(nn.Module):
    """Bags of two ids (C1 and C2 in one bag): torch.onnx must keep its Loop."""

    def __init__(self) -> None:
        super().__init__()
        self.bag = nn.EmbeddingBag(10, 3, mode="sum")
        self.out = nn.Linear(NUM_DENSE + 3, 1)

    def forward(self, dense: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
        offsets = torch.arange(0, 2 * ids.shape[0], 2)
        pooled = self.bag(ids[:, :2].reshape(-1), offsets)
        return self.out(torch.cat([dense, pooled], dim=1)).squeeze(1)


def test_bags_of_several_ids_keep_their_loop_with_a_warning(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    torch.manual_seed(0)
    module = _TwoIdBags().eval()
    inputs = (torch.rand(4, NUM_DENSE), torch.zeros(4, NUM_CATEGORICAL, dtype=torch.int64))
    calls = single_id_bags(module, inputs)
    assert len(calls) == 1 and not calls[0].single_id and calls[0].ids == 8 and calls[0].bags == 4
    torch.jit.save(torch.jit.trace(module, inputs), tmp_path / "two.pt")
    sizes = (10,) * NUM_CATEGORICAL
    exporter = open_dlrm_source(tmp_path / "two.pt", SourceOptions(table_sizes=sizes, logits=True))
    with caplog.at_level(logging.WARNING):
        exporter.to_onnx(tmp_path / "two.onnx", OPSET)
    assert loop_nodes(onnx.load(str(tmp_path / "two.onnx")))
    assert "Loop" in caplog.text and "--factory" in caplog.text and "14x slower" in caplog.text
    batch = _batch(16)
    reduced = torch.from_numpy(np.mod(batch.categorical, 10))
    with torch.no_grad():
        expected = torch.sigmoid(module(torch.from_numpy(batch.dense), reduced)).numpy()[:, None]
    np.testing.assert_allclose(_run(tmp_path / "two.onnx", batch), expected, atol=1e-5)
    assert exporter.fp32_nodes(onnx.load(str(tmp_path / "two.onnx"))) == output_sigmoids(
        onnx.load(str(tmp_path / "two.onnx"))
    )


class _BagForms(nn.Module):
    """One-id bags called the other ways: ``B x 1`` ids without offsets, and per-sample weights."""

    def __init__(self) -> None:
        super().__init__()
        self.plain = nn.EmbeddingBag(7, 3, mode="sum")
        self.weighted = nn.EmbeddingBag(5, 3, mode="sum")
        self.mean = nn.EmbeddingBag(6, 3, mode="mean", include_last_offset=True)
        self.out = nn.Linear(NUM_DENSE + 9, 1)

    def forward(self, dense: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
        batch = ids.shape[0]
        a = self.plain(torch.remainder(ids[:, 0:1], 7))
        b = self.weighted(torch.remainder(ids[:, 1], 5), torch.arange(batch), per_sample_weights=dense[:, 0])
        c = self.mean(torch.remainder(ids[:, 2], 6), torch.arange(batch + 1))
        return torch.sigmoid(self.out(torch.cat([dense, a, b, c], dim=1)))


def test_one_id_bags_in_every_calling_form_export_as_gathers(tmp_path: Path) -> None:
    torch.manual_seed(0)
    module = _BagForms().eval()
    inputs = (torch.rand(4, NUM_DENSE), torch.zeros(4, NUM_CATEGORICAL, dtype=torch.int64))
    assert [call.single_id for call in single_id_bags(module, inputs)] == [True, True, True]
    exporter = TorchModuleExporter(module, "factory", SourceOptions(factory="x:y"), None, "")
    exporter.to_onnx(tmp_path / "bags.onnx", OPSET)
    assert not loop_nodes(onnx.load(str(tmp_path / "bags.onnx")))
    assert exporter.source["embedding_bags"] == "one Gather each"
    assert exporter.source["id_reduction_added"] is False  # the module reduces its ids itself
    batch = _batch(50, seed=12)
    np.testing.assert_allclose(_run(tmp_path / "bags.onnx", batch), exporter.predict(batch), atol=1e-6)


def test_torch_export_program_with_a_fixed_batch_is_refused(fb_net: nn.Module, tmp_path: Path) -> None:
    adapter = FacebookAdapter(fb_net).eval()
    inputs = (torch.rand(4, NUM_DENSE), torch.zeros(4, NUM_CATEGORICAL, dtype=torch.int64))
    with pytest.raises(ExportError, match="fixed batch of 4 rows"):
        program_module(torch.export.export(adapter, inputs), "p.pt2")


def test_torch_export_program_runs_at_any_batch(fb_net: nn.Module, tmp_path: Path) -> None:
    adapter = FacebookAdapter(fb_net).eval()
    inputs = (torch.rand(4, NUM_DENSE), torch.zeros(4, NUM_CATEGORICAL, dtype=torch.int64))
    batch_dim = torch.export.Dim("batch")
    program = torch.export.export(adapter, inputs, dynamic_shapes=({0: batch_dim}, {0: batch_dim}))
    torch.export.save(program, tmp_path / "p.pt2")
    exporter = open_dlrm_source(tmp_path / "p.pt2", SourceOptions())
    exporter.to_onnx(tmp_path / "p.onnx", OPSET)
    assert not loop_nodes(onnx.load(str(tmp_path / "p.onnx")))
    for rows in (1, 7, 300):
        batch = _batch(rows, seed=rows)
        expected = facebook_probabilities(fb_net, batch.dense, in_range(batch.categorical))
        np.testing.assert_allclose(_run(tmp_path / "p.onnx", batch), expected, atol=1e-5)
        np.testing.assert_allclose(exporter.predict(batch), expected, atol=1e-6)


def test_factory_module_runs_as_the_users_own(
    fb_net: nn.Module, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(FACTORY_ENV, str(save_facebook_checkpoint(fb_net, tmp_path / "w.pt")))
    exporter = open_dlrm_source(None, SourceOptions(factory="tests.byom_torch:build_factory_model"))
    assert isinstance(exporter, TorchModuleExporter) and exporter.source["format"] == "factory"
    exporter.to_onnx(tmp_path / "f.onnx", OPSET)
    assert not loop_nodes(onnx.load(str(tmp_path / "f.onnx")))
    batch = _batch(64, seed=11)
    expected = facebook_probabilities(fb_net, batch.dense, in_range(batch.categorical))
    np.testing.assert_allclose(_run(tmp_path / "f.onnx", batch), expected, atol=1e-5)


def test_factory_errors_are_one_line() -> None:
    with pytest.raises(ConfigError, match="cannot import no_such_package"):
        open_dlrm_source(None, SourceOptions(factory="no_such_package.mod:build"))
    with pytest.raises(ConfigError, match="has no function nothing"):
        open_dlrm_source(None, SourceOptions(factory="tests.byom_torch:nothing"))
    with pytest.raises(ExportError, match=r"returned tuple; expected an nn\.Module"):
        open_dlrm_source(None, SourceOptions(factory="tests.byom_torch:torchrec_feature_order"))


def test_wrong_table_sizes_surface_as_an_export_error(fb_net: nn.Module) -> None:
    """The user's module raises IndexError on ids past its tables: the error names --table-sizes."""
    exporter = TorchModuleExporter(
        FacebookAdapter(fb_net).eval(),
        "factory",
        SourceOptions(factory="x:y", table_sizes=tuple(s + 5 for s in TABLE_SIZES)),
        None,
        "",
    )
    batch = _batch(64)
    with pytest.raises(ExportError, match=r"failed on the check rows \(RuntimeError: .*--table-sizes"):
        exporter.predict(Batch(batch.dense, np.full_like(batch.categorical, 3), None))


def test_a_module_with_the_wrong_output_shape(tmp_path: Path) -> None:
    class Wide(nn.Module):
        def forward(self, dense: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
            return torch.sigmoid(dense[:, :2])

    exporter = TorchModuleExporter(Wide(), "factory", SourceOptions(factory="x:y"), None, "")
    with pytest.raises(ExportError, match=r"returned shape \(4, 2\)"):
        exporter.to_onnx(tmp_path / "w.onnx", OPSET)


def test_interaction_nodes_of_an_arbitrary_graph(tmp_path: Path) -> None:
    """Only the product of two activations and what carries it to the next layer."""

    class Tiny(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.emb = nn.Embedding(5, 3)
            self.bottom = nn.Linear(NUM_DENSE, 3)
            self.top = nn.Linear(3 + 9, 1)

        def forward(self, dense: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
            x = self.bottom(dense)
            v = torch.cat([x.unsqueeze(1), self.emb(ids[:, :2])], dim=1)
            z = torch.bmm(v, v.transpose(1, 2)).flatten(1)
            return torch.sigmoid(self.top(torch.cat([x, z], dim=1)))

    options = SourceOptions(factory="x:y", table_sizes=(5,) * NUM_CATEGORICAL)
    exporter = TorchModuleExporter(Tiny().eval(), "factory", options, None, "")
    exporter.to_onnx(tmp_path / "t.onnx", OPSET)
    model = onnx.load(str(tmp_path / "t.onnx"))
    kept = {n.name: n.op_type for n in model.graph.node if n.name in interaction_nodes(model)}
    assert sorted(kept.values()) == ["Concat", "Flatten", "MatMul"]
    assert output_sigmoids(model) == ["/model/Sigmoid"]
