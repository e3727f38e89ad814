"""``<family>_torch``: TorchScript for Triton's PyTorch backend, exported and checked on the CPU.

A tiny DLRM trained in seconds, and the models users bring (a facebookresearch
checkpoint, a traced TorchScript file), each exported through
:func:`export.pipeline.export_family` with the TorchScript variant asked for.
FP16 and BF16 run on this CPU (torch's CPU kernels have both); the FP32 trace of
the same wrapper must equal the framework, so the only difference left in the
variant is its precision. The CUDA side is in ``tests/gpu/test_torch_cuda.py``.
"""

from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
import torch
from tritonclient.grpc import model_config_pb2 as mc

from bundle.errors import ConfigError
from bundle.ngc import PINNED_RELEASE, check_release, read_torchscript_record, release
from bundle.repository import TORCH_PLATFORM, TORCHSCRIPT_FILE, read_config, torch_model_name, version_dir
from bundle.schema import INPUTS, OUTPUTS
from criteo.synth import SynthConfig, write_tsv
from criteo.tsv import Batch, read_batch
from export.engines.torchscript import reduced_precision, run_torchscript, write_torchscript
from export.framework import example_inputs
from export.graphs.parity import check_rows, extreme_id_rows
from export.importers.dlrm_sources import open_dlrm_source
from export.importers.onnx_dlrm import DLRMExporter
from export.importers.sources import SourceOptions
from export.options import ExportOptions
from export.pipeline import TORCH_MAX_ABS_DIFF, ExportedModel, export_family
from models.config import DLRMConfig, TrainConfig
from models.train_dlrm import train_dlrm
from tests.byom_torch import TABLE_SIZES, FacebookAdapter, make_facebook_net, save_facebook_checkpoint

# The test's own facebookresearch-layout module builds its pair lists with torch.tensor (as the source does).
pytestmark = pytest.mark.filterwarnings("ignore::torch.jit.TracerWarning")

NAME = torch_model_name("dlrm")
CHECK_ROWS = 2048
#: Bound on |FP16 TorchScript - PyTorch FP32| for the tiny model on this CPU (measured: 3.0e-4
#: on 2048 check rows, 2.1e-4 on the out-of-range-id rows; the small preset: 8.0e-4), ~3x headroom.
FP16_MAX_ABS = 1e-3
#: The same for BF16 (its 8-bit mantissa; measured 2.1e-3 here, 6.3e-3 on the small preset).
BF16_MAX_ABS = 1e-2


@pytest.fixture(scope="module")
def labeled_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("data") / "rows.tsv"
    write_tsv(SynthConfig(rows=4000, seed=21), path)
    return path


@pytest.fixture(scope="module")
def exporter(tmp_path_factory: pytest.TempPathFactory, labeled_file: Path) -> DLRMExporter:
    out = tmp_path_factory.mktemp("dlrm")
    train_dlrm(labeled_file, out, DLRMConfig.preset("tiny", table_size=500), TrainConfig(batch_size=256))
    return DLRMExporter(out)


def _options(repository: Path, data: Path, **changes: object) -> ExportOptions:
    settings: dict[str, object] = {"fp16": True, "int8": False, "torch": True, "check_rows": CHECK_ROWS}
    settings.update(changes)
    return ExportOptions(repository=repository, check_data=data, **settings)  # type: ignore[arg-type]


@pytest.fixture(scope="module")
def exported(
    tmp_path_factory: pytest.TempPathFactory, exporter: DLRMExporter, labeled_file: Path
) -> tuple[Path, list[ExportedModel]]:
    repository = tmp_path_factory.mktemp("repo")
    return repository, export_family(exporter, _options(repository, labeled_file))


@pytest.fixture(scope="module")
def rows(labeled_file: Path) -> Batch:
    return read_batch(labeled_file, 512)


def _report(repository: Path, name: str = NAME) -> dict:  # type: ignore[type-arg]
    return json.loads((repository / name / "export_report.json").read_text())


def test_dlrm_torch_has_a_pytorch_config_with_the_schemas_tensors(
    exported: tuple[Path, list[ExportedModel]],
) -> None:
    repository, results = exported
    assert [r.name for r in results] == ["dlrm_onnx", "dlrm_onnx_fp16", NAME]
    assert (version_dir(repository, NAME) / TORCHSCRIPT_FILE).is_file()
    config = read_config(repository / NAME / "config.pbtxt")
    assert config.name == NAME and config.platform == TORCH_PLATFORM and not config.backend
    assert config.default_model_filename == TORCHSCRIPT_FILE
    assert [(t.name, t.data_type, list(t.dims)) for t in config.input] == [
        (s.name, mc.TYPE_FP32 if s.dtype == np.float32 else mc.TYPE_INT64, list(s.shape)) for s in INPUTS
    ]
    assert [(t.name, t.data_type, list(t.dims)) for t in config.output] == [
        (s.name, mc.TYPE_FP32, list(s.shape)) for s in OUTPUTS
    ]
    (group,) = config.instance_group
    assert group.kind == mc.ModelInstanceGroup.KIND_CPU, "the cpu profile's instances are KIND_CPU"
    assert config.parameters["INFERENCE_MODE"].string_value == "true"


def test_the_report_holds_parity_out_of_range_ids_and_the_skipped_cuda_checks(
    exported: tuple[Path, list[ExportedModel]],
) -> None:
    repository, _ = exported
    report = _report(repository)
    parity = report["parity"]
    assert report["checked_against"] == "framework"
    assert parity["rows"] == CHECK_ROWS + 64, "the check rows and the out-of-range-id rows"
    assert 0 < parity["max_abs_diff"] <= FP16_MAX_ABS <= report["max_abs_tolerance"] == TORCH_MAX_ABS_DIFF
    assert abs(parity["auc_delta"]) <= report["auc_tolerance"] == 1e-3
    script = report["torchscript"]
    assert script["dtype"] == "float16" and script["fp32_modules"] == ["model.interaction"]
    assert script["sigmoid"] == "fp32, appended" and script["id_reduction_added"] is False
    assert script["cpu_device_constants"] == 0, "the file must load onto any device"
    assert "opset" not in report
    if not torch.cuda.is_available():
        assert report["cuda_check"] == {
            "status": "skipped",
            "reason": f"torch {torch.__version__} sees no CUDA device",
        }
    import onnxruntime as ort

    fp16_check = _report(repository, "dlrm_onnx_fp16")["cuda_check"]
    if "CUDAExecutionProvider" not in ort.get_available_providers():
        assert fp16_check["status"] == "skipped"
        assert "has no CUDAExecutionProvider" in fp16_check["reason"]
        assert "onnxruntime-gpu" in fp16_check["reason"]
    assert "cuda_check" not in _report(repository, "dlrm_onnx"), "the FP32 model is checked on the CPU only"


def test_the_file_records_its_torch_and_a_release_with_an_older_libtorch_refuses_it(
    exported: tuple[Path, list[ExportedModel]], tmp_path: Path
) -> None:
    repository, _ = exported
    path = version_dir(repository, NAME) / TORCHSCRIPT_FILE
    script = _report(repository)["torchscript"]
    assert script["torch_version"] == torch.__version__
    record = read_torchscript_record(path)
    assert (
        record.producer_torch == torch.__version__ and record.format_version == script["archive_format"] >= 3
    )
    # The file still loads as before: the record is an extra file torch itself keeps.
    assert torch.jit.load(str(path)).forward.schema is not None

    older = replace(release(PINNED_RELEASE), name="older", libtorch="2.6.0a0+ecf3bae40a")
    newer = replace(older, name="newer", libtorch=f"{torch.__version__.split('.')[0]}.99.0")
    (problem,) = check_release(repository, older)
    assert problem == (
        f"{path}: written by torch {torch.__version__}, newer than NGC older's LibTorch 2.6.0a0+ecf3bae40a; "
        "export it with that release's torch (nvcr.io/nvidia/pytorch:older-py3)"
    )
    assert check_release(repository, newer) == []
    # The CLI: one line per file, exit 1; the pinned release (LibTorch 2.6) refuses this torch's file.
    command = [sys.executable, "-m", "export", "check-release", "--repository", str(repository)]
    completed = subprocess.run(command, capture_output=True, text=True, check=False)
    assert completed.returncode == 1
    assert f"{path}: written by torch {torch.__version__}" in completed.stdout
    assert completed.stderr.strip().splitlines()[-1].endswith(f"cannot be served by NGC {PINNED_RELEASE}")


def test_the_traced_forward_takes_the_schemas_tensor_names(
    exported: tuple[Path, list[ExportedModel]],
) -> None:
    repository, _ = exported
    module = torch.jit.load(str(version_dir(repository, NAME) / TORCHSCRIPT_FILE))
    arguments = [argument.name for argument in module.forward.schema.arguments]
    assert arguments == ["self", *(spec.name for spec in INPUTS)]


def test_ids_of_any_int64_value_answer_as_their_reduced_ids(
    exported: tuple[Path, list[ExportedModel]], exporter: DLRMExporter, rows: Batch
) -> None:
    repository, _ = exported
    path = version_dir(repository, NAME) / TORCHSCRIPT_FILE
    extreme = extreme_id_rows(rows, 64)
    reduced = Batch(extreme.dense, np.mod(extreme.categorical, np.asarray(exporter.table_sizes)), None)
    got = run_torchscript(path, extreme)
    assert got.dtype == np.float32 and got.shape == (64, 1)
    assert np.all(np.isfinite(got)) and np.all((got >= 0) & (got <= 1))
    np.testing.assert_array_equal(got, run_torchscript(path, reduced))
    np.testing.assert_allclose(got, exporter.predict(extreme), atol=FP16_MAX_ABS, rtol=0)


def test_the_wrapper_traced_in_fp32_equals_the_framework(exporter: DLRMExporter, rows: Batch) -> None:
    """Only the precision differs between the variant and PyTorch: in FP32 the traced wrapper
    (id reduction, islands, the FP32 sigmoid after the logits) gives the framework's answers."""
    traced = torch.jit.trace(
        reduced_precision(exporter.torch_serving(), torch.float32), example_inputs(), check_trace=False
    )
    for batch in (rows, extreme_id_rows(rows, 64)):
        with torch.no_grad():
            got = traced(torch.from_numpy(batch.dense), torch.from_numpy(batch.categorical)).numpy()
        np.testing.assert_allclose(got, exporter.predict(batch), atol=1e-6, rtol=0)


def test_the_exporters_module_stays_fp32(
    exported: tuple[Path, list[ExportedModel]], exporter: DLRMExporter
) -> None:
    assert {p.dtype for p in exporter.model.parameters()} == {torch.float32}
    assert not any(type(m).__name__ == "Float32Island" for m in exporter.model.modules())


def test_bfloat16_variant_is_gated_the_same_way(
    exporter: DLRMExporter, labeled_file: Path, tmp_path: Path
) -> None:
    path = tmp_path / TORCHSCRIPT_FILE
    built = write_torchscript(exporter.torch_serving(), "bfloat16", path)
    assert built["dtype"] == "bfloat16"
    module = torch.jit.load(str(path))
    weights = {p.dtype for name, p in module.named_parameters() if "interaction" not in name}
    assert weights == {torch.bfloat16}
    batch = check_rows(labeled_file, 1024)
    diff = np.abs(run_torchscript(path, batch) - exporter.predict(batch)).max()
    assert 0 < diff <= BF16_MAX_ABS


def test_a_later_export_without_the_variant_removes_it(
    exporter: DLRMExporter, labeled_file: Path, tmp_path: Path
) -> None:
    export_family(exporter, _options(tmp_path, labeled_file, fp16=False))
    assert (tmp_path / NAME / "config.pbtxt").is_file()
    results = export_family(exporter, _options(tmp_path, labeled_file, fp16=False, torch=None))
    assert [r.name for r in results] == ["dlrm_onnx"], "the cpu profile writes no TorchScript by default"
    assert not (tmp_path / NAME).exists()


def test_an_unknown_precision_is_refused(tmp_path: Path) -> None:
    with pytest.raises(
        ConfigError, match="unknown TorchScript precision 'float8'; choose one of float16, bfloat16"
    ):
        ExportOptions(repository=tmp_path, torch_dtype="float8")


def test_facebookresearch_checkpoint_keeps_its_dot_interaction_fp32(
    labeled_file: Path, tmp_path: Path
) -> None:
    checkpoint = save_facebook_checkpoint(make_facebook_net(seed=4), tmp_path / "fb.pt")
    exporter = open_dlrm_source(checkpoint, SourceOptions())
    results = export_family(exporter, _options(tmp_path / "repo", labeled_file, fp16=False))
    assert [r.name for r in results] == ["dlrm_onnx", NAME]
    script = _report(tmp_path / "repo")["torchscript"]
    assert script["fp32_modules"] == ["model.interaction"] and script["cpu_device_constants"] == 0
    path = version_dir(tmp_path / "repo", NAME) / TORCHSCRIPT_FILE
    extreme = extreme_id_rows(check_rows(labeled_file, 256), 64)
    np.testing.assert_allclose(run_torchscript(path, extreme), exporter.predict(extreme), atol=FP16_MAX_ABS)


def test_a_users_torchscript_gets_the_id_reduction_and_a_device_warning(
    labeled_file: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A traced module that builds its bag offsets with ``torch.arange`` pins them to the CPU: the
    export says so (its check on a GPU decides); ids past its tables are reduced by the wrapper."""
    adapter = FacebookAdapter(make_facebook_net(seed=6)).eval()
    torch.jit.save(torch.jit.trace(adapter, example_inputs(TABLE_SIZES)), tmp_path / "user.pt")
    exporter = open_dlrm_source(tmp_path / "user.pt", SourceOptions())
    with caplog.at_level("WARNING", logger="export.engines.torchscript"):
        export_family(exporter, _options(tmp_path / "repo", labeled_file, fp16=False))
    script = _report(tmp_path / "repo")["torchscript"]
    assert script["fp32_modules"] == [] and script["id_reduction_added"] is True
    assert script["cpu_device_constants"] >= 1
    assert "creates tensors on the CPU in forward" in caplog.text
    path = version_dir(tmp_path / "repo", NAME) / TORCHSCRIPT_FILE
    extreme = extreme_id_rows(check_rows(labeled_file, 256), 64)
    np.testing.assert_allclose(run_torchscript(path, extreme), exporter.predict(extreme), atol=FP16_MAX_ABS)


def test_cli_writes_the_variant_in_the_asked_precision(
    exporter: DLRMExporter, labeled_file: Path, tmp_path: Path
) -> None:
    args = ["--checkpoint", str(exporter.checkpoint), "--repository", str(tmp_path), "--check-data",
            str(labeled_file), "--check-rows", "1024", "--no-fp16", "--no-int8", "--torch",
            "--torch-dtype", "bfloat16"]  # fmt: skip
    completed = subprocess.run(
        [sys.executable, "-m", "export", "dlrm", *args], capture_output=True, text=True, check=False
    )
    assert completed.returncode == 0, completed.stderr
    assert NAME in completed.stdout
    assert _report(tmp_path)["torchscript"]["dtype"] == "bfloat16"
    wrong = subprocess.run(
        [sys.executable, "-m", "export", "dlrm", *args[:-1], "int4"],
        capture_output=True,
        text=True,
        check=False,
    )
    assert wrong.returncode == 1
    assert wrong.stderr.strip().splitlines()[-1] == (
        "error: unknown TorchScript precision 'int4'; choose one of float16, bfloat16"
    )
