"""The in-process reference: an ONNX file run by ONNX Runtime in this process.

What served predictions are compared with. ONNX Runtime only: clients never
import TensorFlow or PyTorch.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np

from bundle.errors import ClientError
from bundle.onnx_session import inference_session
from bundle.schema import HOTNESS_METADATA, OUTPUT, VALUES_INPUT, hotness_counts
from clients.batching import bag_file_batches, file_batches
from criteo.tsv import Batch


class OnnxReference:
    """One ONNX Runtime session on CPU, kept for every batch.

    The graph says which rows it takes, and :meth:`batches` reads a file for it that way:
    one id per table (a Criteo TSV file), or bags (the multi-hot text format) of the sizes
    its ``hotness`` metadata records, or of any size when it takes values and lengths.

    Args:
        model_file: an exported ``model.onnx`` (external data beside it is found).

    Attributes:
        hotness: ids per bag of C1..C26 of a multi-hot graph (None: one id per table, or bags
            of any size).
        variable_bags: the graph takes bags of any size (values and lengths).

    Raises:
        ClientError: the file is missing, ONNX Runtime cannot load it, or its hotness record
            is not 26 counts.
    """

    def __init__(self, model_file: Path | str) -> None:
        self.path = Path(model_file)
        self._session: Any = inference_session(self.path, error=ClientError)
        self.variable_bags = VALUES_INPUT in {value.name for value in self._session.get_inputs()}
        record = self._session.get_modelmeta().custom_metadata_map.get(HOTNESS_METADATA)
        self.hotness = None if record is None else hotness_counts(record)
        if record is not None and self.hotness is None:
            raise ClientError(f"{self.path}: its {HOTNESS_METADATA} record {record!r} is not 26 counts >= 1")

    def batches(self, path: Path | str, batch_size: int, max_rows: int | None = None) -> Iterator[Batch]:
        """The rows of ``path`` as this graph takes them, ``batch_size`` at a time.

        Raises:
            DataError: the file is missing, a row is malformed, or a bag is not of the graph's size.
        """
        if self.variable_bags or self.hotness is not None:
            return bag_file_batches(path, batch_size, max_rows, self.hotness)
        return file_batches(path, batch_size, max_rows)

    def predict(self, batch: Batch) -> np.ndarray:
        """Probabilities of ``batch``: ``B x 1`` float32."""
        try:
            return np.asarray(self._session.run([OUTPUT], batch.inputs())[0])
        except Exception as exc:  # ONNX Runtime's own exceptions derive from Exception directly
            raise ClientError(f"onnxruntime failed on {self.path}: {exc}") from exc
