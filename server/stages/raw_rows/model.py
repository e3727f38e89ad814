"""The raw-row stage: Criteo rows as the client has them in, the model's tensors out.

A raw-row model (``<model>_raw``) is an ensemble of two steps: this stage
(``criteo_rows``), then the served model it names (``dlrm_onnx_int8_raw`` feeds
``dlrm_onnx_int8``). The stage takes

- ``raw_rows`` ``B x 1`` BYTES: one unlabeled Criteo TSV row per element, its
  13 counts and 26 hex ids separated by tabs (a line end after it is allowed),

and answers ``dense_features`` (``B x 13`` float32) and ``categorical_ids``
(``B x 26`` int64) by the rules of ``criteo_rows`` (the bundle's
``criteo/rows.py``, copied beside this file by the export: the file reader,
the clients and this stage parse with that one module). Parsing is vectorised
over every row of every request of a dynamic batch at once.

A row that breaks a rule fails its own request with INVALID_ARGUMENT, naming
the row (0-based, within the request) and the field, e.g. ``row 3: C7:
categorical id 'zz' is not 1 to 16 hex digits``; the other requests of the
batch are answered.

This file runs inside tritonserver's python stub, in the local server and in
the NGC image, and imports only numpy, the standard library,
``triton_python_backend_utils`` and ``criteo_rows``.
"""

from __future__ import annotations

import json
from typing import Any

import numpy as np
import triton_python_backend_utils as pb_utils
from criteo_rows import NUM_CATEGORICAL, NUM_DENSE, RowError, model_inputs, parse_rows

#: The stage's tensors (the export writes the same names from ``bundle.schema``).
EXPECTED_OUTPUTS = (("TYPE_FP32", NUM_DENSE), ("TYPE_INT64", NUM_CATEGORICAL))


class RequestError(ValueError):
    """One request that cannot be answered (its response says why)."""


def _rows_of(request: Any, name: str) -> list[bytes]:
    """The request's rows, one per element of its ``B x 1`` BYTES input.

    Raises:
        RequestError: the input is missing, or is not ``B x 1`` with ``B >= 1``.
    """
    tensor = pb_utils.get_input_tensor_by_name(request, name)
    if tensor is None:
        raise RequestError(f"input '{name}' is missing")
    array = tensor.as_numpy()
    if array.ndim != 2 or array.shape[1] != 1 or array.shape[0] < 1:
        raise RequestError(
            f"input '{name}' must be B x 1 (one row per element, B >= 1), got {list(array.shape)}"
        )
    if array.dtype != np.object_:
        raise RequestError(f"input '{name}' must be BYTES, got {array.dtype}")
    return list(array.ravel())


def _joined(rows: list[bytes]) -> bytes:
    """The rows one per line; a row sent with its own line end loses it first."""
    data = b"\n".join(rows)
    if data.count(b"\n") != len(rows) - 1:
        data = b"\n".join(row[:-2] if row.endswith(b"\r\n") else row.rstrip(b"\n") for row in rows)
    return data


class TritonPythonModel:
    """Parses each request's rows into the model's tensors (see the module)."""

    def initialize(self, args: dict[str, str]) -> None:
        """Check the config against what the stage answers.

        Raises:
            TritonModelException: the config has other tensors; fails this model's load.
        """
        config = json.loads(args["model_config"])
        self._name = args["model_name"]
        inputs, outputs = config.get("input", []), config.get("output", [])
        problems = []
        if len(inputs) != 1 or inputs[0].get("data_type") != "TYPE_STRING":
            problems.append("one TYPE_STRING input expected")
        if len(outputs) != len(EXPECTED_OUTPUTS):
            problems.append(f"{len(EXPECTED_OUTPUTS)} outputs expected, got {len(outputs)}")
        for entry, (data_type, width) in zip(outputs, EXPECTED_OUTPUTS, strict=False):
            dims = [int(d) for d in entry.get("dims", [])]
            if entry.get("data_type") != data_type or dims != [width]:
                got = f"{entry.get('data_type')} {dims}"
                problems.append(f"output '{entry.get('name')}' must be {data_type} [{width}], got {got}")
        if problems:
            raise pb_utils.TritonModelException(
                f"model '{self._name}': config.pbtxt does not match the stage: " + "; ".join(problems)
            )
        self._input = str(inputs[0]["name"])
        self._outputs = [str(entry["name"]) for entry in outputs]

    def _response(self, dense: np.ndarray, ids: np.ndarray) -> Any:
        tensors = [pb_utils.Tensor(self._outputs[0], dense), pb_utils.Tensor(self._outputs[1], ids)]
        return pb_utils.InferenceResponse(output_tensors=tensors)

    def _error(self, message: str) -> Any:
        pb_utils.Logger.log_warn(f"model '{self._name}': {message}")
        return pb_utils.InferenceResponse(
            output_tensors=[], error=pb_utils.TritonError(message, pb_utils.TritonError.INVALID_ARG)
        )

    def execute(self, requests: list[Any]) -> list[Any]:
        """All requests' rows parsed at once; where a row breaks a rule, each request on its own,
        so that only the requests holding bad rows fail."""
        rows: list[list[bytes] | None] = []
        responses: list[Any] = [None] * len(requests)
        for index, request in enumerate(requests):
            try:
                rows.append(_rows_of(request, self._input))
            except RequestError as exc:
                rows.append(None)
                responses[index] = self._error(str(exc))
        good = [index for index, found in enumerate(rows) if found is not None]
        everything = [row for index in good for row in rows[index] or ()]
        try:
            parsed = (
                parse_rows(_joined(everything), labeled=False, rows=len(everything)) if everything else None
            )
        except RowError:
            parsed = None
        if parsed is not None:
            dense, ids = model_inputs(parsed)
            start = 0
            for index in good:
                stop = start + len(rows[index] or ())
                responses[index] = self._response(dense[start:stop], ids[start:stop])
                start = stop
            return responses
        for index in good:
            mine = rows[index] or []
            try:
                dense, ids = model_inputs(parse_rows(_joined(mine), labeled=False, rows=len(mine)))
            except RowError as exc:
                responses[index] = self._error(str(exc))
                continue
            responses[index] = self._response(dense, ids)
        return responses
