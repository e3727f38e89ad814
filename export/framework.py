"""What the export pipeline needs from a framework-specific exporter.

Each source a user may bring (the bundle's own checkpoints, facebookresearch/dlrm
and TorchRec checkpoints, TorchScript, any SavedModel or ``.keras`` file)
implements this protocol in its framework's own module, so that TensorFlow and
PyTorch never load into one process and the FP16 conversion, parity checks and
repository writing stay shared. What the protocol's callers and implementers both
use lives here too: the size of the placeholder tables (:func:`small_table_sizes`)
and the example batch a PyTorch module is traced with (:func:`example_inputs`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

import numpy as np
import onnx

from bundle.errors import ConfigError
from bundle.schema import NUM_CATEGORICAL, NUM_DENSE
from criteo.tsv import Batch

if TYPE_CHECKING:
    import torch
    from torch import nn

#: Rows of each placeholder table of a graph whose real tables live only in the row store (fewer
#: where the real table is smaller): 26 x 4096 rows at ``D`` 128 are 54 MB.
SMALL_ROWS = 4096
#: Rows of the example batch traced at export (> 1 so the batch stays dynamic).
EXAMPLE_ROWS = 4


class FrameworkExporter(Protocol):
    """A trained model loaded from disk, ready to convert."""

    @property
    def family(self) -> str:
        """Repository name prefix: ``dlrm`` or ``wide_deep``."""
        ...

    @property
    def table_sizes(self) -> tuple[int, ...] | None:
        """Rows of the tables behind C1..C26, as the exported graph reduces ids into
        them (None: the model reduces ids its own way, and the export could not
        read the sizes). Known once :meth:`to_onnx` has run."""
        ...

    @property
    def source(self) -> dict[str, Any]:
        """What was exported, for ``export_report.json``: at least ``format`` (the
        detected kind of file) and ``path``; importers add the input mapping, the
        table sizes' origin and whether the export added the id reduction."""
        ...

    def to_onnx(self, out: Path, opset: int) -> None:
        """Write the FP32 ONNX graph to ``out`` (external data beside it when over 2 GB).

        The graph has inputs ``dense_features`` (``B x 13`` float32) and
        ``categorical_ids`` (``B x 26`` int64), output ``click_probability``
        (``B x 1`` float32), a dynamic batch dimension, and reduces every id
        into its table (modulo) before any lookup.
        """
        ...

    def predict(self, batch: Batch) -> np.ndarray:
        """The framework's own probabilities for ``batch``: ``B x 1`` float32.

        Raw ids of any int64 value: where the user's model does not reduce ids
        itself, they are reduced into :attr:`table_sizes` first (as the exported
        graph does), so that the user's own module runs on in-range ids."""
        ...

    def fp32_nodes(self, model: onnx.ModelProto) -> list[str]:
        """Names of the nodes of the FP32 graph that stay FP32 in the FP16 variant
        (DLRM's interaction, the final sigmoid)."""
        ...


@dataclass(frozen=True)
class TorchServing:
    """What a PyTorch exporter hands the TorchScript variant (:mod:`export.engines.torchscript`).

    Args:
        module: the exporter's own FP32 module in eval mode (never changed: the
            variant works on a copy), ``forward(dense B x 13 float32, ids B x 26
            int64)`` -> ``B x 1`` or ``B`` probabilities, or logits with ``logits``.
        logits: ``module`` returns logits; the variant appends the sigmoid, in FP32.
        fp32_modules: qualified names of submodules that keep computing in FP32 in a
            reduced-precision variant (DLRM's dot interaction); empty for a module
            whose structure is unknown.
        table_sizes: the 26 sizes the variant reduces ids into before ``module`` runs;
            None where ``module`` reduces every id into its tables itself.
        hotness: a multi-hot module's ids per table (its ids are then ``B x H``); None: one each.
    """

    module: nn.Module
    logits: bool
    fp32_modules: tuple[str, ...]
    table_sizes: tuple[int, ...] | None
    hotness: tuple[int, ...] | None = None


@runtime_checkable
class TorchSource(Protocol):
    """A PyTorch exporter that can also give its model as a module, for the ``<family>_torch`` variant."""

    def torch_serving(self) -> TorchServing:
        """The module the TorchScript variant is traced from (known once ``to_onnx`` has run)."""
        ...


@runtime_checkable
class StreamedTables(Protocol):
    """An exporter whose tables can be read a row range at a time, and whose layers export with
    placeholder tables: what a hot/cold export needs to never build the all-in-graph graph
    (``--stream-tables``, :func:`export.tables.placement.place_streamed`), for tables larger than memory.

    A DLRM has one embedding per id, so the row store's row for (table ``t``, id ``i``) is that
    table's row ``i``.
    """

    @property
    def embedding_dim(self) -> int:
        """``D``: the width of every table's rows."""
        ...

    def table_rows(self, column: int, start: int, stop: int) -> np.ndarray:
        """Rows ``start:stop`` of the table that serves column ``C<column + 1>``: ``(stop - start) x D``
        float32 (read from the checkpoint's memory-mapped pages)."""
        ...

    def placeholder_onnx(self, out: Path, opset: int, small_rows: int) -> None:
        """Write the FP32 graph of the same layers with tables of at most ``small_rows`` rows (values
        unused): the graph the hot/cold split takes its layers from."""
        ...


def own_model_source(kind: str, path: Path, table_sizes: tuple[int, ...]) -> dict[str, Any]:
    """The ``source`` record of the bundle's own training output (its graph reduces ids itself)."""
    return {
        "format": kind,
        "path": str(path),
        "table_sizes": list(table_sizes),
        "table_sizes_from": "config.json",
        "id_reduction_added": False,
    }


def small_table_sizes(table_sizes: Sequence[int], small_rows: int = SMALL_ROWS) -> tuple[int, ...]:
    """The placeholder tables: each real size capped at ``small_rows`` (and at least 2, as DLRMConfig asks).

    Raises:
        ConfigError: ``small_rows`` below 2.
    """
    if isinstance(small_rows, bool) or not isinstance(small_rows, int) or small_rows < 2:
        raise ConfigError(f"placeholder tables need at least 2 rows each, got {small_rows!r}")
    return tuple(max(2, min(int(size), small_rows)) for size in table_sizes)


def example_inputs(
    table_sizes: Sequence[int] | None = None, rows: int = EXAMPLE_ROWS
) -> tuple[torch.Tensor, torch.Tensor]:
    """A traced batch: ``rows x 13`` float32 counts and ``rows x 26`` int64 ids.

    Args:
        table_sizes: rows of the tables behind C1..C26: ids are drawn inside them
            (a module that does not reduce ids may only see valid ones); None: id 0
            everywhere (valid in any table).
        rows: the batch size (> 1, so that torch.onnx keeps the batch dynamic).

    Returns:
        ``(dense B x 13, ids B x 26)``.
    """
    import torch

    generator = torch.Generator().manual_seed(0)
    dense = torch.rand(rows, NUM_DENSE, generator=generator)
    if table_sizes is None:
        return dense, torch.zeros(rows, NUM_CATEGORICAL, dtype=torch.int64)
    raw = torch.randint(0, 2**62, (rows, NUM_CATEGORICAL), generator=generator)
    return dense, torch.remainder(raw, torch.tensor(list(table_sizes), dtype=torch.int64))
