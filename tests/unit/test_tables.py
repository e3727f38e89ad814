"""Per-table sizes: presets, parsing, configs with 26 sizes, and the synthetic generator's vocabularies."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from bundle.errors import ConfigError
from bundle.schema import NUM_CATEGORICAL
from criteo.synth import HiddenModel, SynthConfig, write_tsv
from criteo.tables import (
    CRITEO_KAGGLE,
    CRITEO_TERABYTE,
    parse_table_sizes,
    table_offsets,
    uniform_table_sizes,
)
from criteo.tsv import read_batch
from export.importers.sources import SourceOptions, expand_names, parse_input_map
from models.config import CONFIG_FILE, DLRMConfig, WideDeepConfig, load_config, save_config


def test_published_sizes() -> None:
    # facebookresearch/dlrm's Kaggle counts and its 40M-capped Terabyte sizes.
    assert len(CRITEO_KAGGLE) == len(CRITEO_TERABYTE) == NUM_CATEGORICAL
    assert sum(CRITEO_KAGGLE) == 33_762_577 and (min(CRITEO_KAGGLE), max(CRITEO_KAGGLE)) == (3, 10_131_227)
    assert sum(CRITEO_TERABYTE) == 187_767_399 and max(CRITEO_TERABYTE) <= 40_000_000


def test_parse_table_sizes() -> None:
    assert parse_table_sizes("criteo-kaggle") == CRITEO_KAGGLE
    assert parse_table_sizes("Criteo-Terabyte") == CRITEO_TERABYTE
    assert parse_table_sizes("1000") == uniform_table_sizes(1000) == (1000,) * NUM_CATEGORICAL
    sizes = tuple(range(10, 36))
    assert parse_table_sizes(",".join(map(str, sizes))) == sizes
    with pytest.raises(ConfigError, match="needs 26 sizes"):
        parse_table_sizes("1,2,3")
    with pytest.raises(ConfigError, match="comma-separated"):
        parse_table_sizes("kaggle-ish")
    with pytest.raises(ConfigError, match="at least 1 row"):
        parse_table_sizes(",".join(["0"] + ["5"] * 25))
    assert table_offsets((3, 5, 2)) == (0, 3, 8)


def test_presets_and_resizing() -> None:
    kaggle = DLRMConfig.preset("criteo-kaggle")
    assert kaggle.table_sizes == CRITEO_KAGGLE
    assert (kaggle.embedding_dim, kaggle.bottom_mlp, kaggle.top_mlp) == (
        16,
        (512, 256, 64, 16),
        (512, 256, 1),
    )
    # 2.2 GB of FP32 tables, as the Kaggle configuration says.
    assert 2.1e9 < kaggle.embedding_rows * kaggle.embedding_dim * 4 < 2.2e9
    assert DLRMConfig.preset("criteo-terabyte").embedding_rows == sum(CRITEO_TERABYTE)
    assert WideDeepConfig.preset("criteo-kaggle").table_sizes == CRITEO_KAGGLE
    assert DLRMConfig.preset("tiny", table_size=77).table_sizes == (77,) * NUM_CATEGORICAL
    sizes = tuple(2 + t for t in range(NUM_CATEGORICAL))
    assert WideDeepConfig.preset("tiny", table_sizes=sizes).table_sizes == sizes
    with pytest.raises(ConfigError, match="not both"):
        DLRMConfig.preset("tiny", table_size=5, table_sizes=sizes)
    with pytest.raises(ConfigError, match="at least 2 rows"):
        DLRMConfig.preset("tiny", table_size=1)


def test_config_json_round_trip_and_earlier_single_table_size(tmp_path: Path) -> None:
    config = DLRMConfig.preset("tiny", table_sizes=tuple(5 + t for t in range(NUM_CATEGORICAL)))
    save_config(config, tmp_path)
    assert load_config(tmp_path) == config
    # A config.json written before per-table sizes: one table_size for all 26.
    old = {"model": {"kind": "wide_deep", "table_size": 300, "embedding_dim": 8, "deep_mlp": [16]}}
    (tmp_path / CONFIG_FILE).write_text(json.dumps(old))
    assert load_config(tmp_path) == WideDeepConfig((300,) * NUM_CATEGORICAL, 8, (16,))


def test_synthetic_vocabulary_per_table(tmp_path: Path) -> None:
    config = SynthConfig(rows=3000, seed=3, vocabulary=CRITEO_KAGGLE, max_vocabulary=500)
    assert config.vocabulary_sizes == tuple(min(size, 500) for size in CRITEO_KAGGLE)
    path = tmp_path / "kaggle.tsv"
    write_tsv(config, path)
    batch = read_batch(path, 3000)
    distinct = [len(np.unique(batch.categorical[:, t])) for t in range(NUM_CATEGORICAL)]
    # a missing id reads as 0, one more distinct value
    assert all(d <= v + 1 for d, v in zip(distinct, config.vocabulary_sizes, strict=True))
    assert distinct[8] <= 4 and distinct[2] > 100  # C9 has 3 ids, C3 ten million (capped at 500)
    assert HiddenModel(2026, 1.05, 500, config.vocabulary_sizes).vocabulary.tolist() == list(
        config.vocabulary_sizes or ()
    )
    with pytest.raises(ConfigError, match="needs 26 sizes"):
        SynthConfig(rows=10, vocabulary=(5, 6))


def test_source_options_input_map_and_feature_order() -> None:
    assert expand_names("int_0..int_12") == tuple(f"int_{i}" for i in range(13))
    assert expand_names("C1..3,x") == ("C1", "C2", "C3", "x")
    parsed = parse_input_map(["dense_features=int_0..int_12", "categorical_ids=sparse"])
    options = SourceOptions(input_map=parsed)
    assert options.mapped("categorical_ids") == ("sparse",)
    assert options.mapped("dense_features") is not None and len(options.mapped("dense_features") or ()) == 13
    with pytest.raises(ConfigError, match="TENSOR=NAMES"):
        parse_input_map(["dense_features"])
    with pytest.raises(ConfigError, match="not a served tensor"):
        SourceOptions(input_map=parse_input_map(["labels=y"]))
    with pytest.raises(ConfigError, match="needs 1 name or 26"):
        SourceOptions(input_map=parse_input_map(["categorical_ids=c0..c4"]))
    with pytest.raises(ConfigError, match="26 table names"):
        SourceOptions(feature_order=("a", "b"))
    with pytest.raises(ConfigError, match=r"package\.module:function"):
        SourceOptions(factory="not a factory")
