"""The in-process reference: an ONNX file run by ONNX Runtime in this process.

What served predictions are compared with. ONNX Runtime only: clients never
import TensorFlow or PyTorch.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from bundle.errors import ClientError
from bundle.onnx_session import inference_session
from bundle.schema import OUTPUT
from criteo.tsv import Batch


class OnnxReference:
    """One ONNX Runtime session on CPU, kept for every batch.

    Args:
        model_file: an exported ``model.onnx`` (external data beside it is found).

    Raises:
        ClientError: the file is missing or ONNX Runtime cannot load it.
    """

    def __init__(self, model_file: Path | str) -> None:
        self.path = Path(model_file)
        self._session: Any = inference_session(self.path, error=ClientError)

    def predict(self, batch: Batch) -> np.ndarray:
        """Probabilities of ``batch``: ``B x 1`` float32."""
        try:
            return np.asarray(self._session.run([OUTPUT], batch.inputs())[0])
        except Exception as exc:  # ONNX Runtime's own exceptions derive from Exception directly
            raise ClientError(f"onnxruntime failed on {self.path}: {exc}") from exc
