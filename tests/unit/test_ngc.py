"""The NGC releases the stack pins, and the check that a repository's files fit one."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import zipfile
from dataclasses import replace
from pathlib import Path

import onnx
import pytest
from onnx import TensorProto, helper

from bundle.ngc import (
    PINNED_RELEASE,
    RELEASES,
    TORCHSCRIPT_PRODUCER_RECORD,
    check_release,
    onnx_versions,
    package_problem,
    read_package_record,
    read_torchscript_record,
    release,
)
from bundle.repository import AOTI_FILE, MODEL_FILE, TORCHSCRIPT_FILE

ROOT = Path(__file__).resolve().parents[2]


def _onnx_model(path: Path, opset: int, ir_version: int, large: bool = False) -> Path:
    """A one-node ONNX model with the given opset and IR version (``large``: a 2 MiB initializer
    before the opsets, so the reader has to seek past the graph)."""
    initializers = [helper.make_tensor("w", TensorProto.FLOAT, [1 << 19], [0.5] * (1 << 19))] if large else []
    graph = helper.make_graph(
        [helper.make_node("Identity", ["x"], ["y"])],
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1])],
        initializers,
    )
    model = helper.make_model(
        graph, opset_imports=[helper.make_opsetid("", opset), helper.make_opsetid("ai.onnx.ml", 2)]
    )
    model.ir_version = ir_version
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(model.SerializeToString())
    return path


def _torchscript(path: Path, format_version: int, producer: str | None, data_version: bool = False) -> Path:
    """A zip laid out as torch.jit.save lays out an archive (only the records the check reads)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with zipfile.ZipFile(path, "w") as archive:
        archive.writestr("model/data.pkl", b"")
        archive.writestr("model/.data/version" if data_version else "model/version", f"{format_version}\n")
        if producer is not None:
            archive.writestr(f"model/extra/{TORCHSCRIPT_PRODUCER_RECORD}", f'{{"torch": "{producer}"}}')
    return path


def test_the_compose_default_release_is_the_pinned_one_and_its_versions_are_written_down() -> None:
    compose = (ROOT / "docker-compose.yml").read_text()
    defaults = set(re.findall(r"\$\{NGC_RELEASE:-([\d.]+)\}", compose))
    assert defaults == {PINNED_RELEASE}, "every NVIDIA image of the compose file follows one release"
    pinned = release(PINNED_RELEASE)
    assert pinned.name == PINNED_RELEASE and pinned.sources and pinned.triton
    # Every release says each fact or says it was not found, and what stands in for it.
    for known in RELEASES.values():
        fields = ("cuda", "driver", "tensorrt", "onnxruntime", "libtorch", "python")
        missing = [field for field in fields if getattr(known, field) is None]
        assert bool(known.not_found) == bool(missing), known.name
        for field in missing:
            word = {"cuda": "CUDA", "driver": "driver", "tensorrt": "TensorRT", "onnxruntime": "ONNX Runtime",
                    "libtorch": "LibTorch", "python": "Python"}[field]  # fmt: skip
            assert any(word in line for line in known.not_found), (known.name, field)
        assert known.onnxruntime in (None, known.onnxruntime_at_least)
        assert known.libtorch in (None, known.libtorch_at_least)
    # The compose file says where the versions are written down, and names the release's Triton.
    assert "bundle/ngc.py" in compose and pinned.triton in compose
    # The release before stays known, for hosts that cannot move yet.
    assert "25.01" in RELEASES and "NGC_RELEASE=25.01" in compose
    with pytest.raises(KeyError, match="is not one this bundle knows"):
        release("19.01")
    assert all(name == value.name for name, value in RELEASES.items())


@pytest.mark.parametrize("large", [False, True])
def test_the_onnx_header_reader_agrees_with_onnx(tmp_path: Path, large: bool) -> None:
    path = _onnx_model(tmp_path / "m.onnx", 17, 8, large)
    model = onnx.load(str(path))
    assert onnx_versions(path) == (model.ir_version, {o.domain: o.version for o in model.opset_import})


def test_files_newer_than_a_release_reads_are_refused_one_line_each(tmp_path: Path) -> None:
    pinned = release(PINNED_RELEASE)
    repository = tmp_path / "repo"
    fits = _onnx_model(repository / "fits" / "1" / MODEL_FILE, pinned.onnx_opset, pinned.onnx_ir)
    opset = _onnx_model(repository / "opset" / "1" / MODEL_FILE, pinned.onnx_opset + 1, pinned.onnx_ir)
    ir = _onnx_model(repository / "ir" / "1" / MODEL_FILE, pinned.onnx_opset, pinned.onnx_ir + 1)
    not_a_model = repository / "text" / "1" / MODEL_FILE
    not_a_model.parent.mkdir(parents=True)
    not_a_model.write_text("this is no model\n")
    old = _torchscript(repository / "old_torch" / "1" / TORCHSCRIPT_FILE, 3, "2.5.1")
    unknown = _torchscript(repository / "no_record_torch" / "1" / TORCHSCRIPT_FILE, 3, None)
    newer_format = _torchscript(
        repository / "format_torch" / "1" / TORCHSCRIPT_FILE,
        pinned.torchscript_format + 1,
        None,
        data_version=True,
    )
    newer_torch = _torchscript(repository / "new_torch" / "1" / TORCHSCRIPT_FILE, 3, "2.13.0+cpu")
    _onnx_model(repository / "fits" / "config_only" / MODEL_FILE, 99, 99)  # not a version folder: skipped

    assert read_torchscript_record(newer_format).format_version == pinned.torchscript_format + 1
    assert read_torchscript_record(unknown).producer_torch == ""
    problems = check_release(repository, pinned)
    runtime, libtorch = pinned.runtime, pinned.torch
    newest = pinned.torchscript_format
    assert problems == [
        f"{ir}: ONNX IR version {pinned.onnx_ir + 1}, newer than {runtime} reads (up to {pinned.onnx_ir})",
        f"{opset}: ONNX opset {pinned.onnx_opset + 1}, newer than {runtime} implements "
        f"(up to {pinned.onnx_opset})",
        f"{not_a_model} is not a readable ONNX file (wire type 4)",
        f"{newer_format}: TorchScript file format {newest + 1}, newer than {libtorch} reads (up to {newest})",
        f"{newer_torch}: written by torch 2.13.0+cpu, newer than {libtorch}; export it with that release's "
        f"torch (nvcr.io/nvidia/pytorch:{pinned.name}-py3)",
    ]
    assert not any(str(path) in " ".join(problems) for path in (fits, old, unknown))
    # A release with a newer LibTorch serves the newer torch's file.
    assert not any(
        str(newer_torch) in p for p in check_release(repository, replace(pinned, libtorch="2.13.1"))
    )


def test_the_cli_passes_a_fitting_repository_and_refuses_an_unknown_release(tmp_path: Path) -> None:
    repository = tmp_path / "repo"
    _onnx_model(repository / "m" / "1" / MODEL_FILE, 17, 8)
    command = [sys.executable, "-m", "export", "check-release", "--repository", str(repository)]
    fits = subprocess.run(command, capture_output=True, text=True, check=False)
    assert fits.returncode == 0, fits.stderr
    assert f"fits NGC {PINNED_RELEASE}" in fits.stdout
    unknown = subprocess.run([*command, "--release", "19.01"], capture_output=True, text=True, check=False)
    assert unknown.returncode == 1 and len(unknown.stderr.strip().splitlines()) == 1
    assert "'19.01' is not one this bundle knows" in unknown.stderr
    missing = subprocess.run(
        [*command[:-1], str(tmp_path / "nowhere")], capture_output=True, text=True, check=False
    )
    assert missing.returncode == 1 and "is not a model repository" in missing.stderr


def _package(path: Path, producer: str | None, device: str = "cpu") -> Path:
    """A zip laid out as an AOTInductor package (PT2 archive) with the export's producer record."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with zipfile.ZipFile(path, "w") as archive:
        archive.writestr("model/archive_format", b"pt2")
        archive.writestr("model/data/aotinductor/model/x.wrapper.so", b"\x7fELF")
        if producer is not None:
            archive.writestr(
                f"model/extra/{TORCHSCRIPT_PRODUCER_RECORD}",
                json.dumps({"torch": producer, "device": device}),
            )
    return path


def test_the_pinned_release_judges_what_it_knows_and_refuses_what_it_does_not(tmp_path: Path) -> None:
    """26.11's exact ONNX Runtime and PyTorch are in no source read: ONNX files are judged against
    the bounds an older release proves, and every AOTInductor package is refused, naming the torch
    that compiled it; a release whose PyTorch is known serves a package of its own torch only."""
    target = release("26.11")
    assert target.onnxruntime is None and target.libtorch is None and target.torch_aoti
    repository = tmp_path / "repo"
    fits = _onnx_model(repository / "fits" / "1" / MODEL_FILE, target.onnx_opset, target.onnx_ir)
    opset = _onnx_model(repository / "opset" / "1" / MODEL_FILE, target.onnx_opset + 1, target.onnx_ir)
    old_torch = _torchscript(repository / "old_torch" / "1" / TORCHSCRIPT_FILE, 3, "2.10.0")
    new_torch = _torchscript(repository / "new_torch" / "1" / TORCHSCRIPT_FILE, 3, "2.13.0+cpu")
    package = _package(repository / "pkg" / "1" / AOTI_FILE, "2.13.0+cpu")
    problems = check_release(repository, target)
    assert problems == [
        f"{opset}: ONNX opset {target.onnx_opset + 1}, newer than NGC 26.11's ONNX Runtime (version not "
        f"found; at least 1.27.0) implements (up to {target.onnx_opset})",
        f"{new_torch}: written by torch 2.13.0+cpu, newer than NGC 26.11's LibTorch (version not found; at "
        "least 2.12.0a0); export it with that release's torch (nvcr.io/nvidia/pytorch:26.11-py3)",
        f"{package}: compiled by torch 2.13.0+cpu; NGC 26.11's LibTorch (version not found; at least "
        "2.12.0a0), and a package loads only under the torch that compiled it: compile it in "
        "nvcr.io/nvidia/pytorch:26.11-py3",
    ]
    assert not any(str(path) in " ".join(problems) for path in (fits, old_torch))

    # Once the release's PyTorch is written down, a package of that torch fits and another is refused.
    known = replace(target, libtorch="2.13.0a0+nv26.11", libtorch_at_least="2.13.0a0+nv26.11")
    assert package_problem(package, known) == ""
    other = _package(tmp_path / "other" / AOTI_FILE, "2.12.1")
    assert package_problem(other, known) == (
        f"{other}: compiled by torch 2.12.1, not NGC 26.11's LibTorch 2.13.0a0+nv26.11: compile it in "
        "nvcr.io/nvidia/pytorch:26.11-py3"
    )
    # A release before torch_aoti, a package without the export's record, and bytes that are no package.
    assert "has no torch_aoti platform" in package_problem(package, release("25.01"))
    unrecorded = _package(tmp_path / "unrecorded" / AOTI_FILE, None)
    assert "does not say which torch compiled it" in package_problem(unrecorded, known)
    noise = tmp_path / "noise" / AOTI_FILE
    noise.parent.mkdir()
    noise.write_bytes(bytes(range(256)) * 4)
    assert package_problem(noise, known) == f"{noise} is not a PT2 archive (not a zip file)"
    assert read_package_record(package).device == "cpu"


def test_check_release_on_the_cli_says_what_is_not_known(tmp_path: Path) -> None:
    repository = tmp_path / "repo"
    _onnx_model(repository / "m" / "1" / MODEL_FILE, 17, 8)
    command = [sys.executable, "-m", "export", "check-release", "--repository", str(repository)]
    fits = subprocess.run([*command, "--release", "26.11"], capture_output=True, text=True, check=False)
    assert fits.returncode == 0, fits.stderr
    assert fits.stdout.count("NGC 26.11, not found in any source read: ") == len(release("26.11").not_found)
    assert (
        "fits NGC 26.11 (NGC 26.11's ONNX Runtime (version not found; at least 1.27.0): opset <= 21"
        in fits.stdout
    )
    _package(repository / "pkg" / "1" / AOTI_FILE, "2.13.0+cpu")
    refused = subprocess.run([*command, "--release", "26.11"], capture_output=True, text=True, check=False)
    assert refused.returncode == 1 and "compiled by torch 2.13.0+cpu" in refused.stdout
    assert refused.stderr.strip().splitlines()[-1].endswith("cannot be served by NGC 26.11")
