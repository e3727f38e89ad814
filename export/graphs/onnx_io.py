"""Saving and loading ONNX files, with external data for models over 2 GB.

A graph over 2 GB keeps its weights in ``<model>.onnx.data`` beside it, each large
tensor at an offset aligned to 4 KiB (:data:`ALIGNMENT`): ONNX Runtime then maps
those tensors from the file on the CPU instead of reading them into memory (its
``ModelSavingOptions::on_disk_alignment_factor``), so checking an exported graph
costs page cache, not anonymous memory. Tensors that are not loaded (a model read
with ``load_external_data=False``) are copied into the new file in chunks, never
held in memory whole.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any, BinaryIO

import onnx

#: protobuf cannot serialise a message over 2 GiB; larger models keep weights beside the graph.
EXTERNAL_DATA_THRESHOLD = 2**31 - 2**20
#: Offset alignment of large tensors in the data file (a page: what ONNX Runtime maps).
ALIGNMENT = 4096
#: Tensors of fewer bytes stay inside the graph file (onnx's own default threshold).
INLINE_BYTES = 1024
#: Bytes copied at a time between data files.
COPY_CHUNK = 64 * 2**20


def external_info(tensor: onnx.TensorProto) -> dict[str, str]:
    """A tensor's external-data fields (``location``, ``offset``, ``length``)."""
    return {entry.key: entry.value for entry in tensor.external_data}


def external_tensors(model: onnx.ModelProto) -> list[onnx.TensorProto]:
    """The initializers whose data lies in a file (not loaded into the proto)."""
    return [t for t in model.graph.initializer if t.data_location == onnx.TensorProto.EXTERNAL]


def tensor_bytes(tensor: onnx.TensorProto) -> int:
    """Bytes of a tensor's data, held inside the proto or lying in an external file."""
    if tensor.data_location == onnx.TensorProto.EXTERNAL:
        return int(external_info(tensor).get("length", 0))
    return len(tensor.raw_data)


def weights_bytes(model: onnx.ModelProto) -> int:
    """Bytes of the initializers, inside the proto or in external files."""
    return sum(tensor_bytes(t) for t in model.graph.initializer)


class DataFile:
    """``<model>.onnx.data`` being written: tensors appended at :data:`ALIGNMENT`-aligned offsets."""

    def __init__(self, model_path: Path) -> None:
        self.path = model_path.with_name(model_path.name + ".data")
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.path.unlink(missing_ok=True)
        self._file: BinaryIO = self.path.open("wb")
        self.written: set[str] = set()

    def put(self, tensor: onnx.TensorProto, chunks: Iterable[bytes | memoryview]) -> None:
        """Write ``tensor``'s data from ``chunks`` and point the tensor at it (its raw data cleared)."""
        offset = -self._file.tell() % ALIGNMENT + self._file.tell()
        self._file.seek(offset)
        length = 0
        for chunk in chunks:
            length += self._file.write(chunk)
        tensor.ClearField("raw_data")
        del tensor.external_data[:]
        for key, value in (("location", self.path.name), ("offset", str(offset)), ("length", str(length))):
            entry = tensor.external_data.add()
            entry.key, entry.value = key, value
        tensor.data_location = onnx.TensorProto.EXTERNAL
        self.written.add(tensor.name)

    def close(self) -> None:
        """Close the file, readable by a server that runs as another user."""
        self._file.close()
        self.path.chmod(0o644)

    def __enter__(self) -> DataFile:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def read_external(tensor: onnx.TensorProto, base_dir: Path, chunk: int | None = None) -> Iterator[bytes]:
    """The bytes of an external tensor whose file lies in ``base_dir``, ``chunk`` at a time
    (default :data:`COPY_CHUNK`)."""
    chunk = chunk or COPY_CHUNK
    info = external_info(tensor)
    offset, length = int(info.get("offset", 0)), info.get("length")
    path = base_dir / info["location"]
    remaining = int(length) if length is not None else path.stat().st_size - offset
    with path.open("rb") as source:
        source.seek(offset)
        while remaining > 0:
            data = source.read(min(chunk, remaining))
            if not data:
                raise OSError(f"{path} ends {remaining} bytes before tensor {tensor.name!r} does")
            remaining -= len(data)
            yield data


def save_model(
    model: onnx.ModelProto,
    path: Path,
    threshold: int = EXTERNAL_DATA_THRESHOLD,
    source_dir: Path | None = None,
    data: DataFile | None = None,
) -> list[Path]:
    """Save ``model`` to ``path``; weights go to ``<path>.data`` when they exceed ``threshold``.

    Args:
        model: the graph; its initializers may be loaded, or external tensors whose files
            lie in ``source_dir`` (a model loaded with ``load_external_data=False``).
            Tensors written to the data file lose their raw data (``model`` changes).
        path: the ``.onnx`` file to write.
        threshold: weight bytes above which they go to the data file.
        source_dir: where the external tensors' files lie (needed when there are any).
        data: the data file, when some tensors were written to it already (they stay).

    Returns:
        The files written (the graph, and the external data file if any).
    """
    path.parent.mkdir(parents=True, exist_ok=True)
    external = external_tensors(model)
    if data is None and not external and weights_bytes(model) <= threshold:
        path.with_name(path.name + ".data").unlink(missing_ok=True)
        onnx.save_model(model, str(path))
        return [path]
    if external and source_dir is None and data is None:
        raise ValueError(f"{path}: the model has external tensors; say where their files lie")
    with data or DataFile(path) as data:
        for tensor in model.graph.initializer:
            if tensor.name in data.written:
                continue
            if tensor.data_location == onnx.TensorProto.EXTERNAL:
                assert source_dir is not None
                data.put(tensor, read_external(tensor, source_dir))
            elif len(tensor.raw_data) >= INLINE_BYTES:
                data.put(tensor, [memoryview(tensor.raw_data)])
    onnx.save_model(model, str(path))
    return [path, data.path]


def model_files(path: Path) -> list[Path]:
    """The graph file and, if present, its external data file."""
    data_file = path.with_name(path.name + ".data")
    return [path, data_file] if data_file.exists() else [path]


def inputs_of(node: onnx.NodeProto) -> set[str]:
    """Names a node reads, including those its subgraphs (If, Loop, Scan) read from outer scope."""
    names = {name for name in node.input if name}
    for attribute in node.attribute:
        for graph in [attribute.g] if attribute.type == onnx.AttributeProto.GRAPH else list(attribute.graphs):
            for inner in graph.node:
                names |= inputs_of(inner)
    return names


def _remove(field: Any, keep: Callable[[int], bool]) -> None:
    """Delete the elements of a repeated field whose index ``keep`` rejects, in place (nothing copied)."""
    for i in reversed(range(len(field))):
        if not keep(i):
            del field[i]


def prune(graph: onnx.GraphProto, keep_inputs: set[str]) -> None:
    """Drop the nodes, initializers, value infos and initializer-inputs nothing reads any more."""
    needed = {value.name for value in graph.output} | keep_inputs
    live = [False] * len(graph.node)
    for i in reversed(range(len(graph.node))):
        node = graph.node[i]
        if any(name in needed for name in node.output if name):
            live[i] = True
            needed |= inputs_of(node)
    produced = {name for i, node in enumerate(graph.node) if live[i] for name in node.output}
    _remove(graph.node, lambda i: live[i])
    _remove(graph.initializer, lambda i: graph.initializer[i].name in needed)
    _remove(graph.input, lambda i: graph.input[i].name in needed)
    _remove(graph.value_info, lambda i: graph.value_info[i].name in produced)
