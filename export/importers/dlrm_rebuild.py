"""The modules rebuilt from a :class:`export.importers.dlrm_layouts.DLRMLayout`: the one the export
writes, and each source codebase's own forward for the parity check.

- :class:`GatherDLRM`, written to ONNX: the 26 tables stacked into one
  ``nn.Embedding`` so that the lookup is one ``Mod`` (ids reduced into their
  tables), one ``Add`` and one ``Gather`` (``nn.EmbeddingBag`` would export to a
  slow ``Loop``), and the interaction as one ``MatMul`` and one constant
  ``Gather`` of the kept pairs, under the submodule ``interaction`` (the FP16
  variant keeps it FP32 by that name).
- :class:`FacebookReference` and :class:`TorchRecReference`, the parity check's
  reference: the source's own parameter layout (``load_state_dict(strict=True)``)
  and computation, written as that codebase writes it (``nn.EmbeddingBag`` with
  offsets, facebookresearch's lower-triangle pair lists and the Sigmoid inside its
  top MLP, TorchRec's ``triu_indices`` and logits), so the export compares two
  different computations of the same weights.

Imports torch at the top: import this module inside the functions that need it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import cast

import torch
from torch import nn

from bundle.errors import ExportError
from bundle.schema import NUM_CATEGORICAL, NUM_DENSE
from criteo.tables import table_offsets
from export.importers.dlrm_layouts import TORCHREC_TABLES, DLRMLayout


def _linear_stack(widths: Sequence[int], width_in: int, relu_last: bool) -> nn.Sequential:
    """Linear layers of ``widths``, ReLU between (and after the last if ``relu_last``)."""
    layers: list[nn.Module] = []
    for i, width in enumerate(widths):
        layers.append(nn.Linear(width_in, width))
        if relu_last or i < len(widths) - 1:
            layers.append(nn.ReLU())
        width_in = width
    return nn.Sequential(*layers)


def table_key(layout: DLRMLayout, name: str) -> str:
    return f"{name}.weight" if layout.codebase == "facebookresearch" else f"{TORCHREC_TABLES}{name}.weight"


def _mlp_keys(layout: DLRMLayout) -> tuple[list[str], list[str]]:
    """State dict key prefixes of the bottom and top Linear layers, in order."""
    if layout.codebase == "facebookresearch":
        bottom = [f"bot_l.{2 * i}" for i in range(len(layout.bottom))]
        return bottom, [f"top_l.{2 * i}" for i in range(len(layout.top))]
    hidden = [f"over_arch.model.0._mlp.{i}._linear" for i in range(len(layout.top) - 1)]
    return [f"dense_arch.model._mlp.{i}._linear" for i in range(len(layout.bottom))], [
        *hidden,
        "over_arch.model.1",
    ]


def _load_linears(stack: nn.Sequential, state: Mapping[str, torch.Tensor], keys: Sequence[str]) -> None:
    """Copy the weight and bias of each of ``keys`` into the Linear layers of ``stack``, in order."""
    linears = [m for m in stack if isinstance(m, nn.Linear)]
    with torch.no_grad():
        for linear, key in zip(linears, keys, strict=True):
            linear.weight.copy_(state[f"{key}.weight"])
            linear.bias.copy_(state[f"{key}.bias"])


class PairInteraction(nn.Module):
    """``[x, Z_pairs]``: the dense vector, then the kept dot products of ``V = [x, e_1..e_26]``.

    Args:
        pairs: the ``(i, j)`` entries of ``Z = V V^T`` to keep, in output order.

    Shapes:
        dense ``B x D``, embedded ``B x 26 x D`` -> ``B x (D + P)``.
    """

    pair_index: torch.Tensor

    def __init__(self, pairs: Sequence[tuple[int, int]]) -> None:
        super().__init__()
        vectors = NUM_CATEGORICAL + 1
        # Indices into the flattened F x F matrix: one constant Gather in ONNX.
        flat = torch.tensor([i * vectors + j for i, j in pairs], dtype=torch.int64)
        self.register_buffer("pair_index", flat, persistent=False)

    def forward(self, dense: torch.Tensor, embedded: torch.Tensor) -> torch.Tensor:
        vectors = torch.cat([dense.unsqueeze(1), embedded], dim=1)
        products = torch.bmm(vectors, vectors.transpose(1, 2))
        return torch.cat([dense, products.flatten(1).index_select(1, self.pair_index)], dim=1)


class CrossInteraction(nn.Module):
    """TorchRec's ``LowRankCrossNet`` over ``x0 = [x, e_1..e_26]``: ``x = x0 * (W_l (V_l x) + b_l) + x``.

    Each layer is two ``MatMul`` and an ``Add``/``Mul``/``Add`` in ONNX: no ``Loop``.

    Args:
        state: the state dict (``inter_arch.crossnet.{V_kernels,W_kernels,bias}.<l>``).
        layers: the cross layers.

    Shapes:
        dense ``B x D``, embedded ``B x 26 x D`` -> ``B x 27D``.
    """

    def __init__(self, state: Mapping[str, torch.Tensor], layers: int) -> None:
        super().__init__()
        prefix = "inter_arch.crossnet"
        # Transposed once here, so that each layer is x @ V^T @ W^T as two plain MatMuls.
        self.v_t = nn.ParameterList(
            nn.Parameter(state[f"{prefix}.V_kernels.{i}"].float().t().contiguous(), requires_grad=False)
            for i in range(layers)
        )
        self.w_t = nn.ParameterList(
            nn.Parameter(state[f"{prefix}.W_kernels.{i}"].float().t().contiguous(), requires_grad=False)
            for i in range(layers)
        )
        self.bias = nn.ParameterList(
            nn.Parameter(state[f"{prefix}.bias.{i}"].float().reshape(-1).clone(), requires_grad=False)
            for i in range(layers)
        )

    def forward(self, dense: torch.Tensor, embedded: torch.Tensor) -> torch.Tensor:
        x0 = torch.cat([dense, embedded.flatten(1)], dim=1)
        x = x0
        for v_t, w_t, bias in zip(self.v_t, self.w_t, self.bias, strict=True):
            x = x0 * (torch.matmul(torch.matmul(x, v_t), w_t) + bias) + x
        return x


class ConcatInteraction(nn.Module):
    """``[x, e_1, .., e_26]``. Shapes: ``B x D'``, ``B x 26 x D`` -> ``B x (D' + 26 D)``."""

    def forward(self, dense: torch.Tensor, embedded: torch.Tensor) -> torch.Tensor:
        return torch.cat([dense, embedded.flatten(1)], dim=1)


class GatherDLRM(nn.Module):
    """The rebuilt DLRM the export writes: ``p = sigmoid(top(interaction(bottom(dense), E[ids])))``.

    The tables are stacked into one ``nn.Embedding`` (table ``t``'s rows start
    at ``offsets[t]``); ids of any int64 value are reduced into ``sizes`` first.

    With ``hotness``, each table looks up a bag of ids and sums their rows
    (``EmbeddingBag(mode="sum")`` with fixed bags): the ids are ``B x H``, C1's bag
    first, and the pooling is a ``Split`` and one ``ReduceSum`` per table.

    Args:
        layout: from :func:`read_layout`.
        state: the state dict without wrapper prefixes.
        sizes: rows to reduce each table's ids into (at most its rows), in table order.
        hotness: ids per bag of C1..C26 (None: one id each).

    Shapes:
        dense ``B x 13`` float32, ids ``B x 26`` (``B x H`` multi-hot) int64 (C1..C26, any
        value) -> ``B x 1`` float32.
    """

    columns: torch.Tensor
    sizes: torch.Tensor
    offsets: torch.Tensor

    def __init__(
        self,
        layout: DLRMLayout,
        state: Mapping[str, torch.Tensor],
        sizes: Sequence[int],
        hotness: Sequence[int] | None = None,
    ) -> None:
        super().__init__()
        tables = [state[table_key(layout, name)].float() for name in layout.tables]
        self.embedding = nn.Embedding.from_pretrained(torch.cat(tables), freeze=True)
        starts = table_offsets(layout.rows)
        # Each input column's position, in table order: table t reads the bag of C<columns[t] + 1>.
        counts = list(hotness) if hotness is not None else [1] * NUM_CATEGORICAL
        bag_start = table_offsets(counts)
        positions = [bag_start[c] + k for c in layout.columns for k in range(counts[c])]
        #: Ids per table, in table order (the pooling's split).
        self.bag_sizes = [counts[c] for c in layout.columns]
        per_position = [
            (size, start)
            for size, start, h in zip(sizes, starts, self.bag_sizes, strict=True)
            for _ in range(h)
        ]
        self.register_buffer("columns", torch.tensor(positions, dtype=torch.int64), persistent=False)
        self.register_buffer(
            "sizes", torch.tensor([[p[0] for p in per_position]], dtype=torch.int64), persistent=False
        )
        self.register_buffer(
            "offsets", torch.tensor([[p[1] for p in per_position]], dtype=torch.int64), persistent=False
        )
        self.permuted = positions != list(range(len(positions)))
        self.multi_hot = any(h > 1 for h in counts)
        # For bags of any size (:meth:`pool_bags`), per input column (C1..C26): the table it
        # feeds, that table's rows to reduce into, and its first row.
        table_of = [layout.columns.index(c) for c in range(NUM_CATEGORICAL)]
        self.register_buffer("bag_table", torch.tensor(table_of, dtype=torch.int64), persistent=False)
        self.register_buffer(
            "bag_sizes_of", torch.tensor([sizes[t] for t in table_of], dtype=torch.int64), persistent=False
        )
        self.register_buffer(
            "bag_offsets_of", torch.tensor([starts[t] for t in table_of], dtype=torch.int64), persistent=False
        )
        self.bottom_mlp = _linear_stack(layout.bottom, NUM_DENSE, relu_last=True)
        if layout.interaction == "dot":
            self.interaction: nn.Module = PairInteraction(layout.pairs())
        elif layout.interaction == "dcn":
            self.interaction = CrossInteraction(state, layout.cross_layers)
        else:
            self.interaction = ConcatInteraction()
        self.top_mlp = _linear_stack(layout.top, layout.interaction_width, relu_last=False)
        bottom_keys, top_keys = _mlp_keys(layout)
        _load_linears(self.bottom_mlp, state, bottom_keys)
        _load_linears(self.top_mlp, state, top_keys)

    bag_table: torch.Tensor
    bag_sizes_of: torch.Tensor
    bag_offsets_of: torch.Tensor

    def pool_bags(self, values: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
        """Each bag's rows summed: ``N`` values and ``B x 26`` lengths -> ``B x 26 x D`` (table order).

        No ``Loop``: each value's bag is a running count of the bag ends before it
        (``CumSum`` over ones scattered at the ends), its rows one ``Gather``, and the sums one
        ``ScatterElements`` with ``add``. An empty bag sums to zeros, as ``EmbeddingBag`` does.

        Inputs that do not fit are refused, never answered: an index out of range is an error
        in ``ScatterElements`` (ONNX Runtime checks every index), and the inputs are made to
        produce one when the lengths add up to more than the values (a bag end past them),
        to fewer (values left over fall in bag ``B x 26``, past the sums) or hold a negative
        length (every bag end is moved past the values).
        """
        flat = lengths.reshape(-1)
        count = values.shape[0]
        negative = (flat < 0).any().to(torch.int64)
        ends = torch.cumsum(flat, 0) + negative * (count + 2)
        marks = torch.zeros(count + 1, dtype=torch.int64).scatter_add(0, ends, torch.ones_like(ends))
        bag = torch.cumsum(marks[:count], 0)
        column = torch.remainder(bag, NUM_CATEGORICAL)
        rows = torch.remainder(values, self.bag_sizes_of[column]) + self.bag_offsets_of[column]
        embedded = self.embedding(rows)
        target = bag - column + self.bag_table[column]
        pooled = torch.zeros(flat.shape[0], embedded.shape[1], dtype=embedded.dtype)
        pooled = pooled.scatter_add(0, target.unsqueeze(1).expand(-1, embedded.shape[1]), embedded)
        return pooled.reshape(lengths.shape[0], NUM_CATEGORICAL, embedded.shape[1])

    def logits(
        self, dense: torch.Tensor, ids: torch.Tensor, lengths: torch.Tensor | None = None
    ) -> torch.Tensor:
        """The ``B x 1`` logits (the TorchScript variant applies the sigmoid in FP32 itself).

        With variable bags ``ids`` are the ``N`` values and ``lengths`` the ``B x 26`` bag sizes."""
        if lengths is not None:
            x = self.bottom_mlp(dense)
            return cast(torch.Tensor, self.top_mlp(self.interaction(x, self.pool_bags(ids, lengths))))
        in_table_order = ids.index_select(1, self.columns) if self.permuted else ids
        # remainder takes the divisor's sign: negative and huge ids land in [0, rows).
        rows = torch.remainder(in_table_order, self.sizes) + self.offsets
        embedded = self.embedding(rows)
        if self.multi_hot:
            # Each table's bag summed (EmbeddingBag's mode="sum"): one Split and a ReduceSum per
            # table in ONNX, no Loop.
            bags = torch.split(embedded, self.bag_sizes, dim=1)
            embedded = torch.stack([bag.sum(dim=1) for bag in bags], dim=1)
        x = self.bottom_mlp(dense)
        return cast(torch.Tensor, self.top_mlp(self.interaction(x, embedded)))

    def forward(
        self, dense: torch.Tensor, ids: torch.Tensor, lengths: torch.Tensor | None = None
    ) -> torch.Tensor:
        return torch.sigmoid(self.logits(dense, ids, lengths))


def _fb_mlp(widths: Sequence[int], width_in: int, sigmoid_last: bool) -> nn.Sequential:
    """facebookresearch's ``create_mlp``: Linear then ReLU, the last top layer's Sigmoid instead."""
    layers: list[nn.Module] = []
    for i, width in enumerate(widths):
        layers.append(nn.Linear(width_in, width, bias=True))
        layers.append(nn.Sigmoid() if sigmoid_last and i == len(widths) - 1 else nn.ReLU())
        width_in = width
    return nn.Sequential(*layers)


class FacebookReference(nn.Module):
    """facebookresearch/dlrm ``DLRM_Net``: its parameter layout and its forward
    (``apply_emb`` with ``nn.EmbeddingBag`` and offsets, ``interact_features``).

    Shapes:
        ``forward(dense_x B x 13, lS_o 26 x B offsets, lS_i 26 x (B,) ids)`` -> ``B x 1`` probabilities.
    """

    def __init__(self, layout: DLRMLayout, top_in: int) -> None:
        super().__init__()
        self.layout = layout
        self.emb_l = nn.ModuleList(nn.EmbeddingBag(rows, layout.dim, mode="sum") for rows in layout.rows)
        self.bot_l = _fb_mlp(layout.bottom, NUM_DENSE, sigmoid_last=False)
        self.top_l = _fb_mlp(layout.top, top_in, sigmoid_last=True)

    def interact_features(self, x: torch.Tensor, ly: list[torch.Tensor]) -> torch.Tensor:
        if self.layout.interaction != "dot":
            return torch.cat([x, *ly], dim=1)
        batch_size, d = x.shape
        t = torch.cat([x, *ly], dim=1).view((batch_size, -1, d))
        z = torch.bmm(t, torch.transpose(t, 1, 2))
        _, ni, _ = z.shape
        offset = 1 if self.layout.self_interaction else 0
        li = torch.tensor([i for i in range(ni) for j in range(i + offset)])
        lj = torch.tensor([j for i in range(ni) for j in range(i + offset)])
        return torch.cat([x, z[:, li, lj]], dim=1)

    def forward(self, dense_x: torch.Tensor, ls_o: torch.Tensor, ls_i: list[torch.Tensor]) -> torch.Tensor:
        x = self.bot_l(dense_x)
        ly = [bag(ls_i[k], ls_o[k]) for k, bag in enumerate(self.emb_l)]
        return cast(torch.Tensor, self.top_l(self.interact_features(x, ly)))


class _Perceptron(nn.Module):
    """TorchRec's ``Perceptron``: ``relu(_linear(x))``."""

    def __init__(self, width_in: int, width: int) -> None:
        super().__init__()
        self._linear = nn.Linear(width_in, width, bias=True)
        self._activation_fn = nn.ReLU()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return cast(torch.Tensor, self._activation_fn(self._linear(x)))


class _MLP(nn.Module):
    """TorchRec's ``MLP``: ``_mlp``, a Sequential of :class:`_Perceptron`."""

    def __init__(self, width_in: int, widths: Sequence[int]) -> None:
        super().__init__()
        layers = []
        for width in widths:
            layers.append(_Perceptron(width_in, width))
            width_in = width
        self._mlp = nn.Sequential(*layers)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return cast(torch.Tensor, self._mlp(x))


class _Holder(nn.Module):
    """A parent that only names its children (TorchRec's arch wrappers, for their key paths)."""

    def __init__(self, **children: nn.Module) -> None:
        super().__init__()
        for name, child in children.items():
            self.add_module(name, child)


class _LowRankCrossNet(nn.Module):
    """TorchRec's ``LowRankCrossNet``: ``W_kernels``, ``V_kernels`` and ``bias`` parameter lists,
    ``x_l = x_0 * (W(V(x_l)) + b) + x_l`` with ``torch.nn.functional.linear`` as TorchRec writes it."""

    def __init__(self, width: int, layers: int, rank: int, bias_column: bool) -> None:
        super().__init__()
        bias_shape = (width, 1) if bias_column else (width,)
        self.W_kernels = nn.ParameterList(nn.Parameter(torch.empty(width, rank)) for _ in range(layers))
        self.V_kernels = nn.ParameterList(nn.Parameter(torch.empty(rank, width)) for _ in range(layers))
        self.bias = nn.ParameterList(nn.Parameter(torch.empty(bias_shape)) for _ in range(layers))

    def forward(self, x_0: torch.Tensor) -> torch.Tensor:
        x_l = x_0
        for w, v, b in zip(self.W_kernels, self.V_kernels, self.bias, strict=True):
            x_l_v = nn.functional.linear(x_l, v)
            x_l_w = nn.functional.linear(x_l_v, w)
            x_l = x_0 * (x_l_w + b.reshape(-1)) + x_l
        return x_l


class TorchRecReference(nn.Module):
    """TorchRec ``DLRM`` or ``DLRM_DCN``: its parameter layout and forward (``DenseArch``,
    ``SparseArch``, ``InteractionArch`` over the upper triangle or ``InteractionDCNArch``'s
    cross net, ``OverArch``), logits out.

    Shapes:
        ``forward(dense B x 13, {table: (B,) ids})`` -> ``B x 1`` logits.
    """

    def __init__(self, layout: DLRMLayout) -> None:
        super().__init__()
        self.layout = layout
        bags = nn.ModuleDict(
            {
                name: nn.EmbeddingBag(rows, layout.dim, mode="sum")
                for name, rows in zip(layout.tables, layout.rows, strict=True)
            }
        )
        over_in = layout.interaction_width
        hidden = layout.top[:-1]
        final = nn.Linear(hidden[-1] if hidden else over_in, layout.top[-1], bias=True)
        self.sparse_arch = _Holder(embedding_bag_collection=_Holder(embedding_bags=bags))
        self.dense_arch = _Holder(model=_MLP(NUM_DENSE, layout.bottom))
        self.over_arch = _Holder(model=nn.Sequential(_MLP(over_in, hidden), final))
        if layout.interaction == "dcn":
            crossnet = _LowRankCrossNet(
                over_in, layout.cross_layers, layout.cross_rank, layout.cross_bias_column
            )
            self.inter_arch = _Holder(crossnet=crossnet)

    def forward(
        self, dense: torch.Tensor, features: dict[str, tuple[torch.Tensor, torch.Tensor]]
    ) -> torch.Tensor:
        """``features``: table -> (its ids, flat, bag after bag; each bag's first index)."""
        batch = dense.shape[0]
        bags = cast(nn.ModuleDict, self.sparse_arch.get_submodule("embedding_bag_collection.embedding_bags"))
        embedded_dense = self.dense_arch.get_submodule("model")(dense)
        pooled = [bags[name](*features[name]) for name in self.layout.tables]
        sparse = torch.cat(pooled, dim=1).reshape(batch, len(pooled), self.layout.dim)
        combined = torch.cat((embedded_dense.unsqueeze(1), sparse), dim=1)
        if self.layout.interaction == "dcn":
            crossed = self.inter_arch.get_submodule("crossnet")(combined.reshape(batch, -1))
            return cast(torch.Tensor, self.over_arch.get_submodule("model")(crossed))
        interactions = torch.bmm(combined, torch.transpose(combined, 1, 2))
        triu = torch.triu_indices(len(pooled) + 1, len(pooled) + 1, offset=1)
        flat = interactions[:, triu[0], triu[1]]
        return cast(
            torch.Tensor, self.over_arch.get_submodule("model")(torch.cat((embedded_dense, flat), dim=1))
        )


def reference_module(layout: DLRMLayout, state: Mapping[str, torch.Tensor]) -> nn.Module:
    """The source codebase's own module with ``state`` loaded (strict; tensors shared, not copied).

    Raises:
        ExportError: the state dict does not load into that layout.
    """
    module: nn.Module
    if layout.codebase == "facebookresearch":
        module = FacebookReference(layout, int(state["top_l.0.weight"].shape[1]))
    else:
        module = TorchRecReference(layout)
    try:
        module.load_state_dict(dict(state), strict=True, assign=True)
    except RuntimeError as exc:
        first = str(exc).strip().splitlines()[0]
        raise ExportError(
            f"the {layout.codebase} state dict does not load into its own layout: {first}"
        ) from None
    return module.eval()


def reference_probabilities(
    layout: DLRMLayout,
    module: nn.Module,
    dense: torch.Tensor,
    ids: torch.Tensor,
    hotness: Sequence[int] | None = None,
) -> torch.Tensor:
    """The source's probabilities for in-range ``ids``: ``B x 1``.

    Args:
        layout: the checkpoint's layout.
        module: from :func:`reference_module`.
        dense: ``B x 13`` float32.
        ids: ``B x 26`` int64 (``B x H`` with ``hotness``: C1's bag first), already inside
            each column's table.
        hotness: ids per bag of C1..C26 (None: one id each).
    """
    import torch

    batch = dense.shape[0]
    counts = list(hotness) if hotness is not None else [1] * NUM_CATEGORICAL
    starts = table_offsets(counts)
    # Each table's bags as EmbeddingBag takes them: the ids flat, bag after bag, and each bag's start.
    per_table = [
        ids[:, starts[column] : starts[column] + counts[column]].reshape(-1).contiguous()
        for column in layout.columns
    ]
    offsets = [torch.arange(batch) * counts[column] for column in layout.columns]
    return _reference_forward(layout, module, dense, per_table, offsets)


def reference_bag_probabilities(
    layout: DLRMLayout, module: nn.Module, dense: torch.Tensor, values: torch.Tensor, lengths: torch.Tensor
) -> torch.Tensor:
    """The source's probabilities for bags of any size: ``B x 1``.

    Args:
        layout: the checkpoint's layout.
        module: from :func:`reference_module`.
        dense: ``B x 13`` float32.
        values: ``N`` int64 ids, already inside each column's table: row after row, C1's bag first.
        lengths: ``B x 26`` int64 bag sizes (0: empty).
    """
    batch = dense.shape[0]
    columns = torch.arange(NUM_CATEGORICAL).repeat(batch).repeat_interleave(lengths.reshape(-1))
    per_table, offsets = [], []
    for column in layout.columns:
        per_table.append(values[columns == column].contiguous())
        sizes = lengths[:, column]
        offsets.append(torch.cumsum(sizes, 0) - sizes)
    return _reference_forward(layout, module, dense, per_table, offsets)


def _reference_forward(
    layout: DLRMLayout,
    module: nn.Module,
    dense: torch.Tensor,
    per_table: list[torch.Tensor],
    offsets: list[torch.Tensor],
) -> torch.Tensor:
    """The source module's probabilities for each table's bags as ``EmbeddingBag`` takes them: the
    ids flat, bag after bag (``per_table``, in table order) and each bag's first index (``offsets``)."""
    with torch.no_grad():
        if layout.codebase == "facebookresearch":
            return cast(torch.Tensor, module(dense, torch.stack(offsets), per_table))
        features = {
            name: (flat, start) for name, flat, start in zip(layout.tables, per_table, offsets, strict=True)
        }
        return torch.sigmoid(module(dense, features))
