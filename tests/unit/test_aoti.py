"""``<family>_aoti``: an AOTInductor package (``model.pt2``) in an ensemble, exported and checked on the CPU.

The bundle's tiny DLRM is compiled once for the module (an AOTInductor compile is the slow part:
the C++ compiler runs); every test reads that package or a copy of it changed on purpose. What is
checked: the package's dynamic batch (one row at a time and a large batch), the producer record
and call spec it carries, the configs written for it (parsed back), the gate that refuses a
package which differs from PyTorch eager, a failed export that leaves no model behind, damaged
files that fail in one line, and the local ``pytorch`` backend loading the package by either
naming convention and refusing one compiled by another torch or for another device.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import types
import zipfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from tritonclient.grpc import model_config_pb2 as mc

from bundle.errors import ConfigError, ExportError
from bundle.ngc import TORCHSCRIPT_PRODUCER_RECORD, read_package_record
from bundle.repository import (
    AOTI_FILE,
    AOTI_PLATFORM,
    AOTI_RESULT,
    ENSEMBLE_PLATFORM,
    PYTORCH_BACKEND,
    ServingConfig,
    aoti_input_name,
    aoti_model_name,
    aoti_package_name,
    build_aoti_config,
    build_aoti_ensemble_config,
    read_config,
    read_report,
    version_dir,
)
from bundle.schema import INPUTS, OUTPUT, OUTPUTS
from criteo.tsv import Batch, read_batch
from export.engines import aoti
from export.engines.aoti import compile_device, package_metadata, run_aoti
from export.graphs.parity import check_rows, extreme_id_rows
from export.importers.onnx_dlrm import DLRMExporter
from export.options import ExportOptions
from export.pipeline import AOTI_MAX_ABS_DIFF, _aoti_gate, _export_aoti, export_family
from models.config import DLRMConfig, TrainConfig
from models.train_dlrm import train_dlrm
from tests.python_backends import ModelException, import_backend, load_instance

NAME, PACKAGE = aoti_model_name("dlrm"), aoti_package_name("dlrm")
CHECK_ROWS = 1024


@pytest.fixture(scope="module")
def exporter(tmp_path_factory: pytest.TempPathFactory, labeled_file: Path) -> DLRMExporter:
    out = tmp_path_factory.mktemp("dlrm")
    train_dlrm(labeled_file, out, DLRMConfig.preset("tiny", table_size=500), TrainConfig(batch_size=256))
    return DLRMExporter(out)


def _options(repository: Path, data: Path, **changes: Any) -> ExportOptions:
    settings: dict[str, Any] = {"fp16": False, "int8": False, "aoti": True, "raw_rows": False}
    settings.update(changes)
    return ExportOptions(repository=repository, check_data=data, check_rows=CHECK_ROWS, **settings)


@pytest.fixture(scope="module")
def repository(tmp_path_factory: pytest.TempPathFactory, exporter: DLRMExporter, labeled_file: Path) -> Path:
    """dlrm_onnx and dlrm_aoti (cpu profile), compiled once for the module."""
    repository = tmp_path_factory.mktemp("repo") / "model_repository"
    written = export_family(exporter, _options(repository, labeled_file))
    assert [model.name for model in written] == ["dlrm_onnx", NAME]
    return repository


@pytest.fixture(scope="module")
def package(repository: Path) -> Path:
    return version_dir(repository, PACKAGE) / AOTI_FILE


@pytest.fixture(scope="module")
def held_out(labeled_file: Path) -> Batch:
    """Rows after the check rows, ids far outside the tables among them."""
    rows = read_batch(labeled_file, CHECK_ROWS + 300).slice(CHECK_ROWS, CHECK_ROWS + 300)
    extreme = extreme_id_rows(rows, 40)
    return Batch(
        np.concatenate([rows.dense, extreme.dense]),
        np.concatenate([rows.categorical, extreme.categorical]),
        None,
    )


def _one_line(message: str) -> bool:
    return bool(message) and "\n" not in message


def test_the_package_runs_one_row_at_a_time_and_large_batches_as_eager_does(
    exporter: DLRMExporter, package: Path, held_out: Batch
) -> None:
    expected = exporter.predict(held_out)
    one_by_one = run_aoti(package, held_out.slice(0, 5), chunk=1)
    whole = run_aoti(package, held_out)  # 340 rows in one call
    assert whole.shape == (len(held_out), 1) and whole.dtype == np.float32
    assert float(np.max(np.abs(whole - expected))) <= AOTI_MAX_ABS_DIFF
    assert float(np.max(np.abs(one_by_one - expected[:5]))) <= AOTI_MAX_ABS_DIFF


def test_the_package_records_its_producer_and_the_schema_names_in_its_call_spec(package: Path) -> None:
    from torch.export.pt2_archive._package import load_pt2

    record = read_package_record(package)
    assert (record.torch, record.device) == (torch.__version__, "cpu")
    extra = load_pt2(package).extra_files[TORCHSCRIPT_PRODUCER_RECORD]
    assert json.loads(extra) == {"torch": torch.__version__, "device": "cpu"}
    assert package_metadata(package)[aoti.DEVICE_KEY] == "cpu"
    call_spec = torch._inductor.aoti_load_package(str(package)).loader.get_call_spec()
    inputs = json.loads(call_spec[0])[1]["children_spec"][1]
    assert json.loads(inputs["context"]) == [spec.name for spec in INPUTS]


def test_the_configs_parse_back_and_the_report_records_the_compile(repository: Path) -> None:
    inner = read_config(repository / PACKAGE / "config.pbtxt")
    assert (inner.platform, inner.backend, inner.default_model_filename) == (
        AOTI_PLATFORM,
        PYTORCH_BACKEND,
        AOTI_FILE,
    )
    assert [tensor.name for tensor in inner.input] == [aoti_input_name(spec.name) for spec in INPUTS]
    assert [tensor.name for tensor in inner.output] == [AOTI_RESULT]
    assert inner.max_batch_size == 4096 and inner.HasField("dynamic_batching")
    assert [group.kind for group in inner.instance_group] == [mc.ModelInstanceGroup.KIND_CPU]
    assert all(set(w.inputs) == {tensor.name for tensor in inner.input} for w in inner.model_warmup)
    ensemble = read_config(repository / NAME / "config.pbtxt")
    assert ensemble.platform == ENSEMBLE_PLATFORM and ensemble.max_batch_size == inner.max_batch_size
    assert [t.name for t in ensemble.input] == [s.name for s in INPUTS]
    assert [t.name for t in ensemble.output] == [s.name for s in OUTPUTS]
    (step,) = ensemble.ensemble_scheduling.step
    assert step.model_name == PACKAGE
    assert dict(step.input_map) == {aoti_input_name(s.name): s.name for s in INPUTS}
    assert dict(step.output_map) == {AOTI_RESULT: OUTPUT}
    report = read_report(repository, NAME)
    assert report["torch_version"] == torch.__version__ and report["device"] == "cpu"
    assert report["compile_seconds"] > 0 and report["package_model"] == PACKAGE
    assert report["parity"]["max_abs_diff"] <= report["max_abs_tolerance"] == AOTI_MAX_ABS_DIFF
    assert report["check_batch_sizes"][0] == 1


def test_the_gpu_profile_config_has_gpu_instances_and_bags_of_any_size_have_no_package() -> None:
    gpu = build_aoti_config(PACKAGE, ServingConfig(profile="gpu"))
    assert {group.kind for group in gpu.instance_group} == {mc.ModelInstanceGroup.KIND_GPU}
    hotness = (2,) * 26
    multihot = build_aoti_ensemble_config(NAME, PACKAGE, ServingConfig(hotness=hotness))
    assert list(multihot.input[1].dims) == [sum(hotness)]
    with pytest.raises(ConfigError, match="bags of any size"):
        build_aoti_config(PACKAGE, ServingConfig(variable_bags=True))


def test_it_is_off_unless_asked_and_only_pytorch_models_take_it(tmp_path: Path) -> None:
    from export.__main__ import _export_options

    # Off unless asked, in either profile: a package loads only under the torch that compiled it.
    assert not ExportOptions(repository=tmp_path).aoti
    assert not _export_options(profile="gpu")[0].aoti
    assert _export_options(aoti=True)[0].aoti is True
    with pytest.raises(ConfigError, match="--aoti: wide_deep is not a PyTorch model"):
        export_family(types.SimpleNamespace(family="wide_deep"), ExportOptions(tmp_path, aoti=True))  # type: ignore[arg-type]
    bags = types.SimpleNamespace(family="dlrm", variable_bags=True, torch_serving=lambda: None)
    with pytest.raises(ConfigError, match="--aoti: an AOTInductor package takes categorical_ids"):
        export_family(bags, ExportOptions(tmp_path, aoti=True))  # type: ignore[arg-type]
    assert not tmp_path.joinpath(NAME).exists()


def test_without_a_gpu_a_gpu_profile_package_is_compiled_for_the_cpu_and_served_there(
    exporter: DLRMExporter,
    package: Path,
    labeled_file: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    if torch.cuda.is_available():
        pytest.skip("torch sees a GPU here")
    assert compile_device("cpu") == ("cpu", None)
    with caplog.at_level(logging.WARNING, logger=aoti.__name__):
        device, note = compile_device("gpu")
    assert device == "cpu" and note is not None and "sees no CUDA device" in note
    assert [r.getMessage() for r in caplog.records] == [note]
    gpu = ServingConfig(profile="gpu")

    def copy_package(serving: object, out: Path, max_batch_size: int, device: str = "cpu") -> dict[str, Any]:
        shutil.copyfile(package, out)  # the module's package (compiled for the CPU), without a second compile
        return {"device": device}

    monkeypatch.setattr(aoti, "write_aoti", copy_package)
    asked = tmp_path / "asked"
    rows = read_batch(labeled_file, CHECK_ROWS)
    _export_aoti(exporter, exporter, rows, _options(asked, labeled_file, serving=gpu, fp16=True))
    groups = read_config(asked / PACKAGE / "config.pbtxt").instance_group
    assert [group.kind for group in groups] == [mc.ModelInstanceGroup.KIND_CPU]
    assert read_report(asked, NAME)["device_note"] == note


def test_the_gate_refuses_a_package_that_differs_from_eager(
    exporter: DLRMExporter, package: Path, labeled_file: Path, tmp_path: Path
) -> None:
    rows = read_batch(labeled_file, CHECK_ROWS)
    extreme = extreme_id_rows(rows)
    reference, extreme_reference = exporter.predict(rows), exporter.predict(extreme)
    options = _options(tmp_path, labeled_file)
    parity, extra = _aoti_gate(package, "cpu", rows, reference, extreme, extreme_reference, options)
    assert (
        parity.max_abs_diff <= AOTI_MAX_ABS_DIFF
        and extra["max_abs_diff_one_row_at_a_time"] <= AOTI_MAX_ABS_DIFF
    )
    # Another model's answers (eager moved by 1e-3): the package no longer matches them.
    moved = np.clip(reference + np.float32(1e-3), 0, 1)
    with pytest.raises(ExportError, match="differs from the framework") as error:
        _aoti_gate(package, "cpu", rows, moved, extreme, extreme_reference, options)
    assert _one_line(str(error.value)) and f"tolerance {AOTI_MAX_ABS_DIFF:g}" in str(error.value)


def test_a_package_that_fails_its_check_leaves_no_model_behind(
    exporter: DLRMExporter, package: Path, labeled_file: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def copy_package(serving: object, out: Path, max_batch_size: int, device: str = "cpu") -> dict[str, Any]:
        shutil.copyfile(package, out)  # the module's package, without a second compile
        return {"device": device}

    monkeypatch.setattr(aoti, "write_aoti", copy_package)
    monkeypatch.setattr(exporter, "predict", lambda batch: np.full((len(batch), 1), 0.5, np.float32))
    repository = tmp_path / "repo"
    rows = read_batch(labeled_file, CHECK_ROWS)
    with pytest.raises(ExportError, match="differs from the framework"):
        _export_aoti(exporter, exporter, rows, _options(repository, labeled_file))
    assert not (repository / NAME).exists() and not (repository / PACKAGE).exists()


def _copy_package(source: Path, target: Path, change: Callable[[str, bytes], bytes | None]) -> Path:
    """A copy of the package at ``source`` whose records ``change`` rewrites (None drops one)."""
    target.parent.mkdir(parents=True, exist_ok=True)
    with zipfile.ZipFile(source) as old, zipfile.ZipFile(target, "w") as new:
        for info in old.infolist():
            data = change(info.filename, old.read(info))
            if data is not None:
                new.writestr(info, data)
    return target


def test_damaged_packages_fail_in_one_line(
    package: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # torch unpacks a package into $TMPDIR and leaves the folder behind when the load fails.
    monkeypatch.setenv("TMPDIR", str(tmp_path))
    rows = check_rows(None, 1024).slice(0, 4)
    noise = tmp_path / "noise" / AOTI_FILE
    noise.parent.mkdir()
    noise.write_bytes(os.urandom(4096))
    truncated = tmp_path / "truncated" / AOTI_FILE
    truncated.parent.mkdir()
    truncated.write_bytes(package.read_bytes()[: package.stat().st_size // 2])
    broken = _copy_package(
        package,
        tmp_path / "broken" / AOTI_FILE,
        lambda name, data: b"\x7fELF" if name.endswith(".so") else data,
    )
    for path, reason in ((noise, "not a zip"), (truncated, "not a zip"), (broken, "cannot load")):
        with pytest.raises(ExportError, match=reason) as error:
            run_aoti(path, rows)
        assert _one_line(str(error.value)) and str(path) in str(error.value)


# ------------------------------------------------------------------ the local pytorch backend


@pytest.fixture
def backend(monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    """The local pytorch backend's ``model`` module, imported as the stub imports it."""
    yield import_backend(monkeypatch, "pytorch", "pytorch_backend_model")


def test_the_backend_answers_as_the_package_by_either_naming_convention(
    backend: Any, package: Path, held_out: Batch
) -> None:
    config = build_aoti_config(PACKAGE, ServingConfig())
    expected = run_aoti(package, held_out)
    feeds = {aoti_input_name(name): array for name, array in held_out.inputs().items()}
    instance = load_instance(backend, package.parents[1], config)
    ((served,),) = instance._run([feeds])
    np.testing.assert_array_equal(served, expected)
    # Ordinal names, and the config as the local server's view gives it (no platform: the file decides).
    for tensor, name in zip(config.input, ("INPUT__0", "INPUT__1"), strict=True):
        tensor.name = name
    config.output[0].name = "OUTPUT__0"
    config.ClearField("model_warmup")
    config.ClearField("platform")
    ordinal = load_instance(backend, package.parents[1], config)
    ((served,),) = ordinal._run(
        [dict(zip(("INPUT__0", "INPUT__1"), held_out.inputs().values(), strict=True))]
    )
    np.testing.assert_array_equal(served, expected)
    assert not backend.warnings


def test_the_backend_refuses_names_the_call_spec_lacks_in_one_line(backend: Any, package: Path) -> None:
    config = build_aoti_config(PACKAGE, ServingConfig())
    config.input[0].name = "KWARGS[dense]"
    config.ClearField("model_warmup")
    with pytest.raises(ModelException, match=r"KWARGS\[dense\]") as error:
        load_instance(backend, package.parents[1], config)
    assert _one_line(str(error.value)) and "KWARGS[dense_features]" in str(error.value)


def test_the_backend_refuses_another_torchs_package_and_another_devices(
    backend: Any, package: Path, tmp_path: Path
) -> None:
    config = build_aoti_config(PACKAGE, ServingConfig())

    def producer(torch_version: str) -> Callable[[str, bytes], bytes | None]:
        def change(name: str, data: bytes) -> bytes:
            if name.endswith(f"/extra/{TORCHSCRIPT_PRODUCER_RECORD}"):
                return json.dumps({"torch": torch_version, "device": "cpu"}).encode()
            return data

        return change

    older = _copy_package(package, tmp_path / "older" / "1" / AOTI_FILE, producer("2.9.1+cu128"))
    with pytest.raises(ModelException, match=r"compiled by torch 2\.9\.1\+cu128.*torch is ") as error:
        load_instance(backend, older.parents[1], config)
    assert _one_line(str(error.value)) and torch.__version__ in str(error.value)

    def for_cuda(name: str, data: bytes) -> bytes:
        if name.endswith("_metadata.json") and b"AOTI_DEVICE_KEY" in data:
            return data.replace(b'"AOTI_DEVICE_KEY": "cpu"', b'"AOTI_DEVICE_KEY": "cuda"')
        return data

    cuda = _copy_package(package, tmp_path / "cuda" / "1" / AOTI_FILE, for_cuda)
    with pytest.raises(ModelException, match="compiled for cuda, but its instance is KIND_CPU") as error:
        load_instance(backend, cuda.parents[1], config)
    assert _one_line(str(error.value))
    # The same release under another local label (a CUDA build of it) is the same torch.
    same = _copy_package(
        package, tmp_path / "same" / "1" / AOTI_FILE, producer(torch.__version__.split("+")[0])
    )
    load_instance(backend, same.parents[1], config)
    # A package without the record loads, with a warning that its torch is unknown.
    unrecorded = _copy_package(
        package,
        tmp_path / "unrecorded" / "1" / AOTI_FILE,
        lambda name, data: None if name.endswith(f"/extra/{TORCHSCRIPT_PRODUCER_RECORD}") else data,
    )
    load_instance(backend, unrecorded.parents[1], config)
    assert len(backend.warnings) == 1 and "no producer record" in backend.warnings[0]


def test_the_backend_names_a_damaged_package_in_one_line(backend: Any, tmp_path: Path) -> None:
    path = tmp_path / "1" / AOTI_FILE
    path.parent.mkdir()
    path.write_bytes(os.urandom(2048))
    with pytest.raises(ModelException, match="not a PT2 archive") as error:
        load_instance(backend, tmp_path, build_aoti_config(PACKAGE, ServingConfig()))
    assert _one_line(str(error.value))
    assert backend.PRODUCER_RECORD == TORCHSCRIPT_PRODUCER_RECORD and backend.AOTI_PLATFORM == AOTI_PLATFORM
