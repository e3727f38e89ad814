"""Test-only PyTorch models in the layouts users bring (no import from ``export``).

Written from the source codebases' published structure, so the importers in
:mod:`export.importers.dlrm_sources` are checked against modules they did not build:

- :class:`FacebookDLRMNet`: facebookresearch/dlrm ``DLRM_Net`` (``emb_l`` of
  ``nn.EmbeddingBag`` tables of different sizes, ``bot_l``/``top_l`` MLPs of
  Linear at even indices, ReLU between and a Sigmoid after the last top layer;
  interaction ``dot`` over the lower triangle, with or without the diagonal,
  or ``cat``), with its ``forward(dense_x, lS_o, lS_i)``.
- :class:`TorchRecDLRM`: TorchRec's ``DLRM`` parameter layout
  (``sparse_arch.embedding_bag_collection.embedding_bags.<table>``,
  ``dense_arch.model._mlp.<i>._linear``, ``over_arch.model.0._mlp.<i>._linear``
  and ``over_arch.model.1``), the upper-triangle interaction, logits out.
- :class:`FacebookAdapter`: the serving contract ``forward(dense [B,13],
  ids [B,26]) -> [B,1]`` around a ``FacebookDLRMNet`` (for TorchScript,
  ``torch.export`` and ``--factory``).
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import torch
from torch import nn

NUM_DENSE = 13
NUM_TABLES = 26
#: Rows of the 26 tables (different sizes, 3..2000), C1..C26.
TABLE_SIZES: tuple[int, ...] = (
    3, 2000, 17, 450, 5, 1200, 64, 9, 333, 1000, 7, 88, 1500,
    4, 250, 40, 11, 777, 6, 120, 2000, 3, 901, 30, 15, 600,
)  # fmt: skip
DIM = 4
BOTTOM = (8, DIM)
TOP = (16, 8, 1)
#: TorchRec table names, in the state dict's (interaction) order.
TORCHREC_TABLES: tuple[str, ...] = tuple(f"t_cat_{i}" for i in range(NUM_TABLES))
#: A --feature-order that is not the identity: column C(k+1) reads table TORCHREC_TABLES[ORDER[k]].
TORCHREC_ORDER: tuple[int, ...] = tuple((i * 7 + 3) % NUM_TABLES for i in range(NUM_TABLES))
#: Environment variable naming the checkpoint whose weights the --factory model loads.
FACTORY_ENV = "BYOM_FACTORY_CHECKPOINT"


def _fb_mlp(widths: list[int], sigmoid_layer: int) -> nn.Sequential:
    """facebookresearch's ``create_mlp``: Linear, then Sigmoid at ``sigmoid_layer`` else ReLU."""
    layers: list[nn.Module] = []
    for i in range(len(widths) - 1):
        linear = nn.Linear(widths[i], widths[i + 1], bias=True)
        with torch.no_grad():
            linear.weight.normal_(0.0, float(np.sqrt(2 / (widths[i] + widths[i + 1]))))
            linear.bias.normal_(0.0, float(np.sqrt(1 / widths[i + 1])))
        layers.append(linear)
        layers.append(nn.Sigmoid() if i == sigmoid_layer else nn.ReLU())
    return nn.Sequential(*layers)


class FacebookDLRMNet(nn.Module):
    """facebookresearch/dlrm ``DLRM_Net`` (no QR/MD embeddings, no weighted pooling).

    Args:
        sizes: rows of each table.
        dim: embedding width ``D`` (= the bottom MLP's output for ``dot``).
        bottom: bottom MLP widths after the 13 inputs.
        top: top MLP widths after the interaction (last 1).
        interaction: ``dot`` or ``cat``.
        itself: ``dot`` keeps the diagonal (``--arch-interaction-itself``).
    """

    def __init__(
        self,
        sizes: tuple[int, ...] = TABLE_SIZES,
        dim: int = DIM,
        bottom: tuple[int, ...] = BOTTOM,
        top: tuple[int, ...] = TOP,
        interaction: str = "dot",
        itself: bool = False,
    ) -> None:
        super().__init__()
        self.arch_interaction_op = interaction
        self.arch_interaction_itself = itself
        self.emb_l = nn.ModuleList()
        for n in sizes:
            bag = nn.EmbeddingBag(n, dim, mode="sum", sparse=True)
            with torch.no_grad():
                bag.weight.uniform_(-float(np.sqrt(1 / n)), float(np.sqrt(1 / n)))
            self.emb_l.append(bag)
        self.bot_l = _fb_mlp([NUM_DENSE, *bottom], -1)
        vectors = len(sizes) + 1
        if interaction == "dot":
            pairs = vectors * (vectors + 1) // 2 if itself else vectors * (vectors - 1) // 2
            width = bottom[-1] + pairs
        else:
            width = bottom[-1] + len(sizes) * dim
        self.top_l = _fb_mlp([width, *top], len(top) - 1)

    def interact_features(self, x: torch.Tensor, ly: list[torch.Tensor]) -> torch.Tensor:
        if self.arch_interaction_op == "dot":
            (batch_size, d) = x.shape
            T = torch.cat([x, *ly], dim=1).view((batch_size, -1, d))
            Z = torch.bmm(T, torch.transpose(T, 1, 2))
            _, ni, _ = Z.shape
            offset = 1 if self.arch_interaction_itself else 0
            li = torch.tensor([i for i in range(ni) for j in range(i + offset)])
            lj = torch.tensor([j for i in range(ni) for j in range(i + offset)])
            Zflat = Z[:, li, lj]
            return torch.cat([x, Zflat], dim=1)
        return torch.cat([x, *ly], dim=1)

    def forward(self, dense_x: torch.Tensor, lS_o: torch.Tensor, lS_i: list[torch.Tensor]) -> torch.Tensor:
        x = self.bot_l(dense_x)
        ly = [self.emb_l[k](lS_i[k], lS_o[k]) for k in range(len(self.emb_l))]
        return self.top_l(self.interact_features(x, ly))


class FacebookAdapter(nn.Module):
    """``forward(dense B x 13, ids B x 26) -> B x 1`` around a :class:`FacebookDLRMNet`.

    Ids must be in range (the net does not reduce them); one id per bag
    (``offsets = arange(B)``), as facebookresearch's data loader gives.
    """

    def __init__(self, net: FacebookDLRMNet) -> None:
        super().__init__()
        self.net = net

    def forward(self, dense: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
        batch = ids.shape[0]
        offsets = torch.arange(batch).unsqueeze(0).expand(ids.shape[1], batch)
        return self.net(dense, offsets, [ids[:, k] for k in range(ids.shape[1])])


class _Perceptron(nn.Module):
    def __init__(self, width_in: int, width_out: int) -> None:
        super().__init__()
        self._linear = nn.Linear(width_in, width_out)
        self._activation_fn = nn.ReLU()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self._activation_fn(self._linear(x))


class _MLP(nn.Module):
    def __init__(self, width_in: int, widths: tuple[int, ...]) -> None:
        super().__init__()
        layers = []
        for width in widths:
            layers.append(_Perceptron(width_in, width))
            width_in = width
        self._mlp = nn.Sequential(*layers)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self._mlp(x)


class _Wrapped(nn.Module):
    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.model = model


class _EBC(nn.Module):
    def __init__(self, sizes: dict[str, int], dim: int) -> None:
        super().__init__()
        self.embedding_bags = nn.ModuleDict(
            {name: nn.EmbeddingBag(n, dim, mode="sum") for name, n in sizes.items()}
        )


class _SparseArch(nn.Module):
    def __init__(self, sizes: dict[str, int], dim: int) -> None:
        super().__init__()
        self.embedding_bag_collection = _EBC(sizes, dim)


class TorchRecDLRM(nn.Module):
    """TorchRec ``DLRM``'s parameter layout and computation (logits out).

    ``forward(dense B x 13, features {table: B ids})``: the interaction stacks
    ``[dense, table_0, ..., table_25]`` in the state dict's table order and
    keeps the upper triangle of their dot products, row-major.
    """

    def __init__(
        self,
        sizes: dict[str, int],
        dim: int = DIM,
        dense: tuple[int, ...] = BOTTOM,
        over: tuple[int, ...] = TOP,
    ) -> None:
        super().__init__()
        self.sparse_arch = _SparseArch(sizes, dim)
        self.dense_arch = _Wrapped(_MLP(NUM_DENSE, dense))
        vectors = len(sizes) + 1
        width = dense[-1] + vectors * (vectors - 1) // 2
        self.over_arch = _Wrapped(nn.Sequential(_MLP(width, over[:-1]), nn.Linear(over[-2], over[-1])))
        with torch.no_grad():
            for p in self.parameters():
                p.normal_(0.0, 0.3)

    def forward(self, dense: torch.Tensor, features: dict[str, torch.Tensor]) -> torch.Tensor:
        x = self.dense_arch.model(dense)
        batch = dense.shape[0]
        offsets = torch.arange(batch)
        bags = self.sparse_arch.embedding_bag_collection.embedding_bags
        sparse = torch.stack([bags[name](features[name], offsets) for name in bags], dim=1)
        combined = torch.cat((x.unsqueeze(1), sparse), dim=1)
        z = torch.bmm(combined, combined.transpose(1, 2))
        rows, cols = torch.triu_indices(combined.shape[1], combined.shape[1], offset=1)
        return self.over_arch.model(torch.cat((x, z[:, rows, cols]), dim=1))


def torchrec_sizes() -> dict[str, int]:
    """Table name -> rows: ``TORCHREC_TABLES[TORCHREC_ORDER[k]]`` serves C(k+1), ``TABLE_SIZES[k]`` rows."""
    sizes = {}
    for name_index in range(NUM_TABLES):
        column = TORCHREC_ORDER.index(name_index)
        sizes[TORCHREC_TABLES[name_index]] = TABLE_SIZES[column]
    return sizes


def torchrec_feature_order() -> tuple[str, ...]:
    """``--feature-order``: the table of C1..C26."""
    return tuple(TORCHREC_TABLES[index] for index in TORCHREC_ORDER)


def torchrec_logits(model: TorchRecDLRM, dense: np.ndarray, ids: np.ndarray) -> np.ndarray:
    """``model``'s logits for in-range ``ids`` (B x 26, column k read by table ``feature_order[k]``)."""
    order = torchrec_feature_order()
    features = {order[k]: torch.from_numpy(ids[:, k].copy()) for k in range(NUM_TABLES)}
    with torch.no_grad():
        return model(torch.from_numpy(dense), features).numpy()


def facebook_probabilities(net: FacebookDLRMNet, dense: np.ndarray, ids: np.ndarray) -> np.ndarray:
    """``net``'s probabilities (its own forward, offsets and per-table id lists) for in-range ids."""
    batch = ids.shape[0]
    offsets = torch.arange(batch).repeat(NUM_TABLES, 1)
    with torch.no_grad():
        out = net(
            torch.from_numpy(dense), offsets, [torch.from_numpy(ids[:, k].copy()) for k in range(NUM_TABLES)]
        )
    return out.numpy()


def in_range(ids: np.ndarray, sizes: tuple[int, ...] = TABLE_SIZES) -> np.ndarray:
    """``ids`` reduced into the tables as the exported graphs do: ``ids mod size``, non-negative."""
    return np.mod(ids, np.asarray(sizes, dtype=np.int64)).astype(np.int64)


def make_facebook_net(seed: int = 0, **kwargs: object) -> FacebookDLRMNet:
    """A seeded :class:`FacebookDLRMNet` in eval mode."""
    torch.manual_seed(seed)
    return FacebookDLRMNet(**kwargs).eval()  # type: ignore[arg-type]


def save_facebook_checkpoint(net: FacebookDLRMNet, path: Path, bare: bool = False) -> Path:
    """Write ``net`` as ``dlrm_s_pytorch.py --save-model`` does (or its bare state dict)."""
    if bare:
        torch.save(net.state_dict(), path)
        return path
    optimizer = torch.optim.SGD(net.parameters(), lr=0.1)
    torch.save(
        {
            "epoch": 0,
            "nepochs": 1,
            "nbatches": 100,
            "nbatches_test": 10,
            "iter": 100,
            "state_dict": net.state_dict(),
            # facebookresearch computes these with numpy: the checkpoint pickles numpy scalars.
            "train_acc": np.float64(0.75),
            "train_loss": np.float32(0.5),
            "test_acc": np.float64(0.74),
            "opt_state_dict": optimizer.state_dict(),
        },
        path,
    )
    return path


def build_factory_model() -> nn.Module:
    """The ``--factory tests.byom_torch:build_factory_model`` entry point: a :class:`FacebookAdapter`
    (``nn.EmbeddingBag`` tables, one id per bag) with the weights of the checkpoint that the
    environment variable :data:`FACTORY_ENV` names (seeded random weights without it)."""
    net = make_facebook_net()
    checkpoint = os.environ.get(FACTORY_ENV)
    if checkpoint:
        state = torch.load(checkpoint, map_location="cpu", weights_only=False)
        net.load_state_dict(state.get("state_dict", state))
    return FacebookAdapter(net.eval()).eval()
