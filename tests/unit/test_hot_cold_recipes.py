"""Names, configs and recipes of hot/cold FP16 and INT8 variants (export.tables.hot_cold_variants)."""

from __future__ import annotations

import pytest

from bundle.errors import ConfigError
from export.graphs.quantize import QuantizeOptions
from export.tables.ensemble import (
    build_ensemble_config,
    dense_model_name,
    ensemble_model_name,
    variant_models,
)
from export.tables.hot_cold_variants import VariantRecipe
from export.tables.placement import variant_entries


def test_variant_names_follow_the_in_graph_variants() -> None:
    assert variant_models("dlrm", "fp16") == ("dlrm_onnx_fp16", "dlrm_dense_fp16")
    assert variant_models("wide_deep", "int8") == ("wide_deep_onnx_int8", "wide_deep_dense_int8")
    assert ensemble_model_name("dlrm", "") == "dlrm_onnx" and dense_model_name("dlrm") == "dlrm_dense"
    assert set(variant_entries("dlrm")) == {
        "dlrm_onnx_fp16",
        "dlrm_dense_fp16",
        "dlrm_onnx_int8",
        "dlrm_dense_int8",
    }
    with pytest.raises(ConfigError, match="precision"):
        ensemble_model_name("dlrm", "bf16")


def test_a_variant_ensemble_runs_the_shared_stage_and_its_own_dense_model() -> None:
    config = build_ensemble_config("dlrm", 3, "int8")
    assert config.name == "dlrm_onnx_int8" and config.platform == "ensemble"
    steps = [(step.model_name, step.model_version) for step in config.ensemble_scheduling.step]
    assert steps == [("dlrm_embedding", 3), ("dlrm_dense_int8", 3)]
    # Same tensors as the FP32 ensemble: clients send the schema's.
    fp32 = build_ensemble_config("dlrm", 3)
    assert list(config.input) == list(fp32.input) and list(config.output) == list(fp32.output)


def test_a_recipe_survives_its_report() -> None:
    fp16 = VariantRecipe("fp16", ("/interaction/MatMul", "Sigmoid_1"), 1e-3)
    int8 = VariantRecipe("int8", (), 2e-3, QuantizeOptions(method="dynamic", per_channel=False))
    for recipe in (fp16, int8):
        assert VariantRecipe.from_report({"recipe": recipe.to_report()}, "report") == recipe


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"precision": "bf16", "keep_fp32": (), "auc_tolerance": 1e-3}, "one of"),
        ({"precision": "int8", "keep_fp32": (), "auc_tolerance": 1e-3}, "quantize options"),
        ({"precision": "fp16", "keep_fp32": (), "auc_tolerance": -1.0}, ">= 0"),
    ],
)
def test_a_recipe_refuses_what_cannot_be_made(fields: dict[str, object], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        VariantRecipe(**fields)  # type: ignore[arg-type]


def test_a_report_without_a_usable_recipe_is_one_clear_error() -> None:
    with pytest.raises(ConfigError, match="keeps no recipe"):
        VariantRecipe.from_report({}, "dlrm_onnx_fp16/export_report.json")
    with pytest.raises(ConfigError, match="damaged"):
        VariantRecipe.from_report({"recipe": {"precision": "fp16"}}, "dlrm_onnx_fp16/export_report.json")
    with pytest.raises(ConfigError, match="unknown INT8 method"):
        bad = {"precision": "int8", "keep_fp32": [], "auc_tolerance": 1e-3, "quantize": {"method": "x"}}
        VariantRecipe.from_report({"recipe": bad}, "r")
