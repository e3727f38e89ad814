"""The bundle's own DLRM-DCNv2: its config, its cross net (TorchRec's names and math) and its presets."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from bundle.errors import ConfigError
from bundle.schema import NUM_CATEGORICAL, NUM_DENSE
from criteo.tables import MLPERF_DCNV2, TABLE_SIZE_PRESETS
from export.importers.dlrm_layouts import read_layout
from models.config import DLRMConfig, WideDeepConfig, load_config, save_config
from models.dlrm import DLRM


def test_mlperf_preset_is_mlperfs_model() -> None:
    config = DLRMConfig.preset("mlperf-dcnv2")
    assert config.table_sizes == MLPERF_DCNV2 == TABLE_SIZE_PRESETS["mlperf-dcnv2"]
    assert sum(config.table_sizes) == 204_184_588
    assert (config.embedding_dim, config.bottom_mlp, config.top_mlp) == (
        128,
        (512, 256, 128),
        (1024, 1024, 512, 256, 1),
    )
    assert (config.interaction, config.cross_layers, config.cross_rank) == ("dcn", 3, 512)
    assert config.num_interactions == 3456


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"interaction": "dcn"}, "cross_layers and cross_rank >= 1"),
        ({"cross_layers": 2, "cross_rank": 4}, "belong to the dcn interaction"),
        ({"interaction": "cross"}, "must be dot or dcn"),
    ],
)
def test_bad_interactions_are_refused(changes: dict, message: str) -> None:
    base = {"table_sizes": (10,) * NUM_CATEGORICAL, "embedding_dim": 4, "bottom_mlp": (4,), "top_mlp": (1,)}
    with pytest.raises(ConfigError, match=message):
        DLRMConfig(**{**base, **changes})


def test_wide_deep_refuses_a_dcn_preset() -> None:
    with pytest.raises(ConfigError, match="is a DLRM-DCNv2"):
        WideDeepConfig.preset("dcnv2-tiny")


def test_config_round_trips_and_old_configs_read_as_dot(tmp_path: Path) -> None:
    config = DLRMConfig.preset("dcnv2-tiny", table_size=50)
    save_config(config, tmp_path)
    assert load_config(tmp_path) == config
    payload = json.loads((tmp_path / "config.json").read_text())
    for key in ("interaction", "cross_layers", "cross_rank"):
        del payload["model"][key]
    (tmp_path / "config.json").write_text(json.dumps(payload))
    old = load_config(tmp_path)
    assert isinstance(old, DLRMConfig) and old.interaction == "dot" and old.cross_layers == 0


def test_cross_net_is_torchrecs_low_rank_cross_net() -> None:
    config = DLRMConfig.preset("dcnv2-tiny", table_size=30)
    model = DLRM(config).eval()
    state = model.state_dict()
    width = (NUM_CATEGORICAL + 1) * config.embedding_dim
    for layer in range(config.cross_layers):
        assert state[f"interaction.W_kernels.{layer}"].shape == (width, config.cross_rank)
        assert state[f"interaction.V_kernels.{layer}"].shape == (config.cross_rank, width)
        assert state[f"interaction.bias.{layer}"].shape == (width,)
    with torch.no_grad():
        for parameter in model.parameters():
            parameter.normal_(0.0, 0.2)
    dense = torch.rand(5, NUM_DENSE)
    ids = torch.randint(0, 30, (5, NUM_CATEGORICAL))
    # x_{l+1} = x_0 * (W_l (V_l x_l) + b_l) + x_l, written out with plain matrix products.
    with torch.no_grad():
        x = model.bottom_mlp(dense)
        x0 = torch.cat([x, model.embed(ids).flatten(1)], dim=1)
        xl = x0
        for layer in range(config.cross_layers):
            w, v = state[f"interaction.W_kernels.{layer}"], state[f"interaction.V_kernels.{layer}"]
            xl = x0 * ((xl @ v.T) @ w.T + state[f"interaction.bias.{layer}"]) + xl
        expected = torch.sigmoid(model.top_mlp(xl))
        torch.testing.assert_close(model(dense, ids), expected, atol=1e-6, rtol=0)


def test_a_torchrec_dcn_state_dict_layout_is_read_from_own_keys() -> None:
    """The importer reads TorchRec's key names; the bundle's own names are the cross net's part of them."""
    config = DLRMConfig.preset("dcnv2-tiny", table_size=30)
    own = DLRM(config).state_dict()
    state = {
        **{
            f"inter_arch.crossnet.{k[len('interaction.') :]}": v
            for k, v in own.items()
            if k.startswith("interaction.")
        },
        **{
            f"sparse_arch.embedding_bag_collection.embedding_bags.t_cat_{t}.weight": torch.zeros(30, 8)
            for t in range(NUM_CATEGORICAL)
        },
        "dense_arch.model._mlp.0._linear.weight": own["bottom_mlp.0.weight"],
        "dense_arch.model._mlp.0._linear.bias": own["bottom_mlp.0.bias"],
        "dense_arch.model._mlp.1._linear.weight": own["bottom_mlp.2.weight"],
        "dense_arch.model._mlp.1._linear.bias": own["bottom_mlp.2.bias"],
        "over_arch.model.0._mlp.0._linear.weight": own["top_mlp.0.weight"],
        "over_arch.model.0._mlp.0._linear.bias": own["top_mlp.0.bias"],
        "over_arch.model.0._mlp.1._linear.weight": own["top_mlp.2.weight"],
        "over_arch.model.0._mlp.1._linear.bias": own["top_mlp.2.bias"],
        "over_arch.model.1.weight": own["top_mlp.4.weight"],
        "over_arch.model.1.bias": own["top_mlp.4.bias"],
    }
    layout, _ = read_layout(state, "own.pt")
    assert (layout.interaction, layout.cross_layers, layout.cross_rank) == ("dcn", 2, 8)
    assert layout.interaction_width == config.num_interactions


def test_mlperfs_auc_target_is_a_one_sided_share_of_fp32s_auc(tmp_path: Path) -> None:
    from export.options import ExportOptions

    target = ExportOptions(repository=tmp_path, auc_target=99.9)
    # FP32 AUC 0.80: the floor is 0.7992; a variant above FP32 always passes.
    assert target.auc_gate(0.7993, -0.0007, 1e-3)[0]
    assert not target.auc_gate(0.7990, -0.0010, 1e-3)[0]
    assert target.auc_gate(0.85, 0.05, 1e-3)[0]
    assert target.auc_gate(0.7993, -0.0007, 1e-3)[1] == "target 99.9% of FP32's AUC 0.8000: 0.7992"
    tolerance = ExportOptions(repository=tmp_path)
    assert not tolerance.auc_gate(0.85, 0.05, 1e-3)[0]  # the tolerance is two-sided
    assert not tolerance.auc_gate(None, None, 1e-3)[0]
    with pytest.raises(ConfigError, match="percent of FP32's AUC"):
        ExportOptions(repository=tmp_path, auc_target=100.0)


def test_mlperfs_dcn_from_torchrec_reads_as_mlperfs_layers(tmp_path: Path) -> None:
    from criteo.multihot import MLPERF_HOTNESS
    from export.importers.dlrm_sources import CheckpointExporter, open_dlrm_source
    from export.importers.sources import SourceOptions
    from models.torchrec_dcn import write_mlperf_dcn

    sizes = write_mlperf_dcn(tmp_path / "dcn.pt", max_rows=40)
    assert sizes == tuple(min(rows, 40) for rows in MLPERF_DCNV2)
    exporter = open_dlrm_source(tmp_path / "dcn.pt", SourceOptions(hotness=MLPERF_HOTNESS))
    assert isinstance(exporter, CheckpointExporter)
    layout = exporter.layout
    assert (layout.dim, layout.bottom, layout.top) == (128, (512, 256, 128), (1024, 1024, 512, 256, 1))
    assert (layout.interaction, layout.cross_layers, layout.cross_rank) == ("dcn", 3, 512)
    assert exporter.table_sizes == sizes and exporter.source["hotness"] == list(MLPERF_HOTNESS)
    with pytest.raises(ConfigError, match="max-rows"):
        write_mlperf_dcn(tmp_path / "x.pt", max_rows=1)
