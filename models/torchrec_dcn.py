"""MLPerf's DLRM-DCNv2 as TorchRec builds it, written as a TorchRec user's state dict.

``DLRMTrain(DLRM_DCN)`` with MLPerf ``dlrm-v2``'s layers (``D`` 128, bottom 512-256-128,
3 cross layers of rank 512, top 1024-1024-512-256-1) and its 26 tables
(:data:`criteo.tables.MLPERF_DCNV2`), each capped at ``max_rows`` rows, with TorchRec's
own initialisation (untrained), saved as a TorchRec training script saves it:
``torch.save(model.state_dict())``, keys under ``model.``. The benchmarks export it
with ``--hotness mlperf``, as a user would bring it.

Imports torch and torchrec inside the function: TorchRec is a test and benchmark
dependency (``requirements-torchrec.txt``), not one of the bundle's own.
"""

from __future__ import annotations

from pathlib import Path

from bundle.errors import ConfigError
from criteo.tables import MLPERF_DCNV2


def write_mlperf_dcn(out: Path, max_rows: int, seed: int = 0) -> tuple[int, ...]:
    """Write the state dict to ``out``; return the 26 table sizes it has.

    Raises:
        ConfigError: ``max_rows`` below 2, or TorchRec is not installed.
    """
    if max_rows < 2:
        raise ConfigError(f"--max-rows must be >= 2, got {max_rows}")
    try:
        import torch
        from torchrec.models.dlrm import DLRM_DCN, DLRMTrain
        from torchrec.modules.embedding_configs import EmbeddingBagConfig
        from torchrec.modules.embedding_modules import EmbeddingBagCollection
    except ImportError as exc:
        raise ConfigError(f"torchrec is not installed ({exc}): `make setup` installs it") from None
    torch.manual_seed(seed)
    sizes = tuple(min(rows, max_rows) for rows in MLPERF_DCNV2)
    tables = [
        EmbeddingBagConfig(
            name=f"t_cat_{i}", embedding_dim=128, num_embeddings=rows, feature_names=[f"cat_{i}"]
        )
        for i, rows in enumerate(sizes)
    ]
    model = DLRM_DCN(
        embedding_bag_collection=EmbeddingBagCollection(tables=tables, device=torch.device("cpu")),
        dense_in_features=13,
        dense_arch_layer_sizes=[512, 256, 128],
        over_arch_layer_sizes=[1024, 1024, 512, 256, 1],
        dcn_num_layers=3,
        dcn_low_rank_dim=512,
    )
    out.parent.mkdir(parents=True, exist_ok=True)
    torch.save(DLRMTrain(model).state_dict(), out)
    return sizes
