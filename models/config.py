"""Architecture and training configs, their presets, and their JSON form.

Configs are frozen dataclasses that validate themselves, so a wrong option
fails at the line that set it. Each trained model is saved with its config as
``config.json`` beside the weights; the exporters rebuild the model from it.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any, Literal

from bundle.errors import ConfigError
from criteo.schema import NUM_CATEGORICAL

Preset = Literal["tiny", "small", "reference"]
PRESETS: tuple[str, ...] = ("tiny", "small", "reference")
CONFIG_FILE = "config.json"


def _check_layers(name: str, layers: tuple[int, ...]) -> None:
    if not layers or any(width <= 0 for width in layers):
        raise ConfigError(f"{name} must be a non-empty list of positive widths, got {layers}")


@dataclass(frozen=True)
class DLRMConfig:
    """DLRM: bottom MLP over counts, one embedding per categorical feature, dot
    interaction over the 27 vectors, top MLP to one logit.

    Args:
        table_size: rows of each of the 26 embedding tables; ids are reduced modulo it.
        embedding_dim: ``D``, the width of every embedding and of the bottom MLP's output.
        bottom_mlp: widths of the bottom MLP; the last equals ``embedding_dim``.
        top_mlp: widths of the top MLP; the last is 1 (the logit).
    """

    table_size: int
    embedding_dim: int
    bottom_mlp: tuple[int, ...]
    top_mlp: tuple[int, ...]
    kind: Literal["dlrm"] = field(default="dlrm", init=False)

    def __post_init__(self) -> None:
        if self.table_size < 2:
            raise ConfigError(f"table_size must be >= 2, got {self.table_size}")
        _check_layers("bottom_mlp", self.bottom_mlp)
        _check_layers("top_mlp", self.top_mlp)
        if self.bottom_mlp[-1] != self.embedding_dim:
            raise ConfigError(
                f"bottom_mlp must end at embedding_dim={self.embedding_dim}, got {self.bottom_mlp}"
            )
        if self.top_mlp[-1] != 1:
            raise ConfigError(f"top_mlp must end with 1 (the logit), got {self.top_mlp}")

    @property
    def num_interactions(self) -> int:
        """Width of the interaction output: pairwise dots of 27 vectors plus the dense vector."""
        vectors = NUM_CATEGORICAL + 1
        return vectors * (vectors - 1) // 2 + self.embedding_dim

    @staticmethod
    def preset(name: str, table_size: int | None = None) -> DLRMConfig:
        """The named preset, with every table resized to ``table_size`` if given."""
        presets = {
            "tiny": DLRMConfig(1_000, 8, (16, 8), (32, 16, 1)),
            "small": DLRMConfig(20_000, 32, (128, 64, 32), (256, 128, 1)),
            "reference": DLRMConfig(100_000, 128, (512, 256, 128), (1024, 1024, 512, 256, 1)),
        }
        if name not in presets:
            raise ConfigError(f"unknown preset {name!r}; choose one of {', '.join(PRESETS)}")
        config = presets[name]
        return config if table_size is None else replace(config, table_size=table_size)


@dataclass(frozen=True)
class WideDeepConfig:
    """Wide & Deep: a linear (wide) part over categorical ids and counts plus a
    deep part (embeddings and counts through an MLP); their logits add.

    Args:
        table_size: rows of each of the 26 tables (wide and deep); ids are reduced modulo it.
        embedding_dim: width of the deep part's embeddings.
        deep_mlp: widths of the deep MLP's hidden layers (a final Dense(1) follows).
    """

    table_size: int
    embedding_dim: int
    deep_mlp: tuple[int, ...]
    kind: Literal["wide_deep"] = field(default="wide_deep", init=False)

    def __post_init__(self) -> None:
        if self.table_size < 2:
            raise ConfigError(f"table_size must be >= 2, got {self.table_size}")
        if self.embedding_dim <= 0:
            raise ConfigError(f"embedding_dim must be positive, got {self.embedding_dim}")
        _check_layers("deep_mlp", self.deep_mlp)

    @staticmethod
    def preset(name: str, table_size: int | None = None) -> WideDeepConfig:
        """The named preset, with every table resized to ``table_size`` if given."""
        presets = {
            "tiny": WideDeepConfig(1_000, 8, (32, 16)),
            "small": WideDeepConfig(20_000, 32, (256, 256, 256)),
            "reference": WideDeepConfig(100_000, 64, (1024,) * 5),
        }
        if name not in presets:
            raise ConfigError(f"unknown preset {name!r}; choose one of {', '.join(PRESETS)}")
        config = presets[name]
        return config if table_size is None else replace(config, table_size=table_size)


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
        if kind == "dlrm":
            return DLRMConfig(
                table_size=int(data["table_size"]),
                embedding_dim=int(data["embedding_dim"]),
                bottom_mlp=tuple(data["bottom_mlp"]),
                top_mlp=tuple(data["top_mlp"]),
            )
        if kind == "wide_deep":
            return WideDeepConfig(
                table_size=int(data["table_size"]),
                embedding_dim=int(data["embedding_dim"]),
                deep_mlp=tuple(data["deep_mlp"]),
            )
    except (KeyError, TypeError, ValueError, json.JSONDecodeError) as exc:
        raise ConfigError(f"{path}: malformed model config ({exc})") from None
    raise ConfigError(f"{path}: unknown model kind {kind!r}")
