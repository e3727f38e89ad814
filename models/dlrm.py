"""DLRM in PyTorch: bottom MLP, embeddings, an interaction, top MLP.

The architecture follows the reference DLRM (Naumov et al., 2019) and its
initialisation, with its dot interaction, or DLRM-DCNv2 (TorchRec's ``DLRM_DCN``,
MLPerf's ``dlrm-v2``) with a low-rank cross net in its place (:class:`LowRankCrossNet`).
Two choices are made for export and serving:

- Ids are reduced into their table inside the model with a non-negative
  modulo (``torch.remainder``, ONNX ``Mod`` with ``fmod=0``), so a categorical
  id of any int64 value is valid and no lookup ever reads out of bounds.
- The 26 tables live in one ``nn.Embedding`` of ``sum(table_sizes)`` rows, and
  table ``t``'s rows start at ``table_sizes[0] + ... + table_sizes[t - 1]``. The lookup of all 26
  features is then one ``Mod``, one ``Add`` and one ``Gather`` in ONNX instead
  of 26 column-``Gather``/table-``Gather``/``Unsqueeze`` chains and a
  ``Concat`` (``nn.EmbeddingBag``
  is avoided altogether: it exports to a slow ``Loop``). Run side by side under
  ONNX Runtime on the CPU (reference preset, batch 1024, both graphs in one
  process, in turn, intra-op spinning off), the fused table was faster in every
  run, and its whole graph has 30 nodes against 158. The weights are the 26
  tables stacked, each initialised as the
  reference initialises a table of its own size.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

import numpy as np
import torch
from torch import nn

from bundle.schema import NUM_CATEGORICAL, NUM_DENSE
from criteo.tables import table_offsets

if TYPE_CHECKING:
    from criteo.tsv import Batch
    from models.config import DLRMConfig

#: File name of the state dict that training writes beside ``config.json``.
WEIGHTS_FILE = "model.pt"
#: Rows per forward pass in :func:`predict_probabilities`.
EVAL_CHUNK_ROWS = 65536


def _mlp(widths: tuple[int, ...], in_features: int, relu_last: bool) -> nn.Sequential:
    """Linear layers of ``widths`` with ReLU between (and after the last if ``relu_last``).

    Initialised as the reference DLRM: weights ~ N(0, sqrt(2 / (fan_in + fan_out))),
    biases ~ N(0, sqrt(1 / fan_out)).
    """
    layers: list[nn.Module] = []
    previous = in_features
    for i, width in enumerate(widths):
        linear = nn.Linear(previous, width)
        with torch.no_grad():
            linear.weight.normal_(0.0, math.sqrt(2.0 / (previous + width)))
            linear.bias.normal_(0.0, math.sqrt(1.0 / width))
        layers.append(linear)
        if relu_last or i < len(widths) - 1:
            layers.append(nn.ReLU())
        previous = width
    return nn.Sequential(*layers)


class DotInteraction(nn.Module):
    """Pairwise dot products of the dense vector and the embeddings.

    Computes ``Z = V V^T`` for the ``F = 27`` vectors ``V`` (the bottom MLP's
    output first, then the 26 embeddings), keeps the ``F (F - 1) / 2 = 351``
    entries strictly below the diagonal, and concatenates the dense vector in
    front of them, as the reference DLRM does.

    Args:
        num_vectors: ``F``, the number of interacting vectors (27 for Criteo).

    Shapes:
        dense ``B x D``, embedded ``B x (F - 1) x D`` -> ``B x (D + F (F - 1) / 2)``.
    """

    pair_index: torch.Tensor

    def __init__(self, num_vectors: int) -> None:
        super().__init__()
        self.num_vectors = num_vectors
        rows, cols = torch.tril_indices(num_vectors, num_vectors, offset=-1)
        # Indices into the flattened F x F matrix: one constant Gather in ONNX.
        self.register_buffer("pair_index", rows * num_vectors + cols, persistent=False)

    def forward(self, dense: torch.Tensor, embedded: torch.Tensor) -> torch.Tensor:
        vectors = torch.cat([dense.unsqueeze(1), embedded], dim=1)
        products = torch.bmm(vectors, vectors.transpose(1, 2))
        pairs = products.flatten(1).index_select(1, self.pair_index)
        return torch.cat([dense, pairs], dim=1)


class LowRankCrossNet(nn.Module):
    """DLRM-DCNv2's interaction: TorchRec's ``LowRankCrossNet`` over ``x0 = [x, e_1..e_26]``.

    Layer ``l`` computes ``x = x0 * (W_l (V_l x) + b_l) + x`` (``W_l`` is ``27D x r``,
    ``V_l`` ``r x 27D``), with TorchRec's parameter names and initialisation (Xavier-normal
    kernels, zero biases), so its state dict reads as ``inter_arch.crossnet``'s does.

    Args:
        width: ``27 D``.
        layers: cross layers.
        rank: ``r``.

    Shapes:
        dense ``B x D``, embedded ``B x 26 x D`` -> ``B x 27D``.
    """

    def __init__(self, width: int, layers: int, rank: int) -> None:
        super().__init__()
        self.W_kernels = nn.ParameterList(
            nn.Parameter(nn.init.xavier_normal_(torch.empty(width, rank))) for _ in range(layers)
        )
        self.V_kernels = nn.ParameterList(
            nn.Parameter(nn.init.xavier_normal_(torch.empty(rank, width))) for _ in range(layers)
        )
        self.bias = nn.ParameterList(nn.Parameter(torch.zeros(width)) for _ in range(layers))

    def forward(self, dense: torch.Tensor, embedded: torch.Tensor) -> torch.Tensor:
        x0 = torch.cat([dense, embedded.flatten(1)], dim=1)
        x = x0
        for w, v, b in zip(self.W_kernels, self.V_kernels, self.bias, strict=True):
            x = x0 * (nn.functional.linear(nn.functional.linear(x, v), w) + b) + x
        return x


class DLRM(nn.Module):
    """Deep Learning Recommendation Model: click probability of one impression.

    ``p = sigmoid(top([x, tril(V V^T)]))`` with ``x = bottom(dense)`` and
    ``V = [x, E_1[c_1 mod T_1], ..., E_26[c_26 mod T_26]]``; with the ``dcn``
    interaction ``p = sigmoid(top(crossnet([x, e_1..e_26])))``.

    Args:
        config: table sizes ``T_t``, embedding width ``D`` and the MLP widths.

    Shapes:
        dense ``B x 13`` float32 (log1p counts), categorical ``B x 26`` int64
        (raw ids, any value) -> ``B x 1`` float32 probabilities
        (:meth:`logits` gives the ``B x 1`` logits).
    """

    table_offsets: torch.Tensor
    table_sizes: torch.Tensor

    def __init__(self, config: DLRMConfig, sparse: bool = False, allocate_tables: bool = True) -> None:
        """Build the model.

        Args:
            config: the architecture.
            sparse: give the embedding sparse gradients (for ``SparseAdam``).
            allocate_tables: allocate and initialise the embedding tables (else they are
                ``meta`` tensors, shapes only, to be assigned: see :meth:`from_state`).
        """
        super().__init__()
        self.config = config
        self.bottom_mlp = _mlp(config.bottom_mlp, NUM_DENSE, relu_last=True)
        device = None if allocate_tables else torch.device("meta")
        self.embedding = nn.Embedding(
            config.embedding_rows, config.embedding_dim, sparse=sparse, device=device
        )
        offsets = table_offsets(config.table_sizes)
        if allocate_tables:
            with torch.no_grad():
                for start, size in zip(offsets, config.table_sizes, strict=True):
                    bound = math.sqrt(1.0 / size)
                    self.embedding.weight[start : start + size].uniform_(-bound, bound)
        # Per id position: a multi-hot row holds each table's bag of hotness[t] ids.
        counts = config.hotness or (1,) * NUM_CATEGORICAL
        #: Ids per table, in C1..C26 order (the pooling's split; all 1 single-hot).
        self.bag_sizes = list(counts)
        per_id = [t for t, h in enumerate(counts) for _ in range(h)]
        sizes = torch.tensor([config.table_sizes[t] for t in per_id], dtype=torch.int64).unsqueeze(0)
        self.register_buffer("table_sizes", sizes, persistent=False)
        self.register_buffer(
            "table_offsets",
            torch.tensor([offsets[t] for t in per_id], dtype=torch.int64).unsqueeze(0),
            persistent=False,
        )
        self.interaction: nn.Module
        if config.interaction == "dcn":
            self.interaction = LowRankCrossNet(
                config.num_interactions, config.cross_layers, config.cross_rank
            )
        else:
            self.interaction = DotInteraction(NUM_CATEGORICAL + 1)
        self.top_mlp = _mlp(config.top_mlp, config.num_interactions, relu_last=False)

    @classmethod
    def from_state(cls, config: DLRMConfig, state: dict[str, torch.Tensor]) -> DLRM:
        """The model whose parameters are ``state``'s tensors themselves (assigned, not copied).

        Nothing of the size of the tables is allocated (they start as ``meta``
        tensors). With a state dict loaded by ``torch.load(mmap=True)`` the tables
        stay in the file's pages until rows are read.

        Raises:
            RuntimeError: ``state`` does not fit ``config`` (missing, unexpected or misshapen keys).
        """
        model = cls(config, allocate_tables=False)
        model.load_state_dict(state, strict=True, assign=True)
        return model

    def embed(self, categorical: torch.Tensor) -> torch.Tensor:
        """Look up every feature in its table: ``B x 26`` int64 -> ``B x 26 x D``; a multi-hot
        model's ``B x H`` bags are summed per table (one ``Split`` and a ``ReduceSum`` each in ONNX)."""
        # remainder takes the divisor's sign, so negative and huge ids land in [0, T_t).
        rows = torch.remainder(categorical, self.table_sizes) + self.table_offsets
        embedded = self.embedding(rows)
        if self.config.hotness is None:
            return embedded
        bags = torch.split(embedded, self.bag_sizes, dim=1)
        return torch.stack([bag.sum(dim=1) for bag in bags], dim=1)

    def logits(self, dense: torch.Tensor, categorical: torch.Tensor) -> torch.Tensor:
        """The ``B x 1`` logits (training uses them with a numerically stable BCE)."""
        x = self.bottom_mlp(dense)
        return self.top_mlp(self.interaction(x, self.embed(categorical)))

    def forward(self, dense: torch.Tensor, categorical: torch.Tensor) -> torch.Tensor:
        return torch.sigmoid(self.logits(dense, categorical))


def predict_probabilities(model: DLRM, batch: Batch) -> np.ndarray:
    """Probabilities of ``model`` for every row of ``batch``: ``B x 1`` float32.

    Runs in eval mode without gradients, ``EVAL_CHUNK_ROWS`` rows at a time,
    and restores the model's training mode afterwards.
    """
    was_training = model.training
    model.eval()
    outputs: list[np.ndarray] = []
    with torch.no_grad():
        for start in range(0, len(batch), EVAL_CHUNK_ROWS):
            rows = batch.slice(start, start + EVAL_CHUNK_ROWS)
            dense = torch.from_numpy(np.ascontiguousarray(rows.dense, dtype=np.float32))
            ids = torch.from_numpy(np.ascontiguousarray(rows.categorical, dtype=np.int64))
            outputs.append(model(dense, ids).numpy())
    model.train(was_training)
    if not outputs:
        return np.empty((0, 1), dtype=np.float32)
    return np.concatenate(outputs).astype(np.float32, copy=False)
