"""How to read a model this bundle did not train: the options every importer shares.

Importers (:mod:`export.importers.dlrm_sources` for PyTorch, :mod:`export.importers.keras_sources` for
TensorFlow/Keras) detect what a user brought and wrap it in the one
:class:`export.framework.FrameworkExporter` interface; these options fill in what
a file cannot say about itself: its tables' sizes, the order of its features,
the names of its inputs, whether it ends in logits.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

from bundle.errors import ConfigError
from bundle.schema import CATEGORICAL_INPUT, DENSE_INPUT
from criteo.multihot import check_hotness, is_single_hot
from criteo.schema import CATEGORICAL_COLUMNS, DENSE_COLUMNS
from criteo.tables import check_table_sizes

#: The served tensors an ``--input-map`` entry may name, and how many features each holds.
MAPPED_TENSORS: dict[str, int] = {
    DENSE_INPUT: len(DENSE_COLUMNS),
    CATEGORICAL_INPUT: len(CATEGORICAL_COLUMNS),
}
#: Default per-feature input names: I1..I13 and C1..C26.
DEFAULT_FEATURE_NAMES: dict[str, tuple[str, ...]] = {
    DENSE_INPUT: DENSE_COLUMNS,
    CATEGORICAL_INPUT: CATEGORICAL_COLUMNS,
}

_RANGE = re.compile(r"^(?P<prefix>.*?)(?P<first>\d+)\.\.(?P=prefix)?(?P<last>\d+)$")


@dataclass(frozen=True)
class SourceOptions:
    """What the export needs to know of a user's model that its file may not say.

    Args:
        table_sizes: rows of the tables behind C1..C26 (None: read from the model).
        feature_order: for a TorchRec state dict, its 26 table names in C1..C26
            order (None: the state dict's own order).
        input_map: served tensor -> the user's input name(s) that hold it: one
            name (a ``B x 13`` / ``B x 26`` tensor) or one name per feature
            (13 / 26); tensors not listed use their own name, or I1..I13 / C1..C26.
        factory: ``package.module:function`` returning the user's ``nn.Module``
            with weights loaded (PyTorch only).
        logits: the model returns logits; the export appends the sigmoid.
        hotness: ids per table of a multi-hot model, C1..C26 (None: one id per table); a
            TorchRec or facebookresearch state dict's tables then sum bags of that many ids.
        variable_bags: a TorchRec or facebookresearch state dict's tables sum bags of any
            size, empty ones included: the model takes values and lengths
            (:data:`bundle.schema.BAG_INPUTS`) in place of ``categorical_ids``.
    """

    table_sizes: tuple[int, ...] | None = None
    feature_order: tuple[str, ...] | None = None
    input_map: tuple[tuple[str, tuple[str, ...]], ...] = ()
    factory: str | None = None
    logits: bool = False
    hotness: tuple[int, ...] | None = None
    variable_bags: bool = False

    def __post_init__(self) -> None:
        if self.variable_bags and self.hotness is not None:
            raise ConfigError("bags of any size have no fixed hotness: give one of the two")
        if self.hotness is not None:
            counts = check_hotness(self.hotness)
            object.__setattr__(self, "hotness", None if is_single_hot(counts) else counts)
        if self.table_sizes is not None:
            check_table_sizes(self.table_sizes, "--table-sizes")
        if self.feature_order is not None:
            if len(self.feature_order) != len(CATEGORICAL_COLUMNS):
                raise ConfigError(
                    f"--feature-order needs {len(CATEGORICAL_COLUMNS)} table names (C1..C26), "
                    f"got {len(self.feature_order)}"
                )
            if len(set(self.feature_order)) != len(self.feature_order):
                raise ConfigError("--feature-order names a table twice")
        seen: set[str] = set()
        for tensor, names in self.input_map:
            if tensor not in MAPPED_TENSORS:
                raise ConfigError(
                    f"--input-map: {tensor!r} is not a served tensor; map {' or '.join(MAPPED_TENSORS)}"
                )
            if tensor in seen:
                raise ConfigError(f"--input-map maps {tensor} twice")
            seen.add(tensor)
            if len(names) not in (1, MAPPED_TENSORS[tensor]):
                raise ConfigError(
                    f"--input-map {tensor}= needs 1 name or {MAPPED_TENSORS[tensor]} names, got {len(names)}"
                )
        if self.factory is not None and not re.fullmatch(r"[\w.]+:\w+", self.factory):
            raise ConfigError(f"--factory must be package.module:function, got {self.factory!r}")

    def mapped(self, tensor: str) -> tuple[str, ...] | None:
        """The user's input names for served ``tensor``, if ``--input-map`` gave them."""
        return dict(self.input_map).get(tensor)


def expand_names(text: str) -> tuple[str, ...]:
    """Input names from ``a,b,c`` or a range ``int_0..int_12`` (also ``int_0..12``), inclusive."""
    names: list[str] = []
    for part in (p.strip() for p in text.split(",")):
        if not part:
            raise ConfigError(f"empty input name in {text!r}")
        match = _RANGE.match(part)
        if match is None:
            names.append(part)
            continue
        first, last = int(match["first"]), int(match["last"])
        if last < first:
            raise ConfigError(f"input name range {part!r} runs backwards")
        names.extend(f"{match['prefix']}{i}" for i in range(first, last + 1))
    return tuple(names)


def parse_input_map(entries: Sequence[str]) -> tuple[tuple[str, tuple[str, ...]], ...]:
    """Parse ``--input-map`` entries, each ``TENSOR=NAMES`` (see :func:`expand_names`).

    Example: ``["dense_features=int_0..int_12", "categorical_ids=cat_0..cat_25"]``.

    Raises:
        ConfigError: an entry without ``=``.
    """
    parsed: list[tuple[str, tuple[str, ...]]] = []
    for entry in entries:
        tensor, sep, names = entry.partition("=")
        if not sep:
            raise ConfigError(
                f"--input-map takes TENSOR=NAMES (e.g. {DENSE_INPUT}=int_0..int_12), got {entry!r}"
            )
        parsed.append((tensor.strip(), expand_names(names)))
    return tuple(parsed)


def parse_feature_order(text: str | None) -> tuple[str, ...] | None:
    """Parse ``--feature-order``: 26 comma-separated table names, or a range like ``t_cat_0..t_cat_25``."""
    return None if text is None else expand_names(text)
