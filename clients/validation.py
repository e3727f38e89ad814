"""Client-side checks of a request against the model's metadata and config.

Checked before anything is sent, so a bad request costs no round trip and
the message says exactly what is wrong: input names, dtypes, per-row shapes,
the batch size against ``max_batch_size``, that the inputs agree on it, and
that floating-point inputs hold no NaN or Inf (unless the model's config sets
``allow_non_finite_inputs``). The local backend refuses non-finite values
itself; Triton's C++ onnxruntime backend (the NGC image) would pass them to
the graph and answer NaN, so the client's check gives the same one-line error
on both.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from bundle.errors import ClientError, ConfigError
from bundle.schema import (
    HOTNESS_PARAMETER,
    LENGTHS_INPUT,
    OUTPUT,
    RAW_ROWS_INPUT,
    USER_FEATURES_PARAMETER,
    VALUES_INPUT,
    VARIABLE_HOTNESS,
    FeatureSplit,
    parse_hotness_parameter,
    raw_model_name,
)
from clients.ranking import check_request

#: The config parameter that lets a model take NaN/Inf (see backends/onnxruntime/model.py).
ALLOW_NON_FINITE = "allow_non_finite_inputs"

# Triton wire dtypes by numpy dtype, for the types a request can carry.
_TRITON_DTYPES: dict[np.dtype[Any], str] = {
    np.dtype(np.bool_): "BOOL",
    np.dtype(np.uint8): "UINT8",
    np.dtype(np.uint16): "UINT16",
    np.dtype(np.uint32): "UINT32",
    np.dtype(np.uint64): "UINT64",
    np.dtype(np.int8): "INT8",
    np.dtype(np.int16): "INT16",
    np.dtype(np.int32): "INT32",
    np.dtype(np.int64): "INT64",
    np.dtype(np.float16): "FP16",
    np.dtype(np.float32): "FP32",
    np.dtype(np.float64): "FP64",
    # Variable-length bytes (a raw-row model's rows): an object array of ``bytes``.
    np.dtype(np.object_): "BYTES",
}
_NUMPY_DTYPES = {name: dtype for dtype, name in _TRITON_DTYPES.items()}


def triton_dtype(dtype: np.dtype[Any] | type[np.generic]) -> str:
    """The Triton wire name of a numpy dtype (``float32`` -> ``FP32``)."""
    name = _TRITON_DTYPES.get(np.dtype(dtype))
    if name is None:
        raise ClientError(f"numpy dtype {np.dtype(dtype)} has no Triton equivalent here")
    return name


@dataclass(frozen=True)
class TensorMeta:
    """One input or output as the server describes it.

    Attributes:
        name: tensor name.
        datatype: Triton wire dtype, e.g. ``FP32``.
        shape: full shape from the metadata; with batching it starts with the
            batch dimension ``-1``; ``-1`` anywhere means any size.
    """

    name: str
    datatype: str
    shape: tuple[int, ...]

    @property
    def numpy_dtype(self) -> np.dtype[Any]:
        """The numpy dtype of :attr:`datatype`."""
        dtype = _NUMPY_DTYPES.get(self.datatype)
        if dtype is None:
            raise ClientError(
                f"tensor {self.name!r} has dtype {self.datatype}, which this client cannot send"
            )
        return dtype

    @property
    def row_shape(self) -> tuple[int, ...]:
        """The shape without the leading batch dimension."""
        return self.shape[1:]

    def row_bytes(self) -> int:
        """Bytes of one batch row (fixed per-row dims only)."""
        if self.datatype == "BYTES":
            raise ClientError(
                f"tensor {self.name!r} is BYTES, whose size varies by row: shared memory cannot "
                "carry it here; send it in the request (--shared-memory none)"
            )
        if any(dim < 0 for dim in self.row_shape):
            raise ClientError(f"tensor {self.name!r} has a variable per-row shape {list(self.shape)}")
        return int(np.prod(self.row_shape, dtype=np.int64)) * self.numpy_dtype.itemsize


def _tensor(entry: Mapping[str, Any]) -> TensorMeta:
    # gRPC's JSON form writes int64 fields (shape) as strings.
    return TensorMeta(
        name=str(entry["name"]),
        datatype=str(entry["datatype"]),
        shape=tuple(int(dim) for dim in entry.get("shape", [])),
    )


def _hotness(parameters: Mapping[str, Any], model: str) -> tuple[int, ...] | None:
    """The ``hotness`` parameter as counts (None when absent)."""
    text = (parameters.get(HOTNESS_PARAMETER) or {}).get("string_value")
    if not text or str(text) == VARIABLE_HOTNESS:
        return None
    return parse_hotness_parameter(str(text), model)


def _user_features(parameters: Mapping[str, Any]) -> FeatureSplit | None:
    """A ranking model's split of the features (its ``user_features`` parameter; None: not one)."""
    text = (parameters.get(USER_FEATURES_PARAMETER) or {}).get("string_value")
    return FeatureSplit.parse(str(text)) if text else None


def _variable_bags(parameters: Mapping[str, Any]) -> bool:
    """The ``hotness`` parameter says bags of any size."""
    return str((parameters.get(HOTNESS_PARAMETER) or {}).get("string_value", "")) == VARIABLE_HOTNESS


def check_bags(prefix: str, values: np.ndarray, lengths: np.ndarray) -> None:
    """Bags of any size: every length >= 0, and the lengths add up to the values.

    Raises:
        ClientError: the first negative length (its row and table), or the two counts.
    """
    negative = np.argwhere(lengths < 0)
    if negative.size:
        row, table = (int(v) for v in negative[0])
        raise ClientError(
            f"{prefix}: input {LENGTHS_INPUT!r}: row {row}, table C{table + 1} has a negative bag "
            f"length ({int(lengths[row, table])})"
        )
    total = int(lengths.sum())
    if total != values.size:
        raise ClientError(
            f"{prefix}: input {LENGTHS_INPUT!r} adds up to {total} ids, "
            f"but {VALUES_INPUT!r} holds {values.size}"
        )


def _flag(parameters: Mapping[str, Any], key: str) -> bool:
    """A config parameter read as the local backend reads it: ``true``/``1``/``yes`` (any case)."""
    raw = parameters.get(key, {}).get("string_value", "")
    return str(raw).strip().lower() in ("true", "1", "yes")


def _check_finite(prefix: str, tensor: TensorMeta, array: np.ndarray) -> None:
    if array.dtype.kind != "f":
        return
    finite = np.isfinite(array)
    if finite.all():
        return
    first = [int(i) for i in np.argwhere(~finite)[0]]
    count = int(finite.size - np.count_nonzero(finite))
    raise ClientError(
        f"{prefix}: input {tensor.name!r} holds {count} non-finite value(s) (NaN or Inf), the first "
        f"{array[tuple(first)]} at index {first}; send finite values, or set the model's config "
        f'parameter {ALLOW_NON_FINITE} to "true"'
    )


@dataclass(frozen=True)
class ModelSpec:
    """What a served model accepts and returns, from its metadata and config.

    Attributes:
        name: model name.
        version: the version the metadata describes ("" if the server did not say).
        platform: e.g. ``onnxruntime_onnx``.
        max_batch_size: largest batch accepted; 0 when the model does not batch.
        inputs: in the order the server lists them.
        outputs: in the order the server lists them.
        allow_non_finite: the config sets ``allow_non_finite_inputs: "true"``;
            NaN/Inf inputs are then sent, not refused.
    """

    name: str
    version: str
    platform: str
    max_batch_size: int
    inputs: tuple[TensorMeta, ...]
    outputs: tuple[TensorMeta, ...]
    allow_non_finite: bool = False
    #: A multi-hot model's ids per table (its config's ``hotness`` parameter); None: one id each.
    hotness: tuple[int, ...] | None = None
    #: The model takes bags of any size: values and lengths (``hotness`` is ``variable``).
    variable_bags: bool = False
    #: A ranking model's split of the features (one user and its candidates a request); None: flat.
    user_features: FeatureSplit | None = None

    @classmethod
    def from_server(cls, metadata: Mapping[str, Any], config: Mapping[str, Any]) -> ModelSpec:
        """Build from the JSON of ``get_model_metadata`` and ``get_model_config``.

        Accepts both protocols' forms: HTTP returns the config itself, gRPC
        (``as_json=True``) wraps it in ``{"config": ...}`` and writes int64 as strings.
        """
        config = config.get("config", config)
        versions = metadata.get("versions") or [""]
        try:
            return cls(
                name=str(metadata["name"]),
                version=str(versions[-1]),
                platform=str(metadata.get("platform", "")),
                max_batch_size=int(config.get("max_batch_size", 0)),
                inputs=tuple(_tensor(entry) for entry in metadata.get("inputs", [])),
                outputs=tuple(_tensor(entry) for entry in metadata.get("outputs", [])),
                allow_non_finite=_flag(config.get("parameters") or {}, ALLOW_NON_FINITE),
                hotness=_hotness(config.get("parameters") or {}, str(metadata["name"])),
                variable_bags=_variable_bags(config.get("parameters") or {}),
                user_features=_user_features(config.get("parameters") or {}),
            )
        except (KeyError, TypeError, ValueError, AttributeError, ConfigError) as exc:
            raise ClientError(
                f"unexpected model metadata from the server ({exc!r}): {dict(metadata)}"
            ) from None

    @property
    def batched(self) -> bool:
        """Whether requests carry a leading batch dimension."""
        return self.max_batch_size > 0

    def output(self, name: str = OUTPUT) -> TensorMeta:
        """The output ``name``; ClientError when the model has none of that name."""
        for tensor in self.outputs:
            if tensor.name == name:
                return tensor
        raise ClientError(
            f"model {self.name!r} has no output {name!r}; it has {[t.name for t in self.outputs]}"
        )

    def row_bytes(self) -> int:
        """Bytes of one row of every input and output together (for shared-memory sizing)."""
        return sum(t.row_bytes() for t in (*self.inputs, *self.outputs))

    def summary(self) -> dict[str, Any]:
        """A protocol-independent JSON-ready description (what ``clients metadata --model`` prints)."""

        def tensors(items: tuple[TensorMeta, ...]) -> list[dict[str, Any]]:
            return [{"name": t.name, "datatype": t.datatype, "shape": list(t.shape)} for t in items]

        return {
            "name": self.name,
            "version": self.version,
            "platform": self.platform,
            "max_batch_size": self.max_batch_size,
            "inputs": tensors(self.inputs),
            "outputs": tensors(self.outputs),
        }

    def validate(self, inputs: Mapping[str, np.ndarray]) -> tuple[list[tuple[TensorMeta, np.ndarray]], int]:
        """Check a request's inputs; return them in the model's order, C-contiguous.

        Args:
            inputs: arrays by input name; with batching each is ``B x row_shape``.

        Returns:
            ``(pairs, rows)``: (tensor, array) in the model's input order, and
            the batch size ``B`` (1 for a model that does not batch).

        Raises:
            ClientError: a missing or unexpected input, a wrong dtype or shape,
                inputs that disagree on ``B``, ``B`` of 0 or above ``max_batch_size``,
                a NaN or Inf in a floating-point input (unless :attr:`allow_non_finite`).
                Nothing has been sent when it raises.
        """
        prefix = f"model {self.name!r}"
        expected = {t.name for t in self.inputs}
        missing = [t.name for t in self.inputs if t.name not in inputs]
        if sorted(set(inputs) - expected) == [RAW_ROWS_INPUT]:
            raise ClientError(
                f"{prefix} takes {sorted(expected)}, not rows as text; its raw-row model is "
                f"{raw_model_name(self.name)!r}"
            )
        if missing == [RAW_ROWS_INPUT]:
            raise ClientError(
                f"{prefix} is a raw-row model: it takes the rows as text in {RAW_ROWS_INPUT!r} "
                f"(python -m clients infer --raw), not {sorted(inputs)}"
            )
        if missing:
            raise ClientError(f"{prefix}: input {missing[0]!r} is missing; it takes {sorted(expected)}")
        unexpected = sorted(set(inputs) - expected)
        if unexpected:
            raise ClientError(f"{prefix}: unexpected input {unexpected[0]!r}; it takes {sorted(expected)}")
        pairs: list[tuple[TensorMeta, np.ndarray]] = []
        rows: dict[str, int] = {}
        for tensor in self.inputs:
            array = np.asarray(inputs[tensor.name])
            if array.dtype != tensor.numpy_dtype:
                raise ClientError(
                    f"{prefix}: input {tensor.name!r} has dtype {array.dtype}, "
                    f"expected {tensor.datatype} ({tensor.numpy_dtype})"
                )
            shape = tuple(array.shape)
            fits = len(shape) == len(tensor.shape) and all(
                want in (-1, got) for want, got in zip(tensor.shape, shape, strict=True)
            )
            if not fits:
                raise ClientError(
                    f"{prefix}: input {tensor.name!r} has shape {list(shape)}, expected {list(tensor.shape)}"
                )
            if not self.allow_non_finite:
                _check_finite(prefix, tensor, array)
            # A model that does not batch may still take B rows: an ensemble of max_batch_size 0
            # (a hot/cold model) whose inputs all start with a variable dimension.
            # A variable-bag model's values are every id of the request, not one per row.
            if (self.batched or tensor.shape[:1] == (-1,)) and not (
                self.variable_bags and tensor.name == VALUES_INPUT
            ):
                rows[tensor.name] = shape[0]
            pairs.append((tensor, np.ascontiguousarray(array)))
        if self.variable_bags:
            check_bags(prefix, np.asarray(inputs[VALUES_INPUT]), np.asarray(inputs[LENGTHS_INPUT]))
        if self.user_features is not None:
            check_request(prefix, inputs)
        counted = len(self.inputs) - (1 if self.variable_bags else 0)
        if not rows or (not self.batched and len(rows) < counted):
            return pairs, 1
        sizes = set(rows.values())
        if len(sizes) > 1:
            raise ClientError(f"{prefix}: inputs disagree on the batch size: {rows}")
        batch = sizes.pop()
        if batch < 1:
            raise ClientError(f"{prefix}: empty batch (0 rows)")
        if self.batched and batch > self.max_batch_size:
            raise ClientError(
                f"{prefix}: batch of {batch} rows exceeds its max_batch_size {self.max_batch_size}"
            )
        return pairs, batch
