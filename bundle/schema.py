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


# Ranking requests: one user's features once, and its candidates'.
#: ``U x Du`` float32: the user's dense columns (the data contract's order among them).
USER_DENSE_INPUT = "user_dense_features"
#: ``U x Hu`` int64: the user's ids (a multi-hot model's whole bags, C-order among them).
USER_CATEGORICAL_INPUT = "user_categorical_ids"
#: ``C x Dc`` float32 per user: its candidates' dense columns.
CANDIDATE_DENSE_INPUT = "candidate_dense_features"
#: ``C x Hc`` int64 per user: its candidates' ids.
CANDIDATE_CATEGORICAL_INPUT = "candidate_categorical_ids"
#: The model's own input that Triton fills for a batch of users (a ``batch_input`` of kind
#: ``BATCH_ITEM_SHAPE``): per user, its candidate part's shape, ``(C, width)``; no client sends it.
CANDIDATE_SHAPE_INPUT = "candidate_shape"
#: Where a model has both candidate parts, the same for its dense part (``U x 2``): the model
#: refuses a batch where a user's two parts disagree on its candidates.
CANDIDATE_DENSE_SHAPE_INPUT = "candidate_dense_shape"
#: A ranking model's name is its flat model's with this suffix (``dlrm_onnx_int8_ranking``).
RANKING_SUFFIX = "_ranking"
#: The config parameter that records which features are the user's (:meth:`FeatureSplit.text`).
USER_FEATURES_PARAMETER = "user_features"
#: The data contract's column names, by position (``criteo.rows`` holds the same).
DENSE_NAMES = tuple(f"I{index}" for index in range(1, NUM_DENSE + 1))
CATEGORICAL_NAMES = tuple(f"C{index}" for index in range(1, NUM_CATEGORICAL + 1))


def ranking_model_name(model: str) -> str:
    """The ranking variant of served model ``model``."""
    return f"{model}{RANKING_SUFFIX}"


def is_ranking_model(model: str) -> bool:
    """Whether ``model`` is a ranking variant, by the repository's names."""
    return model.endswith(RANKING_SUFFIX)


def _columns_of(part: str, names: tuple[str, ...], prefix: str) -> list[int] | None:
    """The positions ``part`` names (``C3`` or ``C3-C9``) among ``names``; None: not of ``prefix``."""
    first, _, last = part.partition("-")
    if not first.startswith(prefix) or (last and not last.startswith(prefix)):
        return None
    if first not in names or (last and last not in names):
        raise ConfigError(f"user features: {part!r} names no column; columns are {names[0]}..{names[-1]}")
    start, stop = names.index(first), names.index(last or first)
    if stop < start:
        raise ConfigError(f"user features: the range {part!r} runs backwards")
    return list(range(start, stop + 1))


def _ranges(prefix: str, columns: tuple[int, ...]) -> list[str]:
    """``columns`` (positions, ascending) as names with runs of three or more as ranges."""
    parts: list[str] = []
    index = 0
    while index < len(columns):
        end = index
        while end + 1 < len(columns) and columns[end + 1] == columns[end] + 1:
            end += 1
        first, last = f"{prefix}{columns[index] + 1}", f"{prefix}{columns[end] + 1}"
        if end - index >= 2:
            parts.append(f"{first}-{last}")
        else:
            parts.extend(f"{prefix}{c + 1}" for c in columns[index : end + 1])
        index = end + 1
    return parts


@dataclass(frozen=True)
class FeatureSplit:
    """Which of a row's features are the user's (sent once per request) and which its candidates'.

    Attributes:
        user_dense: positions among I1..I13 (0 = I1), ascending.
        user_categorical: tables among C1..C26 (0 = C1), ascending; a multi-hot model's whole bag.
    """

    user_dense: tuple[int, ...]
    user_categorical: tuple[int, ...]

    def __post_init__(self) -> None:
        for columns, count in ((self.user_dense, NUM_DENSE), (self.user_categorical, NUM_CATEGORICAL)):
            if list(columns) != sorted(set(columns)) or any(not 0 <= c < count for c in columns):
                raise ConfigError(
                    f"user feature positions must ascend, each once, in 0..{count - 1}: {columns}"
                )
        if not self.user_dense and not self.user_categorical:
            raise ConfigError("user features: none named; a ranking request needs at least one of the user's")
        if len(self.user_dense) == NUM_DENSE and len(self.user_categorical) == NUM_CATEGORICAL:
            raise ConfigError("user features: every feature is the user's; the candidates would have none")

    @classmethod
    def parse(cls, text: str) -> FeatureSplit:
        """``I1,I2,C1,C3-C9``: the data contract's column names, ranges within one kind.

        Raises:
            ConfigError: an unknown name, a backwards range, a column named twice, none named,
                or every column named.
        """
        dense: list[int] = []
        categorical: list[int] = []
        for raw in text.split(","):
            part = raw.strip().upper()
            if not part:
                continue
            found = _columns_of(part, DENSE_NAMES, "I")
            target = dense
            if found is None:
                found, target = _columns_of(part, CATEGORICAL_NAMES, "C"), categorical
            if found is None:
                raise ConfigError(
                    f"user features: {raw.strip()!r} is not a column name "
                    "(I1..I13 dense, C1..C26 categorical)"
                )
            twice = sorted(set(found) & set(target))
            if twice:
                raise ConfigError(f"user features: {raw.strip()!r} names a column named before")
            target.extend(found)
        return cls(tuple(sorted(dense)), tuple(sorted(categorical)))

    @property
    def text(self) -> str:
        """The split as :meth:`parse` reads it, runs written as ranges (``I1,I2,C1,C3-C9``)."""
        return ",".join([*_ranges("I", self.user_dense), *_ranges("C", self.user_categorical)])

    @property
    def candidate_dense(self) -> tuple[int, ...]:
        return tuple(c for c in range(NUM_DENSE) if c not in self.user_dense)

    @property
    def candidate_categorical(self) -> tuple[int, ...]:
        return tuple(c for c in range(NUM_CATEGORICAL) if c not in self.user_categorical)

    def positions(self, hotness: tuple[int, ...] | None = None) -> tuple[tuple[int, ...], tuple[int, ...]]:
        """The positions of ``categorical_ids``' last axis (``H`` of a multi-hot model) that the
        user's tables fill, and those its candidates' fill, each ascending."""
        counts = hotness or (1,) * NUM_CATEGORICAL
        user: list[int] = []
        candidate: list[int] = []
        position = 0
        for table, count in enumerate(counts):
            (user if table in self.user_categorical else candidate).extend(range(position, position + count))
            position += count
        return tuple(user), tuple(candidate)

    def inputs(self, hotness: tuple[int, ...] | None = None) -> tuple[TensorSpec, ...]:
        """A ranking model's request inputs, each shape per user (no batch): the user's parts
        ``(Du,)`` and ``(Hu,)``, the candidates' ``(-1, Dc)`` and ``(-1, Hc)``; a part with no
        column is left out."""
        user, candidate = self.positions(hotness)
        specs = (
            TensorSpec(USER_DENSE_INPUT, np.float32, (len(self.user_dense),)),
            TensorSpec(USER_CATEGORICAL_INPUT, np.int64, (len(user),)),
            TensorSpec(CANDIDATE_DENSE_INPUT, np.float32, (-1, len(self.candidate_dense))),
            TensorSpec(CANDIDATE_CATEGORICAL_INPUT, np.int64, (-1, len(candidate))),
        )
        return tuple(spec for spec in specs if spec.shape[-1] > 0)

    def shape_source(self, hotness: tuple[int, ...] | None = None) -> str:
        """The candidate input whose shape tells a user's candidate count (its ids where it has any)."""
        return CANDIDATE_CATEGORICAL_INPUT if self.positions(hotness)[1] else CANDIDATE_DENSE_INPUT

    def split(
        self, dense: np.ndarray, ids: np.ndarray, hotness: tuple[int, ...] | None = None
    ) -> dict[str, np.ndarray]:
        """One user's request from flat rows that share its features: the user's parts from the
        first row (``1 x Du``, ``1 x Hu``), the candidates' from every row (``1 x C x Dc``, ...)."""
        user, candidate = self.positions(hotness)
        parts = {
            USER_DENSE_INPUT: dense[:1, list(self.user_dense)],
            USER_CATEGORICAL_INPUT: ids[:1, list(user)],
            CANDIDATE_DENSE_INPUT: dense[None, :, list(self.candidate_dense)],
            CANDIDATE_CATEGORICAL_INPUT: ids[None, :, list(candidate)],
        }
        names = {spec.name for spec in self.inputs(hotness)}
        return {name: np.ascontiguousarray(value) for name, value in parts.items() if name in names}

    def tile(
        self, request: dict[str, np.ndarray], hotness: tuple[int, ...] | None = None
    ) -> tuple[np.ndarray, np.ndarray]:
        """The flat rows a one-user request stands for: its user part repeated on each of its
        candidates (``C x 13`` float32, ``C x H`` int64)."""
        user, candidate = self.positions(hotness)
        source = request[self.shape_source(hotness)]
        count = source.shape[1]
        dense = np.empty((count, NUM_DENSE), np.float32)
        ids = np.empty((count, len(user) + len(candidate)), np.int64)
        if self.user_dense:
            dense[:, list(self.user_dense)] = request[USER_DENSE_INPUT][0]
        if self.candidate_dense:
            dense[:, list(self.candidate_dense)] = request[CANDIDATE_DENSE_INPUT][0]
        if user:
            ids[:, list(user)] = request[USER_CATEGORICAL_INPUT][0]
        if candidate:
            ids[:, list(candidate)] = request[CANDIDATE_CATEGORICAL_INPUT][0]
        return dense, ids


def ranking_feeds(
    requests: list[dict[str, np.ndarray]], split: FeatureSplit, hotness: tuple[int, ...] | None = None
) -> dict[str, np.ndarray]:
    """A ranking model's inputs for a batch of one-user requests, as Triton hands them to it: the
    user parts stacked (``U x Du``, ``U x Hu``), the candidate parts concatenated and flattened
    (ragged inputs), and ``candidate_shape`` (``U x 2`` int32, each user's shape of
    :meth:`FeatureSplit.shape_source` without its batch dimension; ``candidate_dense_shape`` the
    same of the dense part where there are both)."""
    if not requests:
        raise ConfigError("no requests to batch")
    feeds: dict[str, np.ndarray] = {}
    for spec in split.inputs(hotness):
        parts = [request[spec.name] for request in requests]
        if spec.name in (USER_DENSE_INPUT, USER_CATEGORICAL_INPUT):
            feeds[spec.name] = np.concatenate(parts, axis=0)
        else:
            feeds[spec.name] = np.concatenate([part.reshape(-1) for part in parts])
    source = split.shape_source(hotness)
    feeds[CANDIDATE_SHAPE_INPUT] = np.asarray([request[source].shape[1:] for request in requests], np.int32)
    if source == CANDIDATE_CATEGORICAL_INPUT and split.candidate_dense:
        shapes = [request[CANDIDATE_DENSE_INPUT].shape[1:] for request in requests]
        feeds[CANDIDATE_DENSE_SHAPE_INPUT] = np.asarray(shapes, np.int32)
    return feeds


# ------------------------------------------------------------------ DLRMv3 (HSTU)
#: A DLRMv3 request is one user, every input INT64 under Triton's batch dimension (the users):
#: its id (1 value), its history (L values each, L may be 0) and its candidates (C values each,
#: C >= 1). The history and candidate inputs are ragged: a batch of users holds their values
#: concatenated.
DLRMV3_USER_INPUT = "user_id"
DLRMV3_HISTORY_INPUTS = ("uih_item_id", "uih_category_id", "uih_timestamp", "uih_action_weight")
DLRMV3_CANDIDATE_INPUTS = ("candidate_item_id", "candidate_category_id")
#: The model's own inputs that Triton makes for a batch of users (``batch_input``, INT32): each
#: user's history and candidate counts, and tensors whose one dim is the batch's longest of each.
DLRMV3_HISTORY_LENGTHS = "uih_lengths"
DLRMV3_CANDIDATE_LENGTHS = "candidate_lengths"
DLRMV3_HISTORY_WIDTH = "uih_width"
DLRMV3_CANDIDATE_WIDTH = "candidate_width"
#: The served name of a DLRMv3 model (the entry model users call).
DLRMV3_MODEL = "dlrmv3"
#: Config parameters the local server's backends check a request's ragged inputs by (the NGC
#: image's backends do not read them): inputs that may hold no value (a user with no history),
#: groups whose value counts must agree (``a,b;c,d``), the most values an input may hold
#: (``c:2048``), inputs whose values must be >= 0.
EMPTY_RAGGED_PARAMETER = "ragged_may_be_empty"
AGREE_PARAMETER = "ragged_agree"
MAX_ELEMENTS_PARAMETER = "ragged_max_elements"
NON_NEGATIVE_PARAMETER = "non_negative_inputs"


def dlrmv3_inputs() -> tuple[TensorSpec, ...]:
    """A DLRMv3 model's request inputs, each shape per user (no batch)."""
    return (
        TensorSpec(DLRMV3_USER_INPUT, np.int64, (1,)),
        *(TensorSpec(name, np.int64, (-1,)) for name in DLRMV3_HISTORY_INPUTS + DLRMV3_CANDIDATE_INPUTS),
    )


def dlrmv3_outputs(tasks: tuple[str, ...]) -> tuple[TensorSpec, ...]:
    """One FP32 output per task, named by the task: a value per candidate (``C`` a user).

    Raises:
        ConfigError: a task named as an input, or two tasks of one name.
    """
    taken = {spec.name for spec in dlrmv3_inputs()} | {
        DLRMV3_HISTORY_LENGTHS, DLRMV3_CANDIDATE_LENGTHS, DLRMV3_HISTORY_WIDTH, DLRMV3_CANDIDATE_WIDTH,
    }  # fmt: skip
    clashes = sorted(set(tasks) & taken)
    if clashes or len(set(tasks)) != len(tasks):
        raise ConfigError(f"DLRMv3 task names must differ from each other and from the inputs: {list(tasks)}")
    return tuple(TensorSpec(task, np.float32, (-1,)) for task in tasks)
