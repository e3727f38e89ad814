"""Models a user might bring, written with plain TensorFlow/Keras (none of the bundle's model code).

- :func:`keras_wide_deep`: a Keras functional Wide & Deep with one ``Input`` per
  feature (``I1..I13`` float ``B x 1``; ``C1..C26`` int32 or int64, ``B`` or
  ``B x 1``), each id column through its own ``Embedding`` of a different size,
  plus a wide linear part; it outputs the probability and does not reduce ids
  (an id past its table fails in TensorFlow and in ONNX Runtime).
- :class:`TwoTensorModule`: a ``tf.Module`` whose signature takes ``dense``
  (``B x 13`` float32) and ``sparse`` (``B x 26`` int32), reduces ids itself with
  ``floormod`` and returns a logit of shape ``B``.
- :class:`UnmappableModule`: a signature whose inputs no default name matches.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import keras
import numpy as np
import tensorflow as tf

from bundle.schema import NUM_CATEGORICAL, NUM_DENSE
from criteo.schema import CATEGORICAL_COLUMNS, DENSE_COLUMNS

#: Rows of the Keras model's tables: 3 to 1978, a different size per column.
KERAS_TABLE_SIZES: tuple[int, ...] = tuple(3 + 79 * i for i in range(NUM_CATEGORICAL))
#: Rows of the tf.Module's tables: 2000 down to 475.
MODULE_TABLE_SIZES: tuple[int, ...] = tuple(2000 - 61 * i for i in range(NUM_CATEGORICAL))
EMBEDDING_DIM = 4


def _id_input(column: int) -> tuple[tuple[int, ...], str]:
    """Shape and dtype of C<column+1>: ``B`` or ``B x 1``, int32 or int64, mixed over the columns."""
    return ((), "int64") if column % 2 == 0 else ((1,), "int32" if column % 3 else "int64")


def keras_wide_deep(seed: int = 0) -> keras.Model:
    """A functional Wide & Deep over per-feature inputs (see the module docstring)."""
    keras.utils.set_random_seed(seed)
    dense_inputs = [keras.Input(shape=(1,), dtype="float32", name=name) for name in DENSE_COLUMNS]
    id_inputs = []
    for column, name in enumerate(CATEGORICAL_COLUMNS):
        shape, dtype = _id_input(column)
        id_inputs.append(keras.Input(shape=shape, dtype=dtype, name=name))
    counts = keras.layers.Concatenate(name="counts")(dense_inputs)
    embeddings, wide_terms = [], [keras.layers.Dense(1, use_bias=False, name="wide_counts")(counts)]
    for ids, size, name in zip(id_inputs, KERAS_TABLE_SIZES, CATEGORICAL_COLUMNS, strict=True):
        init = keras.initializers.RandomNormal(stddev=0.3)
        deep = keras.layers.Embedding(size, EMBEDDING_DIM, embeddings_initializer=init, name=f"deep_{name}")
        wide = keras.layers.Embedding(size, 1, embeddings_initializer=init, name=f"wide_{name}")
        embeddings.append(keras.layers.Reshape((EMBEDDING_DIM,))(deep(ids)))
        wide_terms.append(keras.layers.Reshape((1,))(wide(ids)))
    wide_logit = keras.layers.Add(name="wide")(wide_terms)
    hidden = keras.layers.Concatenate(name="deep_input")([*embeddings, counts])
    hidden = keras.layers.Dense(8, activation="relu", name="deep_hidden")(hidden)
    deep_logit = keras.layers.Dense(1, name="deep")(hidden)
    logit = keras.layers.Add(name="logit")([wide_logit, deep_logit])
    probability = keras.layers.Activation("sigmoid", name="probability")(logit)
    return keras.Model([*dense_inputs, *id_inputs], probability, name="user_wide_deep")


def keras_feed(model: keras.Model, dense: np.ndarray, ids: np.ndarray) -> list[np.ndarray]:
    """The Keras model's inputs for ``dense`` (``B x 13``) and in-range ``ids`` (``B x 26``)."""
    columns = [dense[:, i : i + 1].astype(np.float32) for i in range(NUM_DENSE)]
    for column in range(NUM_CATEGORICAL):
        shape, dtype = _id_input(column)
        value = ids[:, column].astype(dtype)
        columns.append(value if shape == () else value[:, None])
    return columns


def keras_probabilities(model: keras.Model, dense: np.ndarray, ids: np.ndarray) -> np.ndarray:
    """The Keras model's own output (``B x 1`` float32) on in-range ids."""
    return np.asarray(model(keras_feed(model, dense, ids), training=False), dtype=np.float32).reshape(-1, 1)


class TwoTensorModule(tf.Module):
    """Wide & Deep over two tensors ``dense`` and ``sparse`` (int32) that reduces ids itself
    (``floormod``) and returns a logit of shape ``B``."""

    def __init__(self, seed: int = 0) -> None:
        super().__init__()
        rng = np.random.default_rng(seed)
        rows = sum(MODULE_TABLE_SIZES)
        offsets = np.cumsum((0, *MODULE_TABLE_SIZES[:-1]))
        self.sizes = tf.constant(MODULE_TABLE_SIZES, tf.int32)
        self.offsets = tf.constant(offsets, tf.int32)
        self.table = tf.Variable(rng.normal(0, 0.3, (rows, EMBEDDING_DIM)).astype(np.float32))
        self.wide = tf.Variable(rng.normal(0, 0.3, (rows,)).astype(np.float32))
        width = NUM_CATEGORICAL * EMBEDDING_DIM + NUM_DENSE
        self.kernel = tf.Variable(rng.normal(0, 0.2, (width, 6)).astype(np.float32))
        self.out = tf.Variable(rng.normal(0, 0.3, (6, 1)).astype(np.float32))

    @tf.function(
        input_signature=[
            tf.TensorSpec([None, NUM_DENSE], tf.float32, name="dense"),
            tf.TensorSpec([None, NUM_CATEGORICAL], tf.int32, name="sparse"),
        ]
    )
    def serve(self, dense: tf.Tensor, sparse: tf.Tensor) -> dict[str, tf.Tensor]:
        rows = tf.math.floormod(sparse, self.sizes) + self.offsets
        wide = tf.reduce_sum(tf.gather(self.wide, rows), axis=1)
        embeddings = tf.reshape(tf.gather(self.table, rows), [-1, NUM_CATEGORICAL * EMBEDDING_DIM])
        hidden = tf.nn.relu(tf.matmul(tf.concat([embeddings, dense], axis=1), self.kernel))
        return {"logit": wide + tf.squeeze(tf.matmul(hidden, self.out), axis=1)}


def save_module(module: tf.Module, path: Path) -> Path:
    """``tf.saved_model.save`` with the module's ``serve`` as ``serving_default``."""
    tf.saved_model.save(module, str(path), signatures={"serving_default": module.serve})
    return path


def module_probabilities(path: Path, dense: np.ndarray, ids: np.ndarray) -> np.ndarray:
    """Sigmoid of the saved TwoTensorModule's own logit (``B x 1`` float32), loaded from ``path``."""
    serve: Any = tf.saved_model.load(str(path)).signatures["serving_default"]
    logit = serve(dense=tf.constant(dense, tf.float32), sparse=tf.constant(ids, tf.int32))["logit"]
    return tf.math.sigmoid(logit).numpy().astype(np.float32).reshape(-1, 1)


class UnmappableModule(tf.Module):
    """A signature over ``x`` (``B x 3``) and ``y`` (``B``): no served tensor maps onto it by default."""

    @tf.function(
        input_signature=[
            tf.TensorSpec([None, 3], tf.float32, name="x"),
            tf.TensorSpec([None], tf.int64, name="y"),
        ]
    )
    def serve(self, x: tf.Tensor, y: tf.Tensor) -> dict[str, tf.Tensor]:
        return {"p": tf.sigmoid(tf.reduce_sum(x, axis=1) + tf.cast(y, tf.float32))}
