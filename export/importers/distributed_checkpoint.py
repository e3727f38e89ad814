"""A ``torch.distributed.checkpoint`` folder (what TorchRec training runs save) read as one state dict.

``dcp.save`` writes a folder of ``.distcp`` shard files and a ``.metadata`` file that
lists every tensor's global shape, dtype and where its chunks lie. The folder is read
without a process group: each tensor is allocated at its global shape and
``dcp.load`` fills it from the chunks, so a table sharded row-wise or table-wise
over many ranks comes back whole. Entries that are not tensors (a step counter,
optimizer settings) are left out.

``.metadata`` is a pickle, which torch reads with plain ``pickle.load``: a crafted
file could run code as it is read. It is read here by an unpickler that only builds
the checkpoint metadata's own classes (and ``torch.Size``, dtypes, paths), so a file is
never allowed to run code while it is read; the shards' tensors are read by
``torch.load(weights_only=True)``, as torch does.

Imports torch at the top: import this module inside the functions that need it.
"""

from __future__ import annotations

import io
import pickle
import warnings
from pathlib import Path
from typing import Any

import torch
from torch.distributed.checkpoint import FileSystemReader
from torch.distributed.checkpoint import load as dcp_load
from torch.distributed.checkpoint.metadata import Metadata, StorageMeta, TensorStorageMetadata

from bundle.errors import ExportError

#: The file that makes a folder a distributed checkpoint.
METADATA_FILE = ".metadata"
#: Modules whose every class the metadata may hold.
_METADATA_MODULES = ("torch.distributed.checkpoint.metadata",)
#: Other names the metadata may hold: (module, name).
_METADATA_NAMES = {
    ("torch.distributed.checkpoint.filesystem", "_StorageInfo"),
    ("torch", "Size"),
    ("torch.serialization", "_get_layout"),
    ("pathlib", "Path"),
    ("pathlib", "PosixPath"),
    ("pathlib", "PurePosixPath"),
    ("collections", "OrderedDict"),
    ("builtins", "set"),
    ("builtins", "frozenset"),
    ("builtins", "slice"),
}


def is_distributed_checkpoint(path: Path) -> bool:
    """``path`` is a folder that ``torch.distributed.checkpoint.save`` wrote."""
    return path.is_dir() and (path / METADATA_FILE).is_file()


class _MetadataUnpickler(pickle.Unpickler):
    """Builds only the checkpoint metadata's classes; any other global is refused."""

    def find_class(self, module: str, name: str) -> Any:
        dtype = getattr(torch, name, None) if module == "torch" else None
        if module in _METADATA_MODULES or (module, name) in _METADATA_NAMES or isinstance(dtype, torch.dtype):
            return super().find_class(module, name)
        raise pickle.UnpicklingError(f"{module}.{name} is not part of a checkpoint's metadata")


def read_metadata(path: Path) -> Metadata:
    """The checkpoint's ``.metadata``, read without running code.

    Raises:
        ExportError: the file is not a checkpoint's metadata (one line naming what it holds).
    """
    try:
        data = (path / METADATA_FILE).read_bytes()
        metadata = _MetadataUnpickler(io.BytesIO(data)).load()
    except (
        OSError,
        pickle.UnpicklingError,
        EOFError,
        AttributeError,
        ImportError,
        TypeError,
        ValueError,
    ) as exc:
        raise ExportError(
            f"{path / METADATA_FILE}: not a torch.distributed.checkpoint metadata file ({exc})"
        ) from None
    if not isinstance(metadata, Metadata):
        raise ExportError(
            f"{path / METADATA_FILE}: holds a {type(metadata).__name__}, "
            "not a torch.distributed.checkpoint Metadata"
        )
    return metadata


class _SafeReader(FileSystemReader):
    """``FileSystemReader`` whose metadata comes from :func:`read_metadata`."""

    def __init__(self, path: Path, metadata: Metadata) -> None:
        super().__init__(path)
        self._checked = metadata

    def read_metadata(self, *args: Any, **kwargs: Any) -> Metadata:
        meta = getattr(self._checked, "storage_meta", None) or StorageMeta()
        meta.load_id = self.load_id
        self._checked.storage_meta = meta
        return self._checked


def _available_bytes() -> int | None:
    try:
        with open("/proc/meminfo") as meminfo:
            for line in meminfo:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        return None
    return None


def load_distributed_checkpoint(path: Path) -> dict[str, torch.Tensor]:
    """Every tensor of the checkpoint at ``path``, whole (global shape), by its key.

    Raises:
        ExportError: no tensors in it, tensors larger than the memory this machine has
            free, or a shard that cannot be read (one line each).
    """
    metadata = read_metadata(path)
    specs = {
        key: entry
        for key, entry in metadata.state_dict_metadata.items()
        if isinstance(entry, TensorStorageMetadata)
    }
    if not specs:
        raise ExportError(f"{path}: a distributed checkpoint without tensors")
    total = sum(
        entry.size.numel() * torch.empty(0, dtype=entry.properties.dtype).element_size()
        for entry in specs.values()
    )
    available = _available_bytes()
    if available is not None and total > available:
        raise ExportError(
            f"{path}: its tensors take {total / 1e9:.1f} GB and this machine has "
            f"{available / 1e9:.1f} GB free; a distributed checkpoint is read into memory whole"
        )
    state = {
        key: torch.empty(tuple(entry.size), dtype=entry.properties.dtype) for key, entry in specs.items()
    }
    try:
        with warnings.catch_warnings():
            # "torch.distributed is ... uninitialized, assuming ... a single process": as intended.
            warnings.filterwarnings("ignore", message="torch.distributed is disabled")
            dcp_load(state, storage_reader=_SafeReader(path, metadata), no_dist=True)
    except Exception as exc:  # torch raises CheckpointException and others for unreadable shards
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise ExportError(f"{path}: cannot read the checkpoint's shards ({first})") from None
    return state
