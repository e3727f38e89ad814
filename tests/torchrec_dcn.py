"""Test-only DLRM-DCNv2 models built with the real ``torchrec`` package (its ``DLRM_DCN``).

The importer in :mod:`export.importers.dlrm_layouts` reads TorchRec state dicts
without TorchRec; these helpers build the model with TorchRec itself and run its
own forward on ``KeyedJaggedTensor`` inputs, so the tests compare the export
against the source framework, not against the bundle's own reading of it.
"""

from __future__ import annotations

import numpy as np
import torch
from torchrec.models.dlrm import DLRM_DCN, DLRMTrain
from torchrec.modules.embedding_configs import EmbeddingBagConfig
from torchrec.modules.embedding_modules import EmbeddingBagCollection
from torchrec.sparse.jagged_tensor import KeyedJaggedTensor

from tests.byom_torch import NUM_DENSE, NUM_TABLES, TABLE_SIZES

DIM = 4
DENSE_LAYERS = (8, DIM)
OVER_LAYERS = (16, 8, 1)
CROSS_LAYERS = 2
CROSS_RANK = 6
#: TorchRec feature names (the KeyedJaggedTensor's keys), one per table, in table order.
FEATURES: tuple[str, ...] = tuple(f"cat_{i}" for i in range(NUM_TABLES))


def make_dcn(seed: int = 0, sizes: tuple[int, ...] = TABLE_SIZES) -> DLRM_DCN:
    """A ``DLRM_DCN`` of 26 tables ``t_cat_<i>`` of ``sizes`` rows, weights drawn N(0, 0.3) from ``seed``."""
    torch.manual_seed(seed)
    tables = [
        EmbeddingBagConfig(
            name=f"t_cat_{i}", embedding_dim=DIM, num_embeddings=rows, feature_names=[FEATURES[i]]
        )
        for i, rows in enumerate(sizes)
    ]
    model = DLRM_DCN(
        embedding_bag_collection=EmbeddingBagCollection(tables=tables, device=torch.device("cpu")),
        dense_in_features=NUM_DENSE,
        dense_arch_layer_sizes=list(DENSE_LAYERS),
        over_arch_layer_sizes=list(OVER_LAYERS),
        dcn_num_layers=CROSS_LAYERS,
        dcn_low_rank_dim=CROSS_RANK,
    )
    with torch.no_grad():
        for parameter in model.parameters():
            parameter.normal_(0.0, 0.3)
    return model.eval()


def train_state(model: DLRM_DCN) -> dict[str, torch.Tensor]:
    """The state dict of ``DLRMTrain(model)``, as a TorchRec training script saves it (``model.`` keys)."""
    return DLRMTrain(model).state_dict()


def old_bias_state(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """``state`` with the cross net's biases ``27D x 1``, as TorchRec wrote them before December 2022."""
    return {k: v.reshape(-1, 1) if ".crossnet.bias." in k else v for k, v in state.items()}


def dcn_logits(
    model: DLRM_DCN, dense: np.ndarray, ids: np.ndarray, hotness: tuple[int, ...] | None = None
) -> np.ndarray:
    """TorchRec's own forward on in-range ``ids``: ``B x 1`` logits.

    ``ids`` is ``B x 26`` (table order), or ``B x H`` with ``hotness``: table 0's bag first,
    then table 1's, as the export's ``categorical_ids`` has them. The KeyedJaggedTensor holds
    each table's bags (key-major, one length per sample and table).
    """
    batch = ids.shape[0]
    counts = hotness if hotness is not None else (1,) * NUM_TABLES
    starts = np.concatenate(([0], np.cumsum(counts)[:-1]))
    values = np.concatenate([ids[:, s : s + h].reshape(-1) for s, h in zip(starts, counts, strict=True)])
    lengths = np.repeat(np.asarray(counts, dtype=np.int32), batch)
    features = KeyedJaggedTensor.from_lengths_sync(
        keys=list(FEATURES), values=torch.from_numpy(values), lengths=torch.from_numpy(lengths)
    )
    with torch.no_grad():
        return model(torch.from_numpy(np.ascontiguousarray(dense, dtype=np.float32)), features).numpy()


def dcn_bag_logits(model: DLRM_DCN, dense: np.ndarray, values: np.ndarray, lengths: np.ndarray) -> np.ndarray:
    """TorchRec's own forward on bags of any size: ``B x 1`` logits.

    ``values`` are in-range ids, row after row and within a row table 0's bag first (the
    export's ``categorical_values``); ``lengths`` is ``B x 26`` (table order). The
    KeyedJaggedTensor takes them key-major: every bag of table 0, then of table 1.
    """
    batch = lengths.shape[0]
    table = np.repeat(np.tile(np.arange(NUM_TABLES), batch), lengths.reshape(-1))
    key_major = np.concatenate([values[table == t] for t in range(NUM_TABLES)])
    features = KeyedJaggedTensor.from_lengths_sync(
        keys=list(FEATURES),
        values=torch.from_numpy(key_major.astype(np.int64)),
        lengths=torch.from_numpy(np.ascontiguousarray(lengths.T.reshape(-1), dtype=np.int32)),
    )
    with torch.no_grad():
        return model(torch.from_numpy(np.ascontiguousarray(dense, dtype=np.float32)), features).numpy()
