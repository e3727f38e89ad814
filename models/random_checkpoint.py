"""A DLRM checkpoint of any size with random weights, written without ever holding its tables.

What a user's training run would leave (``config.json`` + ``model.pt``, as
:func:`models.train_dlrm.train_dlrm` writes them), for trying the export and
serving of tables larger than this machine's memory without training them:

1. the stacked tables are written a chunk at a time to a memory-mapped file beside
   the checkpoint, each table's rows uniform in ``+-sqrt(1 / rows)`` (the model's own
   initialisation) from a seeded generator;
2. the layers are the model's own initialisation (``torch.manual_seed(seed)``);
3. ``torch.save`` writes the state dict, the tables' bytes streamed from that file's
   pages (the zip format, so that ``torch.load(mmap=True)`` maps them back), and the
   file is removed.

Disk: twice the tables' bytes while ``model.pt`` is written, once after.
"""

from __future__ import annotations

import math
import shutil
from collections.abc import Callable
from pathlib import Path

import numpy as np

from bundle.errors import ConfigError
from criteo.tables import table_offsets
from models.config import DLRMConfig, save_config

#: Rows generated at a time (times D x 4 bytes of memory).
CHUNK_ROWS = 1 << 18


def write_random_dlrm(
    config: DLRMConfig, out: Path, seed: int = 0, on_rows: Callable[[int], None] | None = None
) -> Path:
    """Write ``config.json`` and ``model.pt`` of an untrained DLRM of ``config``'s size to ``out``.

    Args:
        config: the architecture at its real table sizes.
        out: the checkpoint folder (created).
        seed: seed of the tables and the layers.
        on_rows: called with the rows written after each chunk of the tables.

    Returns:
        The ``model.pt`` written.

    Raises:
        ConfigError: not enough free disk in ``out`` for twice the tables' bytes.
    """
    import torch

    from models.dlrm import DLRM, WEIGHTS_FILE

    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    rows, dim = config.embedding_rows, config.embedding_dim
    table_bytes = rows * dim * 4
    free = shutil.disk_usage(out).free
    if free < 2 * table_bytes:
        raise ConfigError(
            f"{out}: the tables take {table_bytes / 1e9:.1f} GB, written twice while model.pt is saved; "
            f"only {free / 1e9:.1f} GB free there"
        )
    scratch = out / "tables.f32"
    try:
        tables = np.memmap(scratch, dtype=np.float32, mode="w+", shape=(rows, dim))
        rng = np.random.default_rng(seed)
        for start, size in zip(table_offsets(config.table_sizes), config.table_sizes, strict=True):
            bound = math.sqrt(1.0 / size)
            for first in range(0, size, CHUNK_ROWS):
                count = min(CHUNK_ROWS, size - first)
                tables[start + first : start + first + count] = rng.uniform(-bound, bound, (count, dim))
                if on_rows is not None:
                    on_rows(count)
        tables.flush()
        torch.manual_seed(seed)
        state = DLRM(config, allocate_tables=False).state_dict()
        state["embedding.weight"] = torch.from_numpy(tables)
        path = out / WEIGHTS_FILE
        torch.save(state, path)
        del state, tables
    finally:
        scratch.unlink(missing_ok=True)
    save_config(config, out, extra={"random": {"seed": seed, "untrained": True}})
    return path
