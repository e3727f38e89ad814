"""The NGC releases the GPU stack may run, and whether a repository's files fit one.

``docker-compose.yml`` and ``deploy/k8s`` pin one NGC release (``NGC_RELEASE``) for
every NVIDIA image: ``tritonserver:<release>-py3`` serves, ``tensorrt:<release>-py3``
builds the plans. :data:`RELEASES` writes down what each release known here carries,
with the pages it was read from; the compose file's default release must be one of
them (``tests/unit/test_ngc.py``).

What a release's backends can read bounds what the export may hand them:

- ONNX Runtime reads ONNX files up to its opset and IR version;
- LibTorch reads TorchScript archives up to its file-format version, and a file is
  traced against the ops of the torch that wrote it: a file from a newer torch than
  the release's LibTorch may call ops, or op signatures, that LibTorch does not have.
  The export records the torch that wrote each ``model.pt`` inside the file
  (:data:`TORCHSCRIPT_PRODUCER_RECORD`, a TorchScript "extra file").

:func:`check_release` reads the files (no onnx or torch import: the ONNX header is
decoded by hand, the TorchScript archive is a zip) and returns one line per file a
release cannot serve. TensorRT plans are left out: a plan runs only under the
TensorRT that built it, which ``trt-build`` guarantees by building in the same
release's image.
"""

from __future__ import annotations

import json
import re
import zipfile
from dataclasses import dataclass
from pathlib import Path

from bundle.repository import MODEL_FILE, TORCHSCRIPT_FILE

#: Where a TorchScript file written by the export records the torch that wrote it:
#: ``torch.jit.save(..., _extra_files={TORCHSCRIPT_PRODUCER_RECORD: json})``, stored in
#: the archive as ``<archive>/extra/<record>``. JSON: ``{"torch": "2.13.0+cpu"}``.
TORCHSCRIPT_PRODUCER_RECORD = "producer.json"


@dataclass(frozen=True)
class NgcRelease:
    """One NGC monthly release: the versions its images carry.

    Attributes:
        name: ``YY.MM``.
        triton: Triton Inference Server's version in ``tritonserver:<name>-py3``.
        cuda: the CUDA it is built on.
        driver: the NVIDIA driver it needs.
        tensorrt: TensorRT in ``tritonserver:<name>-py3`` and ``tensorrt:<name>-py3``.
        onnxruntime: the onnxruntime backend's ONNX Runtime.
        onnx_opset: the highest ONNX opset (default domain) that ONNX Runtime implements.
        onnx_ir: the highest ONNX IR version it reads.
        libtorch: the pytorch backend's LibTorch (the torch of ``pytorch:<name>-py3``).
        torchscript_format: the highest TorchScript file-format version that LibTorch reads.
        python: the Python of the image (the python backend's stubs).
        sources: the pages these facts were read from.
    """

    name: str
    triton: str
    cuda: str
    driver: str
    tensorrt: str
    onnxruntime: str
    onnx_opset: int
    onnx_ir: int
    libtorch: str
    torchscript_format: int
    python: str
    sources: tuple[str, ...]


#: The releases whose versions are written down here (the one the stack pins among them).
RELEASES: dict[str, NgcRelease] = {
    "25.01": NgcRelease(
        name="25.01",
        triton="2.54.0",
        cuda="12.8.0.038",
        driver=">= 560; on a data-center GPU also R470 (470.57+), R525 (525.85+), R535 (535.86+) or R545",
        tensorrt="10.8.0.43",
        onnxruntime="1.20.1",
        # ONNX Runtime 1.20 implements ONNX 1.16.1: opset 21, IR version 10.
        onnx_opset=21,
        onnx_ir=10,
        libtorch="2.6.0a0+ecf3bae40a",
        # kMaxSupportedFileFormatVersion has been 10 (0xA) since torch 1.12.
        torchscript_format=10,
        python="3.12",
        sources=(
            "https://docs.nvidia.com/deeplearning/triton-inference-server/release-notes/rel-25-01.html",
            "https://github.com/triton-inference-server/server/blob/r25.01/docs/introduction/release_notes.md",
            "https://github.com/triton-inference-server/server/blob/r25.01/build.py",
            "https://github.com/triton-inference-server/server/blob/r26.08/docs/introduction/compatibility.md",
            "https://onnxruntime.ai/docs/reference/compatibility.html",
            "https://github.com/pytorch/pytorch/blob/main/caffe2/serialize/versions.h",
        ),
    ),
}


#: The release docker-compose.yml (``NGC_RELEASE``'s default) and deploy/k8s pin.
PINNED_RELEASE = "25.01"


def release(name: str) -> NgcRelease:
    """The release ``name`` (``YY.MM``).

    Raises:
        KeyError: a release whose versions are not written down here, naming those that are.
    """
    try:
        return RELEASES[name]
    except KeyError:
        known = ", ".join(sorted(RELEASES))
        raise KeyError(
            f"NGC release {name!r} is not one this bundle knows the versions of ({known})"
        ) from None


def _version_tuple(version: str) -> tuple[int, int]:
    """``major.minor`` of a torch version string (``2.6.0a0+ecf3bae40a`` -> (2, 6))."""
    match = re.match(r"(\d+)\.(\d+)", version)
    if match is None:
        raise ValueError(f"not a version: {version!r}")
    return int(match.group(1)), int(match.group(2))


@dataclass(frozen=True)
class TorchScriptRecord:
    """What a TorchScript archive says about itself.

    Attributes:
        format_version: the archive's file-format version (``<archive>/version`` or,
            from version 6, ``<archive>/.data/version``).
        producer_torch: the torch that wrote it, where the export recorded it ("" otherwise).
    """

    format_version: int
    producer_torch: str


def read_torchscript_record(path: Path) -> TorchScriptRecord:
    """Read the format version and the producer record of the TorchScript archive ``path``.

    Raises:
        ValueError: not a TorchScript archive (no zip, or no version record).
    """
    try:
        with zipfile.ZipFile(path) as archive:
            names = archive.namelist()
            versions = [
                n for n in names if n.count("/") in (1, 2) and n.endswith(("/version", "/.data/version"))
            ]
            if not versions:
                raise ValueError(f"{path} is not a TorchScript archive (no version record)")
            # ``.data/version`` wins where both are present, as torch's reader decides.
            chosen = sorted(versions, key=lambda n: n.endswith("/.data/version"))[-1]
            format_version = int(archive.read(chosen).decode().strip())
            producer = ""
            record = [n for n in names if n.endswith(f"/extra/{TORCHSCRIPT_PRODUCER_RECORD}")]
            if record:
                producer = str(json.loads(archive.read(record[0]).decode()).get("torch", ""))
    except zipfile.BadZipFile:
        raise ValueError(f"{path} is not a TorchScript archive (not a zip file)") from None
    return TorchScriptRecord(format_version, producer)


def torchscript_problem(path: Path, target: NgcRelease) -> str:
    """Why ``target``'s LibTorch cannot serve the TorchScript file ``path`` ("" : it can)."""
    try:
        record = read_torchscript_record(path)
    except ValueError as exc:
        return str(exc)
    if record.format_version > target.torchscript_format:
        return (
            f"{path}: TorchScript file format {record.format_version}, newer than NGC {target.name}'s "
            f"LibTorch {target.libtorch} reads (up to {target.torchscript_format})"
        )
    if record.producer_torch and _version_tuple(record.producer_torch) > _version_tuple(target.libtorch):
        return (
            f"{path}: written by torch {record.producer_torch}, newer than NGC {target.name}'s LibTorch "
            f"{target.libtorch}; export it with that release's torch "
            f"(nvcr.io/nvidia/pytorch:{target.name}-py3)"
        )
    return ""


def _varint(data: bytes, at: int) -> tuple[int, int]:
    value = shift = 0
    while True:
        if at >= len(data):
            raise ValueError("truncated varint")
        byte = data[at]
        value |= (byte & 0x7F) << shift
        at += 1
        if not byte & 0x80:
            return value, at
        shift += 7


def onnx_versions(path: Path) -> tuple[int, dict[str, int]]:
    """The IR version and the opset of each domain ("" : the default) of the ONNX file ``path``.

    Reads only the ModelProto's top-level fields ``ir_version`` (1) and ``opset_import`` (8)
    and seeks past the others (the graph), so a file of any size costs a few reads.

    Raises:
        ValueError: not a readable ONNX file.
    """
    ir_version, opsets = 0, {}
    try:
        with path.open("rb") as handle:
            while head := handle.read(20):
                key, at = _varint(head, 0)
                field, wire = key >> 3, key & 7
                if wire == 0:
                    value, at = _varint(head, at)
                    if field == 1:
                        ir_version = value
                    handle.seek(at - len(head), 1)
                elif wire == 2:
                    length, at = _varint(head, at)
                    handle.seek(at - len(head), 1)
                    if field == 8:
                        domain, version = _opset(handle.read(length))
                        opsets[domain] = version
                    else:
                        handle.seek(length, 1)
                elif wire in (1, 5):
                    handle.seek(at + (8 if wire == 1 else 4) - len(head), 1)
                else:
                    raise ValueError(f"wire type {wire}")
    except ValueError as exc:
        raise ValueError(f"{path} is not a readable ONNX file ({exc})") from None
    if not ir_version:
        raise ValueError(f"{path} is not a readable ONNX file (no IR version)")
    return ir_version, opsets


def _opset(data: bytes) -> tuple[str, int]:
    """An OperatorSetIdProto's ``domain`` (1) and ``version`` (2)."""
    domain, version, at = "", 0, 0
    while at < len(data):
        key, at = _varint(data, at)
        field, wire = key >> 3, key & 7
        if wire == 0:
            value, at = _varint(data, at)
            if field == 2:
                version = value
        elif wire == 2:
            length, at = _varint(data, at)
            if field == 1:
                domain = data[at : at + length].decode()
            at += length
        else:
            raise ValueError(f"wire type {wire} in an opset")
    return ("" if domain == "ai.onnx" else domain), version


def onnx_problem(path: Path, target: NgcRelease) -> str:
    """Why ``target``'s ONNX Runtime cannot serve the ONNX file ``path`` ("" : it can)."""
    try:
        ir_version, opsets = onnx_versions(path)
    except ValueError as exc:
        return str(exc)
    runtime = f"NGC {target.name}'s ONNX Runtime {target.onnxruntime}"
    if ir_version > target.onnx_ir:
        return f"{path}: ONNX IR version {ir_version}, newer than {runtime} reads (up to {target.onnx_ir})"
    opset = opsets.get("", 0)
    if opset > target.onnx_opset:
        return f"{path}: ONNX opset {opset}, newer than {runtime} implements (up to {target.onnx_opset})"
    return ""


def check_release(repository: Path, target: NgcRelease) -> list[str]:
    """One line per model file of ``repository`` that ``target``'s backends cannot serve.

    Looks at every ``<model>/<version>/model.onnx`` and ``model.pt``; [] when all fit.
    """
    problems: list[str] = []
    for file, problem in ((MODEL_FILE, onnx_problem), (TORCHSCRIPT_FILE, torchscript_problem)):
        for path in sorted(repository.glob(f"*/*/{file}")):
            if path.parent.name.isdigit():
                problems.append(problem(path, target))
    return [problem for problem in problems if problem]
