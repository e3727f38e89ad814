"""Architecture and training configs, their presets, and their JSON form.

Configs are frozen dataclasses that validate themselves, so a wrong option
fails at the line that set it. Each trained model is saved with its config as
``config.json`` beside the weights; the exporters rebuild the model from it.

Each of the 26 tables has its own size (``table_sizes``), as in real Criteo
models; ``--table-size N`` means "all 26 = N". The ``criteo-kaggle`` and
``criteo-terabyte`` presets carry the published per-table sizes (see
:mod:`criteo.tables`) for benchmarks and the large-table work: at 2.2 GB and
96 GB of FP32 DLRM tables they are not meant to train on this machine.

The ``dcnv2-*`` and ``mlperf-dcnv2`` presets are DLRM-DCNv2 (TorchRec's ``DLRM_DCN``,
MLPerf's ``dlrm-v2``): a low-rank cross net over ``[x, e_1..e_26]`` in place of the
dot interaction. ``mlperf-dcnv2`` is MLPerf's model: ``D`` 128, bottom 512-256-128,
3 cross layers of rank 512, top 1024-1024-512-256-1, its 26 table sizes (104.5 GB of
FP32 tables).
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any, Literal

from bundle.errors import ConfigError
from bundle.schema import NUM_CATEGORICAL
from criteo.tables import (
    CRITEO_KAGGLE,
    CRITEO_TERABYTE,
    MLPERF_DCNV2,
    check_table_sizes,
    uniform_table_sizes,
)

#: Presets of both families.
PRESETS: tuple[str, ...] = ("tiny", "small", "reference", "criteo-kaggle", "criteo-terabyte")
#: DLRM-DCNv2 presets (the DLRM family only).
DCN_PRESETS: tuple[str, ...] = ("dcnv2-tiny", "dcnv2-small", "mlperf-dcnv2")
#: The DLRM's interactions: the 2019 model's dot products, or DLRM-DCNv2's low-rank cross net.
Interaction = Literal["dot", "dcn"]
CONFIG_FILE = "config.json"


def _resized(
    config: DLRMConfig | WideDeepConfig, table_size: int | None, table_sizes: tuple[int, ...] | None
) -> Any:
    if table_size is not None and table_sizes is not None:
        raise ConfigError("give --table-size (all 26 tables) or --table-sizes, not both")
    if table_sizes is not None:
        return replace(config, table_sizes=check_table_sizes(table_sizes))
    if table_size is not None:
        return replace(config, table_sizes=uniform_table_sizes(table_size))
    return config


def _check_sizes(sizes: tuple[int, ...]) -> None:
    check_table_sizes(sizes)
    small = [size for size in sizes if size < 2]
    if small:
        raise ConfigError(f"every table needs at least 2 rows, got sizes {sorted(set(small))}")


def _check_layers(name: str, layers: tuple[int, ...]) -> None:
    if not layers or any(width <= 0 for width in layers):
        raise ConfigError(f"{name} must be a non-empty list of positive widths, got {layers}")


@dataclass(frozen=True)
class DLRMConfig:
    """DLRM: bottom MLP over counts, one embedding per categorical feature, an
    interaction of the 27 vectors, top MLP to one logit.

    Args:
        table_sizes: rows of the 26 embedding tables (C1..C26); each id is reduced
            modulo its table's size.
        embedding_dim: ``D``, the width of every embedding and of the bottom MLP's output.
        bottom_mlp: widths of the bottom MLP; the last equals ``embedding_dim``.
        top_mlp: widths of the top MLP; the last is 1 (the logit).
        interaction: ``dot`` (pairwise dot products, the 2019 DLRM) or ``dcn`` (DLRM-DCNv2:
            ``cross_layers`` low-rank cross layers over ``x0 = [x, e_1..e_26]``).
        cross_layers: ``dcn``: layers of the cross net (0 for ``dot``).
        cross_rank: ``dcn``: their low-rank dimension (0 for ``dot``).
        hotness: ids per table of a multi-hot model (C1..C26), each table summing its bag of
            that many ids (MLPerf's DCNv2: :data:`criteo.multihot.MLPERF_HOTNESS`); None: one id
            per table. The ids are then ``B x H``, C1's bag first.
    """

    table_sizes: tuple[int, ...]
    embedding_dim: int
    bottom_mlp: tuple[int, ...]
    top_mlp: tuple[int, ...]
    interaction: Interaction = "dot"
    cross_layers: int = 0
    cross_rank: int = 0
    hotness: tuple[int, ...] | None = None
    kind: Literal["dlrm"] = field(default="dlrm", init=False)

    def __post_init__(self) -> None:
        _check_sizes(self.table_sizes)
        if self.hotness is not None:
            from criteo.multihot import check_hotness, is_single_hot

            counts = check_hotness(self.hotness)
            object.__setattr__(self, "hotness", None if is_single_hot(counts) else counts)
        _check_layers("bottom_mlp", self.bottom_mlp)
        _check_layers("top_mlp", self.top_mlp)
        if self.bottom_mlp[-1] != self.embedding_dim:
            raise ConfigError(
                f"bottom_mlp must end at embedding_dim={self.embedding_dim}, got {self.bottom_mlp}"
            )
        if self.top_mlp[-1] != 1:
            raise ConfigError(f"top_mlp must end with 1 (the logit), got {self.top_mlp}")
        if self.interaction == "dcn":
            if self.cross_layers < 1 or self.cross_rank < 1:
                raise ConfigError(
                    f"a dcn interaction needs cross_layers and cross_rank >= 1, got {self.cross_layers} "
                    f"and {self.cross_rank}"
                )
        elif self.interaction == "dot":
            if self.cross_layers or self.cross_rank:
                raise ConfigError("cross_layers and cross_rank belong to the dcn interaction, not dot")
        else:
            raise ConfigError(f"interaction must be dot or dcn, got {self.interaction!r}")

    @property
    def num_interactions(self) -> int:
        """Width of the interaction output: pairwise dots of 27 vectors plus the dense vector
        (``dot``), or the cross net's ``27 D`` (``dcn``)."""
        vectors = NUM_CATEGORICAL + 1
        if self.interaction == "dcn":
            return vectors * self.embedding_dim
        return vectors * (vectors - 1) // 2 + self.embedding_dim

    @property
    def embedding_rows(self) -> int:
        """Rows of all 26 tables together."""
        return sum(self.table_sizes)

    @staticmethod
    def preset(
        name: str, table_size: int | None = None, table_sizes: tuple[int, ...] | None = None
    ) -> DLRMConfig:
        """The named preset, with every table resized to ``table_size`` or to ``table_sizes`` if given.

        ``criteo-kaggle`` is facebookresearch/dlrm's Kaggle configuration (``D`` 16,
        bottom 13-512-256-64-16, top 512-256-1, 2.2 GB of FP32 tables);
        ``criteo-terabyte`` its MLPerf Terabyte one (``D`` 128, ids capped at 40M
        rows per table, 96 GB of FP32 tables). ``dcnv2-tiny``, ``dcnv2-small`` and
        ``mlperf-dcnv2`` are DLRM-DCNv2 (see the module).
        """
        mlperf_top = (1024, 1024, 512, 256, 1)
        presets = {
            "tiny": DLRMConfig(uniform_table_sizes(1_000), 8, (16, 8), (32, 16, 1)),
            "small": DLRMConfig(uniform_table_sizes(20_000), 32, (128, 64, 32), (256, 128, 1)),
            "reference": DLRMConfig(
                uniform_table_sizes(100_000), 128, (512, 256, 128), (1024, 1024, 512, 256, 1)
            ),
            "criteo-kaggle": DLRMConfig(CRITEO_KAGGLE, 16, (512, 256, 64, 16), (512, 256, 1)),
            "criteo-terabyte": DLRMConfig(CRITEO_TERABYTE, 128, (512, 256, 128), mlperf_top),
            "dcnv2-tiny": DLRMConfig(uniform_table_sizes(1_000), 8, (16, 8), (32, 16, 1), "dcn", 2, 8),
            "dcnv2-small": DLRMConfig(
                uniform_table_sizes(20_000), 32, (128, 64, 32), (256, 128, 1), "dcn", 3, 64
            ),
            "mlperf-dcnv2": DLRMConfig(MLPERF_DCNV2, 128, (512, 256, 128), mlperf_top, "dcn", 3, 512),
        }
        if name not in presets:
            raise ConfigError(f"unknown preset {name!r}; choose one of {', '.join(PRESETS + DCN_PRESETS)}")
        config: DLRMConfig = _resized(presets[name], table_size, table_sizes)
        return config


@dataclass(frozen=True)
class WideDeepConfig:
    """Wide & Deep: a linear (wide) part over categorical ids and counts plus a
    deep part (embeddings and counts through an MLP); their logits add.

    Args:
        table_sizes: rows of the 26 tables (C1..C26, wide and deep alike); each id
            is reduced modulo its table's size.
        embedding_dim: width of the deep part's embeddings.
        deep_mlp: widths of the deep MLP's hidden layers (a final Dense(1) follows).
    """

    table_sizes: tuple[int, ...]
    embedding_dim: int
    deep_mlp: tuple[int, ...]
    kind: Literal["wide_deep"] = field(default="wide_deep", init=False)

    def __post_init__(self) -> None:
        _check_sizes(self.table_sizes)
        if self.embedding_dim <= 0:
            raise ConfigError(f"embedding_dim must be positive, got {self.embedding_dim}")
        _check_layers("deep_mlp", self.deep_mlp)

    @property
    def embedding_rows(self) -> int:
        """Rows of all 26 tables together."""
        return sum(self.table_sizes)

    @staticmethod
    def preset(
        name: str, table_size: int | None = None, table_sizes: tuple[int, ...] | None = None
    ) -> WideDeepConfig:
        """The named preset, with every table resized to ``table_size`` or to ``table_sizes`` if given.

        ``criteo-kaggle`` and ``criteo-terabyte`` are the reference layers with the
        published per-table sizes.
        """
        presets = {
            "tiny": WideDeepConfig(uniform_table_sizes(1_000), 8, (32, 16)),
            "small": WideDeepConfig(uniform_table_sizes(20_000), 32, (256, 256, 256)),
            "reference": WideDeepConfig(uniform_table_sizes(100_000), 64, (1024,) * 5),
            "criteo-kaggle": WideDeepConfig(CRITEO_KAGGLE, 64, (1024,) * 5),
            "criteo-terabyte": WideDeepConfig(CRITEO_TERABYTE, 64, (1024,) * 5),
        }
        if name in DCN_PRESETS:
            raise ConfigError(f"preset {name!r} is a DLRM-DCNv2; Wide & Deep takes {', '.join(PRESETS)}")
        if name not in presets:
            raise ConfigError(f"unknown preset {name!r}; choose one of {', '.join(PRESETS)}")
        config: WideDeepConfig = _resized(presets[name], table_size, table_sizes)
        return config


@dataclass(frozen=True)
class TrainConfig:
    """Options of a training run.

    Args:
        epochs: passes over the training rows.
        batch_size: rows per step.
        learning_rate: of the dense parameters' optimizer.
        valid_fraction: share of the file's last rows held out for validation
            (ignored when a separate validation file is given).
        seed: seed of initialisation and shuffling.
        max_rows: read at most this many rows of the file (None: all).
    """

    epochs: int = 1
    batch_size: int = 1024
    learning_rate: float = 1e-3
    valid_fraction: float = 0.1
    seed: int = 0
    max_rows: int | None = None

    def __post_init__(self) -> None:
        if self.epochs <= 0:
            raise ConfigError(f"epochs must be positive, got {self.epochs}")
        if self.batch_size <= 0:
            raise ConfigError(f"batch_size must be positive, got {self.batch_size}")
        if self.learning_rate <= 0:
            raise ConfigError(f"learning_rate must be positive, got {self.learning_rate}")
        if not 0.0 < self.valid_fraction < 1.0:
            raise ConfigError(f"valid_fraction must be in (0, 1), got {self.valid_fraction}")
        if self.max_rows is not None and self.max_rows <= 0:
            raise ConfigError(f"max_rows must be positive, got {self.max_rows}")


ModelConfig = DLRMConfig | WideDeepConfig


def save_config(config: ModelConfig, directory: Path, extra: dict[str, Any] | None = None) -> Path:
    """Write ``config`` (and ``extra`` metadata such as validation metrics) as ``config.json``."""
    directory.mkdir(parents=True, exist_ok=True)
    payload = {"model": asdict(config), **(extra or {})}
    path = directory / CONFIG_FILE
    path.write_text(json.dumps(payload, indent=2) + "\n")
    return path


def load_config(directory: Path) -> ModelConfig:
    """Read the ``config.json`` that training wrote beside a checkpoint or SavedModel."""
    path = directory / CONFIG_FILE
    if not path.is_file():
        raise ConfigError(f"{path} not found: is {directory} a directory written by `models train`?")
    try:
        data = dict(json.loads(path.read_text())["model"])
        kind = data.pop("kind")
        # Outputs of earlier versions hold one "table_size" for all 26 tables.
        sizes = (
            tuple(int(size) for size in data["table_sizes"])
            if "table_sizes" in data
            else uniform_table_sizes(int(data["table_size"]))
        )
        if kind == "dlrm":
            # Outputs of earlier versions have no interaction: the dot products.
            return DLRMConfig(
                table_sizes=sizes,
                embedding_dim=int(data["embedding_dim"]),
                bottom_mlp=tuple(data["bottom_mlp"]),
                top_mlp=tuple(data["top_mlp"]),
                interaction=data.get("interaction", "dot"),
                cross_layers=int(data.get("cross_layers", 0)),
                cross_rank=int(data.get("cross_rank", 0)),
                hotness=tuple(int(h) for h in data["hotness"]) if data.get("hotness") else None,
            )
        if kind == "wide_deep":
            return WideDeepConfig(
                table_sizes=sizes,
                embedding_dim=int(data["embedding_dim"]),
                deep_mlp=tuple(data["deep_mlp"]),
            )
    except (KeyError, TypeError, ValueError, json.JSONDecodeError) as exc:
        raise ConfigError(f"{path}: malformed model config ({exc})") from None
    raise ConfigError(f"{path}: unknown model kind {kind!r}")
