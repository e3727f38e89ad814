"""Wide & Deep (Keras 3, TensorFlow backend) over the Criteo schema.

The model takes the two inputs of :mod:`bundle.schema` and gives the click
probability. Every categorical id is first reduced into its table with a
non-negative modulo (``floormod``), so any int64 id (negative, ``2**62``) is a
valid input. The 26 tables of each part are fused into one table with per-table
row offsets: the exported graph holds one ``Mod``, one ``Add`` and two
``Gather`` ops (wide and deep) instead of 26 lookups per part.

The math lives in one function, :func:`wide_deep_logit`, over a mapping of named
parameters. The Keras layer :class:`WideDeepLogit` owns the parameters and calls
it; the ONNX exporter calls it too, with the parameters as graph inputs (see
:mod:`export.importers.onnx_wide_deep` for why), so training, serving and export share a
single definition of the model.

``build_wide_deep`` returns the served model (probability output named
:data:`bundle.schema.OUTPUT`); :func:`logit_model` returns a model that shares its
weights and outputs the logit, for training with a numerically stable loss.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping, Sequence
from types import ModuleType
from typing import Any

# Set before TensorFlow loads: its Python-side logging stays quiet, and Keras runs on it.
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
os.environ.setdefault("KERAS_BACKEND", "tensorflow")

import numpy as np

from bundle.errors import ConfigError
from bundle.native import quiet_native_stderr
from bundle.schema import CATEGORICAL_INPUT, DENSE_INPUT, NUM_CATEGORICAL, NUM_DENSE, OUTPUT
from criteo.tables import table_offsets, uniform_table_sizes
from models.config import WideDeepConfig

# TensorFlow's native libraries print start-up lines as they load (bundle.native).
with quiet_native_stderr():
    import keras
    import tensorflow as tf

# TensorFlow's Python-side warnings (retracing, deprecations) are noise for users here.
tf.get_logger().setLevel(logging.ERROR)

#: Name of the layer that computes the logit (the sigmoid's input).
LOGIT_LAYER = "logit"


def quiet_tensorflow() -> ModuleType:
    """The ``tensorflow`` module, imported quietly: its Python-side log level at warnings
    (``TF_CPP_MIN_LOG_LEVEL=2``) unless the caller chose one, and its native start-up lines
    held back (:mod:`bundle.native`)."""
    return tf


def check_backend() -> None:
    """Raise ConfigError unless Keras runs on TensorFlow (the SavedModel export needs it)."""
    if keras.backend.backend() != "tensorflow":
        raise ConfigError(
            f"Wide & Deep needs the TensorFlow Keras backend, got {keras.backend.backend()!r}; "
            "unset KERAS_BACKEND or set it to 'tensorflow'"
        )


def parameter_shapes(config: WideDeepConfig) -> dict[str, tuple[int, ...]]:
    """Names and shapes of the model's parameters, in a fixed order.

    - ``wide_table`` ``(sum(table_sizes),)``: one weight per (table, id).
    - ``wide_counts`` ``(13, 1)``: linear weights of the counts.
    - ``deep_table`` ``(sum(table_sizes), embedding_dim)``: the fused embeddings.
    - ``deep_kernel_<i>``, ``deep_bias_<i>``: the ReLU layers of ``deep_mlp``.
    - ``deep_logit_kernel`` ``(deep_mlp[-1], 1)``, ``deep_logit_bias`` ``(1,)``.

    There is one bias in all: a second one on the wide part would always get the
    same gradient as the deep part's, a redundant parameter.
    """
    rows = config.embedding_rows
    shapes: dict[str, tuple[int, ...]] = {
        "wide_table": (rows,),
        "wide_counts": (NUM_DENSE, 1),
        "deep_table": (rows, config.embedding_dim),
    }
    width = NUM_CATEGORICAL * config.embedding_dim + NUM_DENSE
    for i, out in enumerate(config.deep_mlp):
        shapes[f"deep_kernel_{i}"] = (width, out)
        shapes[f"deep_bias_{i}"] = (out,)
        width = out
    shapes["deep_logit_kernel"] = (width, 1)
    shapes["deep_logit_bias"] = (1,)
    return shapes


def table_rows(ids: tf.Tensor, table_sizes: Sequence[int]) -> tf.Tensor:
    """Rows of the fused tables for raw ids.

    ``rows[b, t] = floormod(ids[b, t], T_t) + T_0 + ... + T_{t-1}``, so an id of
    any int64 value lands in table ``t``'s slice.

    Args:
        ids: ``B x 26`` int64 raw ids.
        table_sizes: rows of each of the 26 tables.

    Returns:
        ``B x 26`` int64 in ``[0, sum(table_sizes))``.
    """
    offsets = tf.constant(np.asarray(table_offsets(table_sizes), dtype=np.int64)[None, :])
    sizes = tf.constant(np.asarray(table_sizes, dtype=np.int64)[None, :])
    return tf.math.floormod(tf.cast(ids, tf.int64), sizes) + offsets


def wide_deep_logit(
    params: Mapping[str, tf.Tensor], dense: tf.Tensor, ids: tf.Tensor, config: WideDeepConfig
) -> tf.Tensor:
    """The Wide & Deep logit.

    ``logit = wide + deep`` with ``wide = sum_t w[row_t] + dense @ v`` (a linear
    model over ids and counts) and ``deep = MLP(concat(E[row_1] ... E[row_26], dense))``,
    ReLU layers of ``config.deep_mlp`` widths and a final linear layer with bias.

    Args:
        params: tensors named and shaped as :func:`parameter_shapes` says.
        dense: ``B x 13`` float32 log1p counts.
        ids: ``B x 26`` int64 raw ids.
        config: the architecture.

    Returns:
        ``B x 1`` float32 logits.
    """
    # Name scopes give the exported ONNX nodes readable names (wide/..., deep/...).
    with tf.name_scope("table_rows"):
        rows = table_rows(ids, config.table_sizes)
    # tf.gather directly: keras.ops.take adds a negative-index fix-up (Less, Add,
    # Where) that the modulo makes unnecessary.
    with tf.name_scope("wide"):
        wide_ids = tf.reduce_sum(tf.gather(params["wide_table"], rows), axis=1, keepdims=True)
        wide = tf.add(wide_ids, tf.matmul(dense, params["wide_counts"]), name="sum")
    with tf.name_scope("deep"):
        embeddings = tf.gather(params["deep_table"], rows)
        hidden = tf.concat(
            [tf.reshape(embeddings, [-1, NUM_CATEGORICAL * config.embedding_dim]), dense], axis=1
        )
        for i in range(len(config.deep_mlp)):
            with tf.name_scope(f"dense_{i}"):
                hidden = tf.nn.relu(tf.matmul(hidden, params[f"deep_kernel_{i}"]) + params[f"deep_bias_{i}"])
        with tf.name_scope("logit"):
            deep = tf.matmul(hidden, params["deep_logit_kernel"]) + params["deep_logit_bias"]
    return tf.add(wide, deep, name="logit")


def _initializer(name: str) -> keras.initializers.Initializer:
    if name == "wide_table" or "bias" in name:
        return keras.initializers.Zeros()
    if name == "deep_table":
        return keras.initializers.RandomUniform(-0.05, 0.05)
    return keras.initializers.GlorotUniform()


@keras.saving.register_keras_serializable(package="wide_deep")
class WideDeepLogit(keras.layers.Layer):
    """Owns the Wide & Deep parameters and computes :func:`wide_deep_logit`.

    Args:
        config: the architecture.

    Called on ``[dense, ids]`` (``B x 13`` float32 and ``B x 26`` int64), it returns the
    ``B x 1`` float32 logits.
    """

    def __init__(self, config: WideDeepConfig, **kwargs: object) -> None:
        super().__init__(**kwargs)
        self.config = config
        self.params: dict[str, keras.Variable] = {}

    def build(self, input_shape: object) -> None:
        for name, shape in parameter_shapes(self.config).items():
            self.params[name] = self.add_weight(
                shape=shape, initializer=_initializer(name), name=name, dtype="float32"
            )

    def call(self, inputs: list[tf.Tensor]) -> tf.Tensor:
        dense, ids = inputs
        return wide_deep_logit({name: v.value for name, v in self.params.items()}, dense, ids, self.config)

    def compute_output_shape(self, input_shape: list[tuple[int | None, ...]]) -> tuple[int | None, ...]:
        return (input_shape[0][0], 1)

    def get_config(self) -> dict[str, object]:
        return {
            **super().get_config(),
            "table_sizes": list(self.config.table_sizes),
            "embedding_dim": self.config.embedding_dim,
            "deep_mlp": list(self.config.deep_mlp),
        }

    @classmethod
    def from_config(cls, config: dict[str, Any]) -> WideDeepLogit:
        config = dict(config)
        # .keras files of earlier versions hold one "table_size" for all 26 tables.
        sizes = (
            tuple(int(size) for size in config.pop("table_sizes"))
            if "table_sizes" in config
            else uniform_table_sizes(int(config.pop("table_size")))
        )
        model = WideDeepConfig(
            table_sizes=sizes,
            embedding_dim=int(config.pop("embedding_dim")),
            deep_mlp=tuple(config.pop("deep_mlp")),
        )
        return cls(model, **config)


def build_wide_deep(config: WideDeepConfig) -> keras.Model:
    """Build the served Wide & Deep model (see :func:`wide_deep_logit` for the math).

    Args:
        config: architecture (table size, embedding width, deep MLP widths).

    Returns:
        A functional model with inputs ``dense_features`` (``B x 13`` float32) and
        ``categorical_ids`` (``B x 26`` int64) and output ``click_probability``
        (``B x 1`` float32, the sigmoid of the logit; the layer is named the same).
    """
    check_backend()
    dense = keras.Input(shape=(NUM_DENSE,), dtype="float32", name=DENSE_INPUT)
    ids = keras.Input(shape=(NUM_CATEGORICAL,), dtype="int64", name=CATEGORICAL_INPUT)
    logit = WideDeepLogit(config, name=LOGIT_LAYER)([dense, ids])
    probability = keras.layers.Activation("sigmoid", name=OUTPUT, dtype="float32")(logit)
    return keras.Model(
        inputs={DENSE_INPUT: dense, CATEGORICAL_INPUT: ids}, outputs=probability, name="wide_deep"
    )


def logit_model(model: keras.Model) -> keras.Model:
    """A model sharing every weight of ``model`` (from :func:`build_wide_deep`) that
    outputs the logit (``B x 1`` float32) instead of the probability."""
    return keras.Model(
        inputs=model.input, outputs=model.get_layer(LOGIT_LAYER).output, name="wide_deep_logit"
    )


def serving_signature() -> list[tf.TensorSpec]:
    """The named input specs of the serving signature (dynamic batch)."""
    return [
        tf.TensorSpec((None, NUM_DENSE), tf.float32, name=DENSE_INPUT),
        tf.TensorSpec((None, NUM_CATEGORICAL), tf.int64, name=CATEGORICAL_INPUT),
    ]


def export_saved_model(model: keras.Model, path: os.PathLike[str] | str) -> None:
    """Write the served model as a TensorFlow SavedModel.

    Its ``serving_default`` signature takes ``dense_features`` (``B x 13`` float32)
    and ``categorical_ids`` (``B x 26`` int64) and returns ``{"click_probability":
    B x 1 float32}``; its variables are named ``logit/<parameter>`` after
    :func:`parameter_shapes`.
    """

    def serve(dense: tf.Tensor, ids: tf.Tensor) -> dict[str, tf.Tensor]:
        return {OUTPUT: model({DENSE_INPUT: dense, CATEGORICAL_INPUT: ids}, training=False)}

    archive = keras.export.ExportArchive()
    archive.track(model)
    archive.add_endpoint(name="serving_default", fn=serve, input_signature=serving_signature())
    archive.write_out(str(path), verbose=False)
