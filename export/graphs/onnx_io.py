"""Saving and loading ONNX files, with external data for models over 2 GB."""

from __future__ import annotations

from pathlib import Path

import onnx

#: protobuf cannot serialise a message over 2 GiB; larger models keep weights beside the graph.
EXTERNAL_DATA_THRESHOLD = 2**31 - 2**20


def weights_bytes(model: onnx.ModelProto) -> int:
    """Bytes of the initializers held inside the proto."""
    return sum(len(t.raw_data) for t in model.graph.initializer)


def save_model(model: onnx.ModelProto, path: Path, threshold: int = EXTERNAL_DATA_THRESHOLD) -> list[Path]:
    """Save ``model`` to ``path``; weights go to ``<path>.data`` when they exceed ``threshold``.

    Returns:
        The files written (the graph, and the external data file if any).
    """
    path.parent.mkdir(parents=True, exist_ok=True)
    data_file = path.with_name(path.name + ".data")
    data_file.unlink(missing_ok=True)
    if weights_bytes(model) > threshold:
        onnx.save_model(
            model,
            str(path),
            save_as_external_data=True,
            all_tensors_to_one_file=True,
            location=data_file.name,
            size_threshold=1024,
        )
        if not data_file.exists():  # every tensor under onnx's 1 KB size threshold: all stayed inline
            return [path]
        # onnx writes the data file 0600; a server running as another user must read it.
        data_file.chmod(0o644)
        return [path, data_file]
    onnx.save_model(model, str(path))
    return [path]


def model_files(path: Path) -> list[Path]:
    """The graph file and, if present, its external data file."""
    data_file = path.with_name(path.name + ".data")
    return [path, data_file] if data_file.exists() else [path]
