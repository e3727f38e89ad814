"""What the export pipeline needs from a framework-specific exporter.

Each framework (PyTorch DLRM, Keras Wide & Deep) implements this protocol in
its own module, so that TensorFlow and PyTorch never load into one process
and the FP16 conversion, parity checks and repository writing stay shared.
"""

from __future__ import annotations

from pathlib import Path
from typing import Protocol

import numpy as np
import onnx

from criteo.tsv import Batch
from models.config import ModelConfig


class FrameworkExporter(Protocol):
    """A trained model loaded from disk, ready to convert."""

    @property
    def family(self) -> str:
        """Repository name prefix: ``dlrm`` or ``wide_deep``."""
        ...

    @property
    def config(self) -> ModelConfig:
        """The architecture config saved beside the weights."""
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
        """The framework's own probabilities for ``batch``: ``B x 1`` float32."""
        ...

    def fp32_nodes(self, model: onnx.ModelProto) -> list[str]:
        """Names of the nodes of the FP32 graph that stay FP32 in the FP16 variant
        (DLRM's interaction, the final sigmoid)."""
        ...
