"""The FastAPI peer's wire format: the model's input arrays as raw little-endian bytes.

Request: ``POST /v1/models/<model>/infer`` with the ``x-batch-size: B`` header
and body ``dense_features`` (``B x 13`` float32) followed by ``categorical_ids``
(``B x 26`` int64). Answer: ``click_probability`` (``B x 1`` float32) as raw
bytes. Binary, like Triton's own binary tensor data, so the peer is not slowed
by JSON encoding of numbers.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from bundle.errors import DataError
from bundle.schema import INPUTS, OUTPUTS

BATCH_HEADER = "x-batch-size"
CONTENT_TYPE = "application/octet-stream"
READY_PATH = "/v1/ready"


def infer_path(model: str) -> str:
    """The URL path of ``model``'s inference endpoint."""
    return f"/v1/models/{model}/infer"


def encode_inputs(inputs: Mapping[str, np.ndarray]) -> tuple[bytes, int]:
    """The request body of ``inputs`` and its batch size ``B``."""
    arrays = [
        np.ascontiguousarray(inputs[spec.name], dtype=np.dtype(spec.dtype).newbyteorder("<"))
        for spec in INPUTS
    ]
    return b"".join(array.tobytes() for array in arrays), int(arrays[0].shape[0])


def decode_inputs(body: bytes, batch: int) -> dict[str, np.ndarray]:
    """The input arrays of a request body of ``batch`` rows (views into ``body``).

    Raises:
        DataError: the body does not hold exactly ``batch`` rows of every input.
    """
    sizes = [batch * int(np.prod(spec.shape)) * np.dtype(spec.dtype).itemsize for spec in INPUTS]
    if batch < 1 or len(body) != sum(sizes):
        raise DataError(f"a body of {batch} rows must have {sum(sizes)} bytes, got {len(body)}")
    arrays = {}
    offset = 0
    for spec, size in zip(INPUTS, sizes, strict=True):
        dtype = np.dtype(spec.dtype).newbyteorder("<")
        arrays[spec.name] = np.frombuffer(
            body, dtype=dtype, count=size // dtype.itemsize, offset=offset
        ).reshape(batch, *spec.shape)
        offset += size
    return arrays


def decode_output(body: bytes, batch: int) -> np.ndarray:
    """The ``B x 1`` float32 probabilities of an answer."""
    spec = OUTPUTS[0]
    dtype = np.dtype(spec.dtype).newbyteorder("<")
    expected = batch * int(np.prod(spec.shape)) * dtype.itemsize
    if len(body) != expected:
        raise DataError(f"an answer for {batch} rows must have {expected} bytes, got {len(body)}")
    return np.frombuffer(body, dtype=dtype).reshape(batch, *spec.shape)
