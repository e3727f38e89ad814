"""The tensor contract of every served model: the one place that names the tensors.

Every stage (export, repository configs, clients, load tests) imports these
constants; no other module spells a tensor name as a literal of its own. The
Criteo TSV columns that feed these tensors are :mod:`criteo.schema`'s.

A model takes two inputs and gives one output, each with a leading batch
dimension ``B``:

- ``dense_features``   ``B x 13`` float32: log1p of the integer counts.
- ``categorical_ids``  ``B x 26`` int64: raw ids; any int64 value is valid
  because the model reduces each id into its table (modulo) itself. A multi-hot
  model (a bag of ``h_t`` ids per table, DLRM-DCNv2 as MLPerf runs it) takes
  ``B x H``, ``H = h_1 + .. + h_26``: C1's ids first, then C2's, and so on
  (:func:`inputs_for`; the config's ``hotness`` parameter records the ``h_t``).
- ``click_probability`` ``B x 1`` float32: sigmoid of the model's logit.

A model with variable-length bags (a bag of any size per table and row, empty
bags included; the config's ``hotness`` parameter is ``variable``) takes, in
place of ``categorical_ids`` (:data:`BAG_INPUTS`):

- ``categorical_values``  ``N`` int64: every id of the request, row after row and,
  within a row, C1's bag, then C2's, and so on;
- ``categorical_lengths`` ``B x 26`` int64: the size of each bag (0: empty, which
  adds nothing), so ``N`` is their sum.

Such a model has ``max_batch_size: 0``: Triton's ragged batching concatenates a
ragged input across requests but still requires every input of a request to
share its batch size, so it fits only requests of one row each; a request of
``B`` rows with bags of their own sizes is one values tensor and one lengths
tensor, run as it comes.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from bundle.errors import ConfigError

NUM_DENSE = 13
NUM_CATEGORICAL = 26

# Keras rejects an Input named "dense", hence the longer names.
DENSE_INPUT = "dense_features"
CATEGORICAL_INPUT = "categorical_ids"
OUTPUT = "click_probability"


@dataclass(frozen=True)
class TensorSpec:
    """One model input or output: its name, dtype and per-row shape (no batch)."""

    name: str
    dtype: type[np.generic]
    shape: tuple[int, ...]

    @property
    def triton_dtype(self) -> str:
        """The Triton wire dtype name, e.g. ``FP32``."""
        return _TRITON_DTYPES[np.dtype(self.dtype)]


_TRITON_DTYPES = {
    np.dtype(np.float32): "FP32",
    np.dtype(np.float16): "FP16",
    np.dtype(np.int64): "INT64",
    np.dtype(np.int32): "INT32",
}

INPUTS: tuple[TensorSpec, ...] = (
    TensorSpec(DENSE_INPUT, np.float32, (NUM_DENSE,)),
    TensorSpec(CATEGORICAL_INPUT, np.int64, (NUM_CATEGORICAL,)),
)
OUTPUTS: tuple[TensorSpec, ...] = (TensorSpec(OUTPUT, np.float32, (1,)),)
#: The config parameter that records a multi-hot model's hotness (26 comma-separated counts).
HOTNESS_PARAMETER = "hotness"
#: Metadata key of a multi-hot ONNX graph (``metadata_props``; ONNX Runtime's
#: ``custom_metadata_map``): ids per bag of C1..C26, 26 comma-separated counts. Its
#: ``categorical_ids`` are then ``B x H`` (``H`` their sum, C1's bag first). Absent: one id per table.
HOTNESS_METADATA = "hotness"


#: The ``hotness`` parameter of a model with variable-length bags.
VARIABLE_HOTNESS = "variable"
#: Inputs of a model with variable-length bags: the ids of every bag, and each bag's size.
VALUES_INPUT = "categorical_values"
LENGTHS_INPUT = "categorical_lengths"
#: Its tensors, each with its full shape (``-1``: any size; no batch dimension of Triton's).
BAG_INPUTS: tuple[TensorSpec, ...] = (
    TensorSpec(DENSE_INPUT, np.float32, (-1, NUM_DENSE)),
    TensorSpec(VALUES_INPUT, np.int64, (-1,)),
    TensorSpec(LENGTHS_INPUT, np.int64, (-1, NUM_CATEGORICAL)),
)
BAG_OUTPUTS: tuple[TensorSpec, ...] = (TensorSpec(OUTPUT, np.float32, (-1, 1)),)


def hotness_counts(text: str) -> tuple[int, ...] | None:
    """``text`` as 26 comma-separated counts >= 1 (ids per bag of C1..C26); None when it is not."""
    try:
        counts = tuple(int(part) for part in text.split(","))
    except ValueError:
        return None
    return counts if len(counts) == NUM_CATEGORICAL and min(counts) >= 1 else None


def parse_hotness_parameter(text: str, model: str) -> tuple[int, ...]:
    """The counts of model ``model``'s ``hotness`` config parameter (26 comma-separated counts).

    Raises:
        ConfigError: not 26 counts >= 1.
    """
    counts = hotness_counts(text)
    if counts is None:
        raise ConfigError(f"model {model!r}: parameter {HOTNESS_PARAMETER} is {text!r}, not 26 counts >= 1")
    return counts


def inputs_for(hotness: tuple[int, ...] | None) -> tuple[TensorSpec, ...]:
    """The inputs of a model with ``hotness`` ids per table (None: one id per table, :data:`INPUTS`)."""
    if hotness is None:
        return INPUTS
    return (INPUTS[0], TensorSpec(CATEGORICAL_INPUT, np.int64, (sum(hotness),)))


# Raw rows: a served model's raw-row model takes the Criteo rows as a client has them.
#: ``B x 1`` BYTES: one unlabeled Criteo TSV row per element (13 counts, 26 hex ids, tab-separated).
RAW_ROWS_INPUT = "raw_rows"
#: A raw-row model's name is its served model's with this suffix (``dlrm_onnx_int8_raw``).
RAW_MODEL_SUFFIX = "_raw"


def raw_model_name(model: str) -> str:
    """The raw-row model of served model ``model``."""
    return f"{model}{RAW_MODEL_SUFFIX}"


def is_raw_model(model: str) -> bool:
    """Whether ``model`` is a raw-row model (rows in as text), by the repository's names."""
    return model.endswith(RAW_MODEL_SUFFIX)


# Hot/cold: the tensors between the embedding stage and the dense model.
#: ``B x 26`` int64: 0 where the lookup is cold, else 1 + the row's index in its table's hot rows.
HOT_SLOTS = "hot_slots"
#: ``N`` int64: ``b * 26 + t`` of each cold lookup, ascending.
COLD_POSITIONS = "cold_positions"
#: ``N x W`` float32: the row-store row of each cold lookup, in the order of ``cold_positions``.
COLD_ROWS = "cold_rows"
