"""DLRMv3, the HSTU generative recommender MLPerf Inference benchmarks, in plain PyTorch.

One user is one sequence: its contextual tokens (the user id's embedding, through a
linear map of its own), its history (the items it acted on, each with a category, a
timestamp and an action bitmask) and its candidates, in that order. The model reads
the sequence with causal, target-aware HSTU layers (each candidate attends to the
contextual tokens, the history and itself, never to another candidate) and scores each
candidate per task from its encoded embedding times its item embedding.

The semantics are those of MLCommons' reference (``mlcommons/inference``,
``recommendation/dlrm_v3``, its pure-PyTorch kernels), written here from what it does;
its ``state_dict`` key names load unchanged. Where the reference is a batch of jagged
sequences, this module pads a batch of users to its longest and masks, and scores each
user as the reference scores that user alone: its attention is scaled by ``1 / N`` with
``N`` the user's own sequence length, not the batch's longest. What the reference does
before the model, this module does inside it:

- a history longer than ``max_seq_len - max_num_candidates - (number of contextual
  features)`` keeps its first items;
- the candidates' query time is the latest timestamp of the kept history (0 without one);
- an id is reduced into its table with a non-negative modulo (the bundle's rule for ids:
  any int64 is valid, none reads out of bounds).

Two quirks of the reference's CPU path are kept, since its answers are the truth: the
time bucket of a position is clamped to the timestamp table's width minus one (not to
its bucket count), and the candidates' action embedding is one learned row for all.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from bundle.errors import ConfigError

#: The reference's positional tables: positions and time buckets (fixed by its model).
POSITION_BUCKETS = 8192
TIME_BUCKETS = 2048
#: The timestamp postprocessor's periods: hour of day, day of week (seconds, units a period).
TIME_PERIODS = ((60 * 60, 24), (24 * 60 * 60, 7))
#: Width of the action embeddings (per action type) and of the item and head MLPs' hidden layer.
ACTION_EMBEDDING_DIM = 8
HEAD_HIDDEN_DIM = 512
#: Task types, in the order the reference sorts its tasks.
TASK_TYPES = ("BINARY_CLASSIFICATION", "REGRESSION")


@dataclass(frozen=True)
class Task:
    name: str
    weight: int
    kind: str  # one of TASK_TYPES


@dataclass(frozen=True)
class Table:
    name: str
    rows: int
    dim: int
    features: tuple[str, ...]
    data_type: str = "FP32"


@dataclass(frozen=True)
class Dlrmv3Config:
    """A DLRMv3 model's configuration, as the reference's ``DlrmHSTUConfig`` names its fields.

    Attributes:
        hstu: the ``hstu_config`` fields the model uses (see :meth:`from_dict`).
        tables: the embedding tables by name.
        tasks: the tasks, in the reference's order (binary classification first).
    """

    max_seq_len: int
    max_num_candidates: int
    max_num_candidates_inference: int
    num_heads: int
    linear_dim: int
    qk_dim: int
    num_layers: int
    table_dim: int
    preprocessor_hidden_dim: int
    embedding_dim: int
    group_norm: bool
    contextual_max_length: tuple[tuple[str, int], ...]
    contextual_min_uih_length: tuple[tuple[str, int], ...]
    action_weights: tuple[int, ...] | None
    post_id_feature: str
    candidate_post_id_feature: str
    category_feature: str | None
    candidate_category_feature: str | None
    item_features: tuple[str, ...]
    enable_postprocessor: bool
    use_layer_norm_postprocessor: bool
    tables: tuple[Table, ...]
    tasks: tuple[Task, ...]
    raw: dict[str, Any] = field(default_factory=dict, compare=False, hash=False)

    @property
    def max_uih_len(self) -> int:
        """The longest history the model keeps (the reference's dataset cuts to it)."""
        return self.max_seq_len - self.max_num_candidates - len(self.contextual_max_length)

    @property
    def contextual_len(self) -> int:
        return sum(length for _, length in self.contextual_max_length)

    def table_of(self, feature: str) -> Table:
        for table in self.tables:
            if feature in table.features:
                return table
        raise ConfigError(f"DLRMv3 config: no table in 'tables' holds feature {feature!r}")

    @classmethod
    def load(cls, path: Path) -> Dlrmv3Config:
        """Read a config file (JSON: ``hstu_config``, ``tables``, ``multitask_configs``).

        Raises:
            ConfigError: unreadable, or a field missing or contradictory (named).
        """
        try:
            document = json.loads(Path(path).read_text())
        except (OSError, json.JSONDecodeError) as exc:
            raise ConfigError(f"cannot read DLRMv3 config {path}: {exc}") from None
        if not isinstance(document, dict):
            raise ConfigError(f"DLRMv3 config {path}: expected a JSON object")
        return cls.from_dict(document)

    @classmethod
    def from_dict(cls, document: dict[str, Any]) -> Dlrmv3Config:
        """See :meth:`load`."""
        hstu = _section(document, "hstu_config", dict)
        tables_doc = _section(document, "tables", dict)
        tasks_doc = _section(document, "multitask_configs", list)

        def need(key: str, kind: type | tuple[type, ...]) -> Any:
            if key not in hstu:
                raise ConfigError(f"DLRMv3 config: hstu_config.{key} is missing")
            value = hstu[key]
            if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
                raise ConfigError(f"DLRMv3 config: hstu_config.{key} is {value!r}, expected {_kind(kind)}")
            return value

        def positive(key: str) -> int:
            value = need(key, int)
            if value < 1:
                raise ConfigError(f"DLRMv3 config: hstu_config.{key} must be >= 1, got {value}")
            return int(value)

        tables = []
        for name, entry in tables_doc.items():
            if not isinstance(entry, dict):
                raise ConfigError(f"DLRMv3 config: tables.{name} must be an object")
            for key in ("num_embeddings", "embedding_dim", "feature_names"):
                if key not in entry:
                    raise ConfigError(f"DLRMv3 config: tables.{name}.{key} is missing")
            rows, dim, features = entry["num_embeddings"], entry["embedding_dim"], entry["feature_names"]
            if not isinstance(rows, int) or rows < 1 or not isinstance(dim, int) or dim < 1:
                raise ConfigError(f"DLRMv3 config: tables.{name} needs num_embeddings and embedding_dim >= 1")
            if (
                not isinstance(features, list)
                or not features
                or not all(isinstance(f, str) for f in features)
            ):
                raise ConfigError(f"DLRMv3 config: tables.{name}.feature_names must be a list of names")
            data_type = str(entry.get("data_type", "FP32")).upper().removeprefix("DATATYPE.")
            tables.append(Table(str(name), rows, dim, tuple(features), data_type))
        if not tables:
            raise ConfigError("DLRMv3 config: tables is empty")
        tasks = []
        for index, entry in enumerate(tasks_doc):
            if not isinstance(entry, dict) or not {"task_name", "task_weight", "task_type"} <= set(entry):
                raise ConfigError(
                    f"DLRMv3 config: multitask_configs[{index}] needs task_name, task_weight and task_type"
                )
            kind = str(entry["task_type"]).upper().removeprefix("MULTITASKTASKTYPE.")
            if kind not in TASK_TYPES:
                raise ConfigError(
                    f"DLRMv3 config: multitask_configs[{index}].task_type is {entry['task_type']!r}, "
                    f"expected one of {', '.join(TASK_TYPES)}"
                )
            tasks.append(Task(str(entry["task_name"]), int(entry["task_weight"]), kind))
        if not tasks:
            raise ConfigError("DLRMv3 config: multitask_configs is empty")
        if [TASK_TYPES.index(t.kind) for t in tasks] != sorted(TASK_TYPES.index(t.kind) for t in tasks):
            raise ConfigError("DLRMv3 config: multitask_configs must be sorted by task_type (binary first)")

        user_features = need("user_embedding_feature_names", list)
        item_features = need("item_embedding_feature_names", list)
        post_id = need("uih_post_id_feature_name", str)
        mapping = [tuple(pair) for pair in need("merge_uih_candidate_feature_mapping", list)]
        if any(len(pair) != 2 for pair in mapping):
            raise ConfigError(
                "DLRMv3 config: hstu_config.merge_uih_candidate_feature_mapping must hold pairs"
            )
        partner = dict(mapping)
        if post_id not in user_features or partner.get(post_id) not in item_features:
            raise ConfigError(
                f"DLRMv3 config: the history's item feature {post_id!r} must be among "
                "user_embedding_feature_names and map to a candidate feature among "
                "item_embedding_feature_names"
            )
        additional = [
            uih for uih, candidate in mapping
            if candidate in item_features and uih in user_features and uih != post_id
        ]  # fmt: skip
        if len(additional) > 1:
            raise ConfigError(
                f"DLRMv3 config: {len(additional)} history features besides the item "
                f"({', '.join(additional)}); "
                "the request contract carries one, the item's category"
            )
        contextual = need("contextual_feature_to_max_length", dict)
        minimum = need("contextual_feature_to_min_uih_length", dict)
        if any(not isinstance(v, int) or v < 1 for v in contextual.values()):
            raise ConfigError(
                "DLRMv3 config: hstu_config.contextual_feature_to_max_length values must be >= 1"
            )
        if set(minimum) - set(contextual):
            raise ConfigError(
                "DLRMv3 config: hstu_config.contextual_feature_to_min_uih_length names "
                f"{sorted(set(minimum) - set(contextual))}, which are not contextual features"
            )
        if len(contextual) > 1 or any(length != 1 for length in contextual.values()):
            raise ConfigError(
                "DLRMv3 config: the request contract carries one contextual feature of one value "
                "(the user id), "
                f"got {contextual}"
            )
        weights = hstu.get("action_weights")
        if weights is not None and (
            not isinstance(weights, list) or not all(isinstance(w, int) for w in weights)
        ):
            raise ConfigError("DLRMv3 config: hstu_config.action_weights must be a list of ints or null")
        config = cls(
            max_seq_len=positive("max_seq_len"),
            max_num_candidates=positive("max_num_candidates"),
            max_num_candidates_inference=positive("max_num_candidates_inference"),
            num_heads=positive("hstu_num_heads"),
            linear_dim=positive("hstu_attn_linear_dim"),
            qk_dim=positive("hstu_attn_qk_dim"),
            num_layers=positive("hstu_attn_num_layers"),
            table_dim=positive("hstu_embedding_table_dim"),
            preprocessor_hidden_dim=positive("hstu_preprocessor_hidden_dim"),
            embedding_dim=positive("hstu_transducer_embedding_dim"),
            group_norm=bool(hstu.get("hstu_group_norm", False)),
            contextual_max_length=tuple((str(k), int(v)) for k, v in contextual.items()),
            contextual_min_uih_length=tuple((str(k), int(v)) for k, v in minimum.items()),
            action_weights=None if weights is None else tuple(weights),
            post_id_feature=post_id,
            candidate_post_id_feature=str(partner[post_id]),
            category_feature=additional[0] if additional else None,
            candidate_category_feature=str(partner[additional[0]]) if additional else None,
            item_features=tuple(str(f) for f in item_features),
            enable_postprocessor=bool(hstu.get("enable_postprocessor", True)),
            use_layer_norm_postprocessor=bool(hstu.get("use_layer_norm_postprocessor", False)),
            tables=tuple(tables),
            tasks=tuple(tasks),
            raw=document,
        )
        config._check()
        return config

    def _check(self) -> None:
        if self.max_uih_len < 0:
            raise ConfigError(
                f"DLRMv3 config: hstu_config.max_seq_len {self.max_seq_len} leaves no room for "
                f"max_num_candidates {self.max_num_candidates} and the contextual features"
            )
        for feature in (self.post_id_feature, self.candidate_post_id_feature, *self.item_features):
            table = self.table_of(feature)
            if table.dim != self.table_dim:
                raise ConfigError(
                    f"DLRMv3 config: tables.{table.name}.embedding_dim is {table.dim}, "
                    f"hstu_config.hstu_embedding_table_dim is {self.table_dim}"
                )
        for feature, _ in self.contextual_max_length:
            if self.table_of(feature).dim != self.table_dim:
                raise ConfigError(
                    f"DLRMv3 config: the table of {feature!r} is not hstu_embedding_table_dim wide"
                )
        if set(self.item_features) - {self.candidate_post_id_feature, self.candidate_category_feature}:
            raise ConfigError(
                f"DLRMv3 config: item_embedding_feature_names {list(self.item_features)} name a "
                "feature that is "
                "neither the candidate's item nor its category"
            )
        if self.enable_postprocessor and self.use_layer_norm_postprocessor:
            raise ConfigError(
                "DLRMv3 config: the layer-norm postprocessor is not supported, only the timestamp one"
            )
        if not self.enable_postprocessor:
            raise ConfigError(
                "DLRMv3 config: enable_postprocessor false (an L2-norm postprocessor) is not supported"
            )
        if self.group_norm:
            raise ConfigError("DLRMv3 config: hstu_group_norm true is not supported")


def _section(document: dict[str, Any], key: str, kind: type) -> Any:
    if key not in document:
        raise ConfigError(f"DLRMv3 config: {key} is missing")
    if not isinstance(document[key], kind):
        raise ConfigError(f"DLRMv3 config: {key} must be a JSON {_kind(kind)}")
    return document[key]


def _kind(kind: type | tuple[type, ...]) -> str:
    names = {int: "an integer", str: "a string", list: "list", dict: "object", bool: "a boolean"}
    kinds = kind if isinstance(kind, tuple) else (kind,)
    return " or ".join(names.get(k, k.__name__) for k in kinds)


# ------------------------------------------------------------------ layers
class _Norm(nn.Module):
    """A layer norm computed in float32 (the reference's ``LayerNorm``; with ``swish``,
    ``x * sigmoid(norm(x))``)."""

    def __init__(self, dim: int, swish: bool = False, eps: float = 1e-5) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.bias = nn.Parameter(torch.zeros(dim))
        self._swish = swish
        self._eps = eps
        self._shape = (dim,)  # static: an exported graph's norm needs its width as a constant

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x.to(torch.float32)
        normed = F.layer_norm(x, self._shape, self.weight.float(), self.bias.float(), self._eps)
        return x * torch.sigmoid(normed) if self._swish else normed


def _mlp(inputs: int, hidden: int, outputs: int) -> nn.Sequential:
    """Linear, swish layer norm, linear, layer norm (the reference's MLP of each embedding)."""
    return nn.Sequential(
        nn.Linear(inputs, hidden), _Norm(hidden, swish=True), nn.Linear(hidden, outputs), _Norm(outputs)
    )


def _by_row(module: nn.Module, x: torch.Tensor) -> torch.Tensor:
    """``module`` on each row of ``x`` (``(..., D)``), as one ``(rows, D)`` matrix: the same
    product, and an exported program need not guard against a batch dim of 1."""
    out = module(x.reshape(-1, x.shape[-1]))
    return out.reshape(*x.shape[:-1], out.shape[-1])


class _Tables(nn.Module):
    """The embedding tables, held as the reference's ``EmbeddingCollection`` holds them."""

    def __init__(self, tables: tuple[Table, ...]) -> None:
        super().__init__()
        self.embeddings = nn.ModuleDict({table.name: nn.Embedding(table.rows, table.dim) for table in tables})


class _ActionEncoder(nn.Module):
    _combined_action_weights: torch.Tensor

    def __init__(self, action_weights: tuple[int, ...]) -> None:
        super().__init__()
        count = len(action_weights)
        self.register_buffer(
            "_combined_action_weights", torch.tensor(list(action_weights), dtype=torch.int64)
        )
        self._action_embedding_table = nn.Parameter(torch.zeros(count, ACTION_EMBEDDING_DIM))
        self._target_action_embedding_table = nn.Parameter(torch.zeros(1, count * ACTION_EMBEDDING_DIM))

    @property
    def output_dim(self) -> int:
        return int(self._action_embedding_table.numel())


class _Preprocessor(nn.Module):
    def __init__(self, config: Dlrmv3Config) -> None:
        super().__init__()
        dim, hidden, out = config.table_dim, config.preprocessor_hidden_dim, config.embedding_dim
        contextual = config.contextual_len
        if contextual > 0:
            self._batched_contextual_linear_weights = nn.Parameter(torch.zeros(contextual, dim, out))
            self._batched_contextual_linear_bias = nn.Parameter(torch.zeros(contextual, out))
        self._content_embedding_mlp = _mlp(dim, hidden, out)
        additional = 1 if config.category_feature is not None else 0
        # The reference builds it even without additional features (its input then 0 wide).
        self._additional_embedding_mlp = _mlp(dim * additional, hidden, out)
        self._action_encoder: _ActionEncoder | None = None
        if config.action_weights is not None:
            self._action_encoder = _ActionEncoder(config.action_weights)
            self._action_embedding_mlp = _mlp(self._action_encoder.output_dim, hidden, out)


class _PositionalEncoder(nn.Module):
    def __init__(self, dim: int) -> None:
        super().__init__()
        self._position_embeddings_weight = nn.Parameter(torch.zeros(POSITION_BUCKETS, dim))
        self._timestamp_embeddings_weight = nn.Parameter(torch.zeros(TIME_BUCKETS + 1, dim))


def _floor_divide(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """Float ``a // b`` as PyTorch computes it (from the exact ``fmod``, not ``floor(a / b)``,
    which rounds up where ``a / b`` lies within an ulp below an integer), in ops that export as
    they run, so an exported graph keeps the reference's hour and day of a timestamp."""
    mod = torch.fmod(a, b)
    div = (a - mod) / b
    div = torch.where((mod != 0) & ((b < 0) != (mod < 0)), div - 1, div)
    floored = torch.floor(div)
    return torch.where(div - floored > 0.5, floored + 1, floored)


def _remainder(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """Float ``a % b`` with the divisor's sign, as PyTorch computes it (from the exact ``fmod``)."""
    mod = torch.fmod(a, b)
    return torch.where((mod != 0) & ((b < 0) != (mod < 0)), mod + b, mod)


class _TimestampPostprocessor(nn.Module):
    _period_units: torch.Tensor
    _units_per_period: torch.Tensor

    def __init__(self, dim: int) -> None:
        super().__init__()
        self._layer_norm = nn.LayerNorm([dim], eps=1e-5)
        self.register_buffer("_period_units", torch.tensor([[float(p) for p, _ in TIME_PERIODS]]))
        self.register_buffer("_units_per_period", torch.tensor([[float(u) for _, u in TIME_PERIODS]]))
        self._time_feature_combiner = nn.Linear(dim + 2 * len(TIME_PERIODS), dim)

    def forward(self, embeddings: torch.Tensor, timestamps: torch.Tensor) -> torch.Tensor:
        """``embeddings`` (M, D), ``timestamps`` (M,) int64."""
        since = _floor_divide(timestamps.unsqueeze(-1).to(torch.float32), self._period_units)
        elapsed = _remainder(since, self._units_per_period) / self._units_per_period * 2 * 3.14
        # (cos, sin) of each period's angle, interleaved as torch.polar then view_as_real lays them.
        angles = elapsed.to(torch.float32)
        features = torch.stack([torch.cos(angles), torch.sin(angles)], dim=-1).flatten(-2, -1)
        combined = torch.cat([embeddings, features.to(elapsed.dtype)], dim=-1)
        return self._layer_norm(self._time_feature_combiner(combined))


class _StuLayer(nn.Module):
    def __init__(self, config: Dlrmv3Config) -> None:
        super().__init__()
        dim, heads = config.embedding_dim, config.num_heads
        self._heads, self._hidden, self._attention = heads, config.linear_dim, config.qk_dim
        self._alpha = 1.0 / (config.qk_dim**0.5)
        self._dim, self._attended = (dim,), (config.linear_dim * heads,)
        width = (config.linear_dim * 2 + config.qk_dim * 2) * heads
        self._uvqk_weight = nn.Parameter(torch.zeros(dim, width))
        self._uvqk_beta = nn.Parameter(torch.zeros(width))
        self._input_norm_weight = nn.Parameter(torch.ones(dim))
        self._input_norm_bias = nn.Parameter(torch.zeros(dim))
        self._output_weight = nn.Parameter(torch.zeros(config.linear_dim * heads * 3, dim))
        self._output_norm_weight = nn.Parameter(torch.ones(config.linear_dim * heads))
        self._output_norm_bias = nn.Parameter(torch.zeros(config.linear_dim * heads))

    def forward(self, x: torch.Tensor, mask: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
        """``x`` (B, N, D) padded; ``mask`` (B, N, N) who attends to whom; ``lengths`` (B,) each
        user's sequence length, the ``N`` of its attention scale (and beyond which x is padding)."""
        batch, seq, dim = x.shape
        heads, hidden, attention = self._heads, self._hidden, self._attention
        rows = x.reshape(batch * seq, dim)
        normed = F.layer_norm(
            rows.float(), self._dim, self._input_norm_weight.float(), self._input_norm_bias.float(), 1e-6
        )
        uvqk = torch.addmm(self._uvqk_beta, normed, self._uvqk_weight)
        u, v, q, k = torch.split(
            uvqk, [hidden * heads, hidden * heads, attention * heads, attention * heads], 1
        )
        u = F.silu(u)
        valid = (torch.arange(seq, device=x.device).view(1, seq) < lengths.view(-1, 1)).reshape(-1, 1)
        # Padding rows hold no query, key or value (the reference's jagged rows end at the user's length).
        q = (q * valid).view(batch, seq, heads, attention).transpose(1, 2)
        k = (k * valid).view(batch, seq, heads, attention).transpose(1, 2)
        v = (v * valid).view(batch, seq, heads, hidden).transpose(1, 2)
        scores = torch.einsum("bhxa,bhya->bhxy", q, k) * self._alpha
        scores = F.silu(scores) / lengths.view(-1, 1, 1, 1).to(scores.dtype)
        scores = scores * mask.unsqueeze(1)
        attended = (
            torch.einsum("bhxd,bhdv->bhxv", scores, v).transpose(1, 2).reshape(batch * seq, heads * hidden)
        )
        normed_attention = F.layer_norm(
            attended,
            self._attended,
            self._output_norm_weight.float(),
            self._output_norm_bias.float(),
            1e-6,
        )
        y = torch.cat([u, attended, u * normed_attention], dim=1)
        return torch.addmm(rows, y, self._output_weight).view(batch, seq, dim)


class _StuStack(nn.Module):
    def __init__(self, config: Dlrmv3Config) -> None:
        super().__init__()
        self._stu_layers = nn.ModuleList([_StuLayer(config) for _ in range(config.num_layers)])


class _Transducer(nn.Module):
    def __init__(self, config: Dlrmv3Config) -> None:
        super().__init__()
        self._input_preprocessor = _Preprocessor(config)
        self._positional_encoder = _PositionalEncoder(config.embedding_dim)
        self._output_postprocessor = _TimestampPostprocessor(config.embedding_dim)
        self._stu_module = _StuStack(config)


class _Head(nn.Module):
    def __init__(self, dim: int, tasks: int) -> None:
        super().__init__()
        self._prediction_module = nn.Sequential(
            nn.Linear(dim, HEAD_HIDDEN_DIM),
            _Norm(HEAD_HIDDEN_DIM, swish=True),
            nn.Linear(HEAD_HIDDEN_DIM, tasks),
        )


# ------------------------------------------------------------------ the model
class Dlrmv3(nn.Module):
    """DLRMv3 over a batch of users, each scored as alone (see the module).

    :meth:`forward` takes padded tensors, every one int64: ``user_id`` (B,), the history
    ``uih_item_id``, ``uih_category_id``, ``uih_timestamp``, ``uih_action_weight`` (B, L)
    with ``uih_lengths`` (B,), the candidates ``candidate_item_id``, ``candidate_category_id``
    (B, C) with ``candidate_lengths`` (B,); it returns (B, C, T) float32: each candidate's
    prediction per task (a probability for a binary task), 0 past a user's candidates.
    """

    def __init__(self, config: Dlrmv3Config) -> None:
        super().__init__()
        self.config = config
        self._embedding_collection = _Tables(config.tables)
        self._multitask_module = _Head(config.embedding_dim, len(config.tasks))
        self._hstu_transducer = _Transducer(config)
        self._item_embedding_mlp = nn.Sequential(
            nn.Linear(config.table_dim * len(config.item_features), HEAD_HIDDEN_DIM),
            _Norm(HEAD_HIDDEN_DIM, swish=True),
            nn.Linear(HEAD_HIDDEN_DIM, config.embedding_dim),
            _Norm(config.embedding_dim),
        )
        self._binary = [task.kind == "BINARY_CLASSIFICATION" for task in config.tasks]

    def _lookup(self, feature: str, ids: torch.Tensor) -> torch.Tensor:
        table = self._embedding_collection.embeddings[self.config.table_of(feature).name]
        assert isinstance(table, nn.Embedding)
        weight = table.weight
        return F.embedding(torch.remainder(ids, weight.shape[0]), weight).to(torch.float32)

    def forward(
        self,
        user_id: torch.Tensor,
        uih_item_id: torch.Tensor,
        uih_category_id: torch.Tensor,
        uih_timestamp: torch.Tensor,
        uih_action_weight: torch.Tensor,
        uih_lengths: torch.Tensor,
        candidate_item_id: torch.Tensor,
        candidate_category_id: torch.Tensor,
        candidate_lengths: torch.Tensor,
    ) -> torch.Tensor:
        config = self.config
        transducer = self._hstu_transducer
        pre = transducer._input_preprocessor
        batch = user_id.shape[0]
        device = user_id.device
        # The history as the reference's dataset keeps it: its first max_uih_len items (those
        # past them are padding here, so that no shape depends on the limit).
        history = torch.clamp(uih_lengths, max=config.max_uih_len)
        width_l, width_c = uih_item_id.shape[1], candidate_item_id.shape[1]
        ctx = config.contextual_len
        lengths = ctx + history + candidate_lengths  # each user's sequence
        seq = ctx + width_l + width_c
        positions = torch.arange(seq, device=device).view(1, seq)
        # Where each of a user's rows sits in its own sequence [ctx, history, candidates]:
        # history item j at ctx + j, candidate i at ctx + history + i.
        in_history = torch.arange(width_l, device=device).view(1, -1) < history.view(-1, 1)
        in_candidates = torch.arange(width_c, device=device).view(1, -1) < candidate_lengths.view(-1, 1)
        history_at = ctx + torch.arange(width_l, device=device).view(1, -1).expand(batch, -1)
        candidate_at = ctx + history.view(-1, 1) + torch.arange(width_c, device=device).view(1, -1)
        # Padding goes to one spare row past the sequence, dropped after the scatter.
        history_at = torch.where(in_history, history_at, seq)
        candidate_at = torch.where(in_candidates, candidate_at, seq)

        def place(history_part: torch.Tensor, candidate_part: torch.Tensor) -> torch.Tensor:
            """(B, L, E) and (B, C, E) into (B, N, E), each user's rows in its sequence's order."""
            width = history_part.shape[-1]
            out = torch.zeros(batch, seq + 1, width, dtype=history_part.dtype, device=device)
            out = out.scatter(1, history_at.unsqueeze(-1).expand(-1, -1, width), history_part)
            out = out.scatter(1, candidate_at.unsqueeze(-1).expand(-1, -1, width), candidate_part)
            return out[:, :seq]

        items = place(self._lookup(config.post_id_feature, uih_item_id),
                      self._lookup(config.candidate_post_id_feature, candidate_item_id))  # fmt: skip
        embeddings = _by_row(pre._content_embedding_mlp, items)
        if config.category_feature is not None and config.candidate_category_feature is not None:
            categories = place(
                self._lookup(config.category_feature, uih_category_id),
                self._lookup(config.candidate_category_feature, candidate_category_id),
            )
            embeddings = embeddings + _by_row(pre._additional_embedding_mlp, categories)
        encoder = pre._action_encoder
        if encoder is not None:
            exploded = (
                torch.bitwise_and(uih_action_weight.unsqueeze(-1), encoder._combined_action_weights) > 0
            )
            actions = (exploded.unsqueeze(-1) * encoder._action_embedding_table).reshape(
                batch, width_l, encoder.output_dim
            )
            targets = encoder._target_action_embedding_table.expand(batch, width_c, -1)
            embeddings = embeddings + _by_row(pre._action_embedding_mlp, place(actions, targets))
        # The query time of a user's candidates: its kept history's latest timestamp (0 without one).
        latest = torch.where(in_history, uih_timestamp, torch.zeros_like(uih_timestamp))
        query_time = torch.cat([torch.zeros_like(user_id).view(-1, 1), latest], dim=1).max(dim=1).values
        times = place(uih_timestamp.unsqueeze(-1), query_time.view(-1, 1, 1).expand(-1, width_c, 1)).squeeze(
            -1
        )
        if ctx > 0:
            ((feature, _),) = config.contextual_max_length
            user = self._lookup(feature, user_id.view(-1, 1)).reshape(batch, ctx * config.table_dim)
            minimum = dict(config.contextual_min_uih_length).get(feature, 0)
            if minimum > 0:
                user = user * (history + candidate_lengths >= minimum).view(-1, 1)
            contextual = torch.baddbmm(
                pre._batched_contextual_linear_bias.view(-1, 1, config.embedding_dim),
                user.view(-1, ctx, config.table_dim).transpose(0, 1),
                pre._batched_contextual_linear_weights,
            ).transpose(0, 1)
            embeddings = torch.cat([contextual, embeddings[:, ctx:]], dim=1)
        embeddings = self._positional(embeddings, times, lengths, candidate_lengths, positions)
        mask = self._attention_mask(lengths, candidate_lengths, seq)
        for layer in transducer._stu_module._stu_layers:
            embeddings = layer(embeddings, mask, lengths)
        # The candidates' rows, (B, C, D), their query time beside them.
        gather_at = torch.clamp(candidate_at, max=seq - 1)
        chosen = embeddings.gather(1, gather_at.unsqueeze(-1).expand(-1, -1, config.embedding_dim))
        flat = chosen.reshape(batch * width_c, config.embedding_dim)
        user_embeddings = transducer._output_postprocessor(flat, query_time.repeat_interleave(width_c))
        item_inputs = {
            config.candidate_post_id_feature: self._lookup(
                config.candidate_post_id_feature, candidate_item_id
            ),
        }
        if config.candidate_category_feature is not None:
            item_inputs[config.candidate_category_feature] = self._lookup(
                config.candidate_category_feature, candidate_category_id
            )
        item_embeddings = _by_row(
            self._item_embedding_mlp, torch.cat([item_inputs[name] for name in config.item_features], dim=-1)
        ).reshape(batch * width_c, -1)
        logits = self._multitask_module._prediction_module(user_embeddings * item_embeddings)
        predictions = torch.stack(
            [
                torch.sigmoid(logits[:, t]) if binary else logits[:, t]
                for t, binary in enumerate(self._binary)
            ],
            dim=-1,
        ).view(batch, width_c, len(self._binary))
        return predictions * in_candidates.unsqueeze(-1)

    def _positional(
        self,
        embeddings: torch.Tensor,
        times: torch.Tensor,
        lengths: torch.Tensor,
        candidates: torch.Tensor,
        positions: torch.Tensor,
    ) -> torch.Tensor:
        """The reference's timestamp and position embeddings, added to the scaled embeddings."""
        encoder = self._hstu_transducer._positional_encoder
        ctx = self.config.contextual_len
        position_table, time_table = encoder._position_embeddings_weight, encoder._timestamp_embeddings_weight
        embeddings = embeddings * (self.config.embedding_dim**0.5)
        high = (lengths - candidates).view(-1, 1)
        index = high - torch.minimum(positions, high) + ctx
        index = torch.clamp(index, max=position_table.shape[0] - 1)
        if ctx > 0:
            index = torch.where(positions < ctx, positions, index)
        last = torch.clamp(lengths - 1, min=0).view(-1, 1)
        query = times.gather(1, last)
        delta = query - times
        delta = delta.clamp(min=1e-6) / 60.0
        buckets = torch.sqrt(delta).clamp(min=0).int()
        # The reference's CPU path clamps to its table's width minus one, not its bucket count.
        buckets = torch.clamp(buckets, min=0, max=time_table.shape[1] - 1)
        added = F.embedding(buckets.long(), time_table) + F.embedding(index, position_table)
        return embeddings + added.to(embeddings.dtype)

    @staticmethod
    def _attention_mask(lengths: torch.Tensor, candidates: torch.Tensor, seq: int) -> torch.Tensor:
        """(B, N, N): a row attends to itself and to every row before it in the history, the
        candidates to the whole history and themselves, not to each other (the reference's
        causal, target-aware mask)."""
        rows = torch.arange(seq, device=lengths.device).view(1, seq)
        ids = torch.minimum(rows, (lengths - candidates).view(-1, 1))
        distance = ids.unsqueeze(2) - ids.unsqueeze(1)
        itself = (rows.view(seq, 1) == rows).unsqueeze(0)
        return torch.logical_or(itself, distance > 0)


def load_state(model: Dlrmv3, path: Path) -> None:
    """Load a ``torch.save`` of the reference's ``state_dict`` (its key names) into ``model``.

    Raises:
        ConfigError: not a state dict, or keys or shapes that are not the config's model
            (the first few named).
    """
    import zipfile

    if not Path(path).is_file() or not zipfile.is_zipfile(path):
        raise ConfigError(f"{path} is no PyTorch state dict (not a file torch.save writes)")
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as exc:  # torch raises many kinds for a file that is no checkpoint
        first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
        raise ConfigError(f"{path} is no PyTorch state dict: {first}") from None
    if not isinstance(state, dict):
        raise ConfigError(f"{path} holds a {type(state).__name__}, not a state dict")
    load_state_dict(model, state, str(path))


def load_state_dict(model: Dlrmv3, state: dict[str, Any], where: str) -> None:
    """Load ``state`` (the reference's key names, from ``where``) into ``model``; buffers the state
    leaves out keep their values.

    Raises:
        ConfigError: keys or shapes that are not the config's model (the first few named).
    """
    own = model.state_dict()
    buffers = {name for name, _ in model.named_buffers()}
    state = {**{k: v for k, v in own.items() if k in buffers and k not in state}, **state}
    missing = sorted(set(own) - set(state))
    unexpected = sorted(set(state) - set(own))
    if missing or unexpected:
        raise ConfigError(
            f"{where} does not match the config's DLRMv3: missing "
            f"{missing[:3]}{'...' if len(missing) > 3 else ''}, "
            f"unexpected {unexpected[:3]}{'...' if len(unexpected) > 3 else ''}"
        )
    for key, value in state.items():
        if tuple(value.shape) != tuple(own[key].shape):
            raise ConfigError(
                f"{where}: {key} is {list(value.shape)}, the config's model needs {list(own[key].shape)}"
            )
    model.load_state_dict({key: value.to(own[key].dtype) for key, value in state.items()})


def parameter_count(model: Dlrmv3) -> int:
    return sum(math.prod(p.shape) for p in model.parameters())


#: The narrowest padded history and candidate list :func:`pad_users` makes (torch.export
#: specialises dims of 0 and 1).
MIN_WIDTH = 2
#: The request's inputs, every one int64, in :meth:`Dlrmv3.forward`'s order after ``user_id``.
HISTORY_INPUTS = ("uih_item_id", "uih_category_id", "uih_timestamp", "uih_action_weight")
CANDIDATE_INPUTS = ("candidate_item_id", "candidate_category_id")


def fill_uniform(model: Dlrmv3, seed: int, scale: float) -> None:
    """Seeded random weights, rebuilt from numbers alone: every parameter in the sorted order of
    the ``state_dict``'s keys (buffers keep their values and take no draw) gets
    ``numpy.random.default_rng(seed).uniform(-scale, scale, shape)`` as float32, a table whose
    config says ``FP16`` rounded to float16 first (as the reference keeps it)."""
    import numpy as np

    rng = np.random.default_rng(seed)
    buffers = {name for name, _ in model.named_buffers()}
    half = {
        f"_embedding_collection.embeddings.{t.name}.weight"
        for t in model.config.tables
        if t.data_type == "FP16"
    }
    state = model.state_dict()
    with torch.no_grad():
        for key in sorted(state):
            if key in buffers:
                continue
            values = torch.from_numpy(
                rng.uniform(-scale, scale, size=tuple(state[key].shape)).astype(np.float32)
            )
            if key in half:
                values = values.half().float()
            state[key].copy_(values)


def pad_users(users: list[dict[str, Any]]) -> dict[str, torch.Tensor]:
    """One-user requests (``user_id`` and the lists of :data:`HISTORY_INPUTS` and
    :data:`CANDIDATE_INPUTS`) as :meth:`Dlrmv3.forward`'s padded batch."""
    count = len(users)
    # At least MIN_WIDTH wide (the rest is padding): an exported program's dims start there.
    longest = max([MIN_WIDTH, *(len(user["uih_item_id"]) for user in users)])
    most = max([MIN_WIDTH, *(len(user["candidate_item_id"]) for user in users)])
    batch = {"user_id": torch.tensor([int(user["user_id"]) for user in users], dtype=torch.int64)}
    for names, width, lengths in (
        (HISTORY_INPUTS, longest, "uih_lengths"),
        (CANDIDATE_INPUTS, most, "candidate_lengths"),
    ):
        for name in names:
            padded = torch.zeros(count, width, dtype=torch.int64)
            for row, user in enumerate(users):
                values = torch.as_tensor(list(user[name]), dtype=torch.int64)
                padded[row, : values.numel()] = values
            batch[name] = padded
        batch[lengths] = torch.tensor([len(user[names[0]]) for user in users], dtype=torch.int64)
    return batch


def write_random_dlrmv3(config_path: Path, out: Path, seed: int = 0, scale: float = 0.1) -> Path:
    """``config.json`` (the config as given) and ``model.pt`` (a ``state_dict`` with the reference's
    key names, tables in their config's data type) of a DLRMv3 with seeded random weights
    (:func:`fill_uniform`) in ``out``."""
    config = Dlrmv3Config.load(config_path)
    model = Dlrmv3(config)
    fill_uniform(model, seed, scale)
    state = model.state_dict()
    for table in config.tables:
        if table.data_type == "FP16":
            key = f"_embedding_collection.embeddings.{table.name}.weight"
            state[key] = state[key].half()
    out.mkdir(parents=True, exist_ok=True)
    (out / "config.json").write_text(json.dumps(config.raw, indent=1) + "\n")
    torch.save(state, out / "model.pt")
    return out / "model.pt"


def synthetic_users(
    config: Dlrmv3Config,
    count: int,
    seed: int = 0,
    history: tuple[int, int] | None = None,
    candidates: tuple[int, int] | None = None,
) -> list[dict[str, Any]]:
    """``count`` seeded users for ``config``'s tables: item ids of a Zipf-like popularity (a few
    items most users saw), each item's category fixed by its id, timestamps increasing from
    about 1.7e9 s by exponential gaps, action bitmasks drawn over ``action_weights``; history
    lengths uniform in ``history`` (default 0 to the model's limit) and candidates in
    ``candidates`` (default 1 to ``max_num_candidates_inference``)."""
    import numpy as np

    rng = np.random.default_rng(seed)
    items = config.table_of(config.post_id_feature).rows
    categories = config.table_of(config.category_feature).rows if config.category_feature is not None else 1
    users_rows = (
        config.table_of(config.contextual_max_length[0][0]).rows if config.contextual_max_length else 1
    )
    low_h, high_h = history or (0, config.max_uih_len)
    low_c, high_c = candidates or (1, config.max_num_candidates_inference)
    bits = np.asarray(config.action_weights or [1], dtype=np.int64)
    per_category = max(1, items // categories)

    def item_ids(size: int) -> np.ndarray:
        return np.minimum(rng.zipf(1.2, size) - 1, items - 1).astype(np.int64)

    users = []
    for _ in range(count):
        length = int(rng.integers(low_h, high_h + 1))
        chosen = int(rng.integers(low_c, high_c + 1))
        uih = item_ids(length)
        gaps = rng.exponential(3600.0, length).astype(np.int64) + 1
        stamps = 1_700_000_000 + int(rng.integers(0, 10_000_000)) + np.cumsum(gaps)
        actions = (rng.random((length, len(bits))) < 0.3).astype(np.int64) @ bits
        cands = item_ids(chosen)
        users.append(
            {
                "user_id": int(rng.integers(0, users_rows)),
                "uih_item_id": uih.tolist(),
                "uih_category_id": (np.minimum(uih // per_category, categories - 1)).tolist(),
                "uih_timestamp": stamps.tolist(),
                "uih_action_weight": actions.tolist(),
                "candidate_item_id": cands.tolist(),
                "candidate_category_id": (np.minimum(cands // per_category, categories - 1)).tolist(),
            }
        )
    return users


def write_users(
    config: Dlrmv3Config, out: Path, count: int, seed: int = 0, model: Dlrmv3 | None = None
) -> dict[str, float]:
    """A users file (JSON Lines, one user a line: :func:`synthetic_users`) with each task's label
    per candidate: drawn from ``model``'s own probability where a model is given (so a served
    model's AUC means something), else from a fixed rate of :data:`LABEL_RATE`; each task's
    positive rate."""
    import numpy as np

    users = synthetic_users(config, count, seed)
    rng = np.random.default_rng(seed + 1)
    positives = {task.name: 0 for task in config.tasks}
    total = 0
    out.parent.mkdir(parents=True, exist_ok=True)
    with open(out, "w", encoding="utf-8") as handle:
        for start in range(0, len(users), 64):
            chunk = users[start : start + 64]
            if model is not None:
                with torch.no_grad():
                    scores = model.eval()(**pad_users(chunk)).numpy()
            for row, user in enumerate(chunk):
                candidates = len(user["candidate_item_id"])
                labels = {}
                for task_index, task in enumerate(config.tasks):
                    rate = scores[row, :candidates, task_index] if model is not None else LABEL_RATE
                    drawn = (rng.random(candidates) < rate).astype(int).tolist()
                    labels[task.name] = drawn
                    positives[task.name] += sum(drawn)
                total += candidates
                handle.write(json.dumps({**user, "labels": labels}) + "\n")
    return {name: count / max(total, 1) for name, count in positives.items()}


#: The positive rate of a users file's labels without a model to draw them from.
LABEL_RATE = 0.25
