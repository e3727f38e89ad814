"""Write the benchmark's model: MLPerf's DLRM-DCNv2, built with TorchRec, at reduced table sizes.

``DLRMTrain(DLRM_DCN)`` with MLPerf ``dlrm-v2``'s layers (``D`` 128, bottom 512-256-128,
3 cross layers of rank 512, top 1024-1024-512-256-1) and its 26 tables capped at
``--max-rows`` rows each, TorchRec's own initialisation (untrained), saved as a TorchRec
training script saves it: ``torch.save(model.state_dict())``, keys under ``model.``.

    python benchmarks/dcnv2/make_checkpoint.py --out artifacts/dcnv2/dlrm_dcn.pt --max-rows 200000
"""

from __future__ import annotations

import argparse
from pathlib import Path

import torch
from torchrec.models.dlrm import DLRM_DCN, DLRMTrain
from torchrec.modules.embedding_configs import EmbeddingBagConfig
from torchrec.modules.embedding_modules import EmbeddingBagCollection

from criteo.tables import MLPERF_DCNV2


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--max-rows", type=int, default=200_000)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    torch.manual_seed(args.seed)
    sizes = [min(rows, args.max_rows) for rows in MLPERF_DCNV2]
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
    args.out.parent.mkdir(parents=True, exist_ok=True)
    torch.save(DLRMTrain(model).state_dict(), args.out)
    print(f"{args.out}: DLRM_DCN, tables {','.join(map(str, sizes))} ({sum(sizes):,} rows)")


if __name__ == "__main__":
    main()
