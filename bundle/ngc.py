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
  (:data:`TORCHSCRIPT_PRODUCER_RECORD`, a TorchScript "extra file");
- an AOTInductor package (``model.pt2``, ``platform: "torch_aoti"``, from 26.03) is
  compiled code tied to the PyTorch that compiled it and to its device: the export
  records both in the package (the same record, a PT2 archive "extra file").

A fact that no source read here gives is None, and the release lists it in
``not_found``. The check then judges against what is known for certain: a bound an
older release already had (ONNX Runtime and LibTorch only move forward), and
nothing at all for a package that needs the exact PyTorch. It refuses rather than
guesses.

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

from bundle.repository import AOTI_FILE, MODEL_FILE, TORCHSCRIPT_FILE

#: Where a TorchScript file written by the export records the torch that wrote it:
#: ``torch.jit.save(..., _extra_files={TORCHSCRIPT_PRODUCER_RECORD: json})``, stored in
#: the archive as ``<archive>/extra/<record>``. JSON: ``{"torch": "2.13.0+cpu"}``.
TORCHSCRIPT_PRODUCER_RECORD = "producer.json"


@dataclass(frozen=True)
class NgcRelease:
    """One NGC monthly release: the versions its images carry (None: found in no source read).

    Attributes:
        name: ``YY.MM``.
        triton: Triton Inference Server's version in ``tritonserver:<name>-py3``.
        cuda: the CUDA it is built on.
        driver: the NVIDIA driver it needs.
        tensorrt: TensorRT in ``tritonserver:<name>-py3`` and ``tensorrt:<name>-py3``.
        onnxruntime: the onnxruntime backend's ONNX Runtime.
        onnxruntime_at_least: the ONNX Runtime it carries at least (``onnxruntime`` where known).
        onnx_opset: the highest ONNX opset (default domain) that ONNX Runtime is known to implement.
        onnx_ir: the highest ONNX IR version it is known to read.
        libtorch: the pytorch backend's LibTorch (the torch of ``pytorch:<name>-py3``).
        libtorch_at_least: the LibTorch it carries at least (``libtorch`` where known).
        torchscript_format: the highest TorchScript file-format version that LibTorch reads.
        python: the Python of the image (the python backend's stubs).
        torch_aoti: the pytorch backend loads AOTInductor packages (``platform: "torch_aoti"``).
        sources: the pages these facts were read from.
        not_found: each fact no source gave, and what stands in for it.
    """

    name: str
    triton: str
    cuda: str | None
    driver: str | None
    tensorrt: str | None
    onnxruntime: str | None
    onnxruntime_at_least: str
    onnx_opset: int
    onnx_ir: int
    libtorch: str | None
    libtorch_at_least: str
    torchscript_format: int
    python: str | None
    torch_aoti: bool
    sources: tuple[str, ...]
    not_found: tuple[str, ...] = ()

    @property
    def runtime(self) -> str:
        """Its ONNX Runtime, as a refusal names it."""
        if self.onnxruntime is not None:
            return f"NGC {self.name}'s ONNX Runtime {self.onnxruntime}"
        return f"NGC {self.name}'s ONNX Runtime (version not found; at least {self.onnxruntime_at_least})"

    @property
    def torch(self) -> str:
        """Its LibTorch, as a refusal names it."""
        if self.libtorch is not None:
            return f"NGC {self.name}'s LibTorch {self.libtorch}"
        return f"NGC {self.name}'s LibTorch (version not found; at least {self.libtorch_at_least})"


#: The releases whose versions are written down here (the one the stack pins among them).
RELEASES: dict[str, NgcRelease] = {
    "25.01": NgcRelease(
        name="25.01",
        triton="2.54.0",
        cuda="12.8.0.038",
        driver=">= 560; on a data-center GPU also R470 (470.57+), R525 (525.85+), R535 (535.86+) or R545",
        tensorrt="10.8.0.43",
        onnxruntime="1.20.1",
        onnxruntime_at_least="1.20.1",
        # ONNX Runtime 1.20 implements ONNX 1.16.1: opset 21, IR version 10.
        onnx_opset=21,
        onnx_ir=10,
        libtorch="2.6.0a0+ecf3bae40a",
        libtorch_at_least="2.6.0a0+ecf3bae40a",
        # kMaxSupportedFileFormatVersion has been 10 (0xA) since torch 1.12.
        torchscript_format=10,
        python="3.12",
        # The pytorch backend loads AOTInductor packages from 26.03 on.
        torch_aoti=False,
        sources=(
            "https://docs.nvidia.com/deeplearning/triton-inference-server/release-notes/rel-25-01.html",
            "https://github.com/triton-inference-server/server/blob/r25.01/docs/introduction/release_notes.md",
            "https://github.com/triton-inference-server/server/blob/r25.01/build.py",
            "https://github.com/triton-inference-server/server/blob/r26.08/docs/introduction/compatibility.md",
            "https://onnxruntime.ai/docs/reference/compatibility.html",
            "https://github.com/pytorch/pytorch/blob/main/caffe2/serialize/versions.h",
        ),
    ),
    # The newest stored release notes and branches stop before 26.11: what it carries is
    # bounded below by older releases' facts, each with its source, and the rest is None.
    "26.11": NgcRelease(
        name="26.11",
        # One minor version a month: 26.03 is 2.67.0 and 26.07 is 2.71.0 (server r26.03 and
        # r26.07 TRITON_VERSION and build.py), so 26.11 is 2.75.0.
        triton="2.75.0",
        cuda=None,
        driver=None,
        tensorrt=None,
        onnxruntime=None,
        # 26.07 carries ONNX Runtime 1.27.0 (compatibility.md), and a release never goes back.
        onnxruntime_at_least="1.27.0",
        # What ONNX Runtime 1.20 implements (the newest row of its compatibility table read
        # here); a newer ONNX Runtime keeps every older opset.
        onnx_opset=21,
        onnx_ir=10,
        libtorch=None,
        # The PyTorch of pytorch:26.04-py3, an earlier release than 26.11's (the pytorch
        # backend's README: "the 26.04 release of Triton ... supports PyTorch version 2.12.0a0").
        libtorch_at_least="2.12.0a0",
        torchscript_format=10,
        python=None,
        # From 26.03 (the pytorch backend's README); 2.75.0's release notes add AOTI BF16 inputs
        # and outputs to the pytorch backend.
        torch_aoti=True,
        sources=(
            "https://github.com/triton-inference-server/server/blob/r26.07/build.py",
            "https://github.com/triton-inference-server/server/blob/r26.03/build.py",
            "https://github.com/triton-inference-server/server/blob/r26.08/docs/introduction/compatibility.md",
            "https://onnxruntime.ai/docs/reference/compatibility.html",
            "https://github.com/pytorch/pytorch/blob/main/caffe2/serialize/versions.h",
            "https://github.com/triton-inference-server/pytorch_backend/blob/main/README.md",
            "https://github.com/triton-inference-server/server/releases/tag/v2.75.0",
        ),
        not_found=(
            "CUDA and the driver it needs: see the release notes of 26.11 before installing a driver",
            "TensorRT: plans are built in tensorrt:26.11-py3 (trt-build), so they match by construction",
            "ONNX Runtime: at least 1.27.0 (26.07's); ONNX files are judged against ONNX Runtime 1.20's "
            "opset 21 and IR 10",
            "LibTorch / PyTorch: at least 2.12.0a0 (pytorch:26.04-py3); TorchScript files from a newer "
            "torch and every AOTInductor package are refused until its exact version is written down",
            "Python of the image: the bundle's compiled stages do not depend on it",
        ),
    ),
}


#: The release docker-compose.yml (``NGC_RELEASE``'s default) and deploy/k8s pin.
PINNED_RELEASE = "26.11"


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
            f"{path}: TorchScript file format {record.format_version}, newer than {target.torch} reads "
            f"(up to {target.torchscript_format})"
        )
    newest = target.libtorch or target.libtorch_at_least
    if record.producer_torch and _version_tuple(record.producer_torch) > _version_tuple(newest):
        return (
            f"{path}: written by torch {record.producer_torch}, newer than {target.torch}; export it with "
            f"that release's torch (nvcr.io/nvidia/pytorch:{target.name}-py3)"
        )
    return ""


@dataclass(frozen=True)
class PackageRecord:
    """What the export wrote into an AOTInductor package about the torch that compiled it.

    Attributes:
        torch: the compiling torch's version.
        device: ``cpu`` or ``cuda``: where its compiled code runs.
    """

    torch: str
    device: str


def read_package_record(path: Path) -> PackageRecord:
    """The producer record of the AOTInductor package ``path`` (``<archive>/extra/producer.json``).

    Raises:
        ValueError: not a PT2 archive, or one without the record (not written by the export).
    """
    try:
        with zipfile.ZipFile(path) as archive:
            names = archive.namelist()
            if not any(name.endswith("/archive_format") for name in names):
                raise ValueError(f"{path} is not a PT2 archive (no archive_format record)")
            record = [
                n for n in names if n.count("/") == 2 and n.endswith(f"/extra/{TORCHSCRIPT_PRODUCER_RECORD}")
            ]
            if not record:
                raise ValueError(
                    f"{path} does not say which torch compiled it (no extra/{TORCHSCRIPT_PRODUCER_RECORD}: "
                    "export it with python -m export)"
                )
            fields = json.loads(archive.read(record[0]).decode())
    except zipfile.BadZipFile:
        raise ValueError(f"{path} is not a PT2 archive (not a zip file)") from None
    except (json.JSONDecodeError, UnicodeDecodeError, AttributeError):
        raise ValueError(f"{path}: its producer record is not JSON") from None
    if not isinstance(fields, dict) or not fields.get("torch") or fields.get("device") not in ("cpu", "cuda"):
        raise ValueError(f"{path}: its producer record names no torch and device ({fields!r})")
    return PackageRecord(str(fields["torch"]), str(fields["device"]))


def package_problem(path: Path, target: NgcRelease) -> str:
    """Why ``target``'s pytorch backend cannot serve the AOTInductor package ``path`` ("" : it can).

    A package runs only under the PyTorch that compiled it (same major and minor version),
    so a release whose PyTorch is not written down serves none.
    """
    if not target.torch_aoti:
        return (
            f"{path}: NGC {target.name}'s pytorch backend has no torch_aoti platform "
            "(it loads .pt2 packages from 26.03)"
        )
    try:
        record = read_package_record(path)
    except ValueError as exc:
        return str(exc)
    if target.libtorch is None:
        return (
            f"{path}: compiled by torch {record.torch}; {target.torch}, and a package loads only under "
            f"the torch that compiled it: compile it in nvcr.io/nvidia/pytorch:{target.name}-py3"
        )
    if _version_tuple(record.torch) != _version_tuple(target.libtorch):
        return (
            f"{path}: compiled by torch {record.torch}, not {target.torch}: compile it in "
            f"nvcr.io/nvidia/pytorch:{target.name}-py3"
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
    runtime = target.runtime
    if ir_version > target.onnx_ir:
        return f"{path}: ONNX IR version {ir_version}, newer than {runtime} reads (up to {target.onnx_ir})"
    opset = opsets.get("", 0)
    if opset > target.onnx_opset:
        return f"{path}: ONNX opset {opset}, newer than {runtime} implements (up to {target.onnx_opset})"
    return ""


def check_release(repository: Path, target: NgcRelease) -> list[str]:
    """One line per model file of ``repository`` that ``target``'s backends cannot serve.

    Looks at every ``<model>/<version>/model.onnx``, ``model.pt`` and ``model.pt2``; [] when all fit.
    """
    problems: list[str] = []
    judges = (
        (MODEL_FILE, onnx_problem),
        (TORCHSCRIPT_FILE, torchscript_problem),
        (AOTI_FILE, package_problem),
    )
    for file, problem in judges:
        for path in sorted(repository.glob(f"*/*/{file}")):
            if path.parent.name.isdigit():
                problems.append(problem(path, target))
    return [problem for problem in problems if problem]
