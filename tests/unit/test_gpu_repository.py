"""The gpu profile of the model repository, written from tiny trained models through the real CLI.

Every config.pbtxt must parse into a ModelConfig; the ONNX models run on
KIND_GPU (optionally through ONNX Runtime's TensorRT accelerator), and each
family gets a ``<family>_trt`` model (``tensorrt_plan``) whose plan is built
later by ``python -m export tensorrt``, which must fail with one clear line
where TensorRT is absent (as here). About 30 s: two tiny trainings + exports.
"""

from __future__ import annotations

import importlib.util
import json
import shutil
import subprocess
import sys
from pathlib import Path

import onnx
import pytest
from tritonclient.grpc import model_config_pb2 as mc

from bundle.errors import ConfigError
from bundle.repository import (
    PLAN_FILE,
    BatchProfile,
    ServingConfig,
    build_trt_config,
    default_graph_batch_sizes,
    read_config,
)
from bundle.schema import INPUTS, OUTPUTS, raw_model_name
from criteo.synth import SynthConfig, write_tsv
from export.engines.trt_build import (
    TensorRTOptions,
    build_key,
    find_trt_models,
    plan_is_current,
    resolve_profile,
    source_models,
)
from export.options import ExportOptions
from export.raw_rows import STAGE_MODEL

ONNX_MODELS = ["dlrm_onnx", "dlrm_onnx_fp16", "wide_deep_onnx", "wide_deep_onnx_fp16"]
TRT_MODELS = ["dlrm_trt", "wide_deep_trt"]
#: TorchScript for the PyTorch family only (Wide & Deep is a Keras model).
TORCH_MODELS = ["dlrm_torch"]
MAX_BATCH = 2048
INSTANCES = 2


def _stage(*args: str) -> subprocess.CompletedProcess[str]:
    """``python -m <stage> ...`` in its own process (TensorFlow and PyTorch never share one)."""
    return subprocess.run([sys.executable, "-m", *args], capture_output=True, text=True, check=False)


def _checked(*args: str) -> None:
    completed = _stage(*args)
    assert completed.returncode == 0, f"{args} failed:\n{completed.stdout}\n{completed.stderr}"


@pytest.fixture(scope="module")
def trained(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Tiny DLRM and Wide & Deep trained on 3,000 synthetic rows (``dlrm/``, ``wide_deep/``, ``rows.tsv``)."""
    root = tmp_path_factory.mktemp("gpu-profile")
    write_tsv(SynthConfig(rows=3_000, seed=5), root / "rows.tsv")
    train = ["--data", str(root / "rows.tsv"), "--preset", "tiny", "--table-size", "500"]
    _checked("models", "train", "dlrm", *train, "--out", str(root / "dlrm"))
    _checked("models", "train", "wide-deep", *train, "--out", str(root / "wide_deep"))
    return root


def _export_args(root: Path, repository: Path, *extra: str) -> list[str]:
    return [
        "--repository",
        str(repository),
        "--check-data",
        str(root / "rows.tsv"),
        "--check-rows",
        "2048",
        *extra,
    ]


@pytest.fixture(scope="module")
def gpu_repository(trained: Path) -> Path:
    """Both families exported with ``--profile gpu --ort-trt`` through ``python -m export``."""
    repository = trained / "model_repository_gpu"
    gpu = ["--profile", "gpu", "--ort-trt", "--instances", str(INSTANCES), "--max-batch-size", str(MAX_BATCH)]
    _checked(
        "export", "dlrm", "--checkpoint", str(trained / "dlrm"), *_export_args(trained, repository, *gpu)
    )
    _checked(
        "export",
        "wide-deep",
        "--saved-model",
        str(trained / "wide_deep"),
        *_export_args(trained, repository, *gpu),
    )
    return repository


def _configs(repository: Path, raw: bool = False) -> dict[str, mc.ModelConfig]:
    """The served models' configs (``raw``: the raw-row models' and their stage's instead)."""
    configs = {path.parent.name: read_config(path) for path in sorted(repository.glob("*/config.pbtxt"))}
    return {name: c for name, c in configs.items() if (name.endswith("_raw") or name == STAGE_MODEL) == raw}


def test_every_config_parses_and_every_model_is_there(gpu_repository: Path) -> None:
    configs = _configs(gpu_repository)
    assert sorted(configs) == sorted(ONNX_MODELS + TRT_MODELS + TORCH_MODELS)
    raw = _configs(gpu_repository, raw=True)
    families = [raw_model_name(family) for family in ("dlrm", "wide_deep")]
    assert sorted(raw) == sorted([STAGE_MODEL, *(raw_model_name(name) for name in configs), *families])
    for name, config in configs.items():
        assert raw[raw_model_name(name)].max_batch_size == config.max_batch_size
    for family in ("dlrm", "wide_deep"):  # the family's own: over INT8 where written, else FP32
        steps = [step.model_name for step in raw[raw_model_name(family)].ensemble_scheduling.step]
        int8 = f"{family}_onnx_int8"
        assert steps == [STAGE_MODEL, int8 if int8 in configs else f"{family}_onnx"]
    for name, config in configs.items():
        assert config.name == name
        assert [(t.name, list(t.dims)) for t in config.input] == [(s.name, list(s.shape)) for s in INPUTS]
        assert [(t.name, list(t.dims)) for t in config.output] == [(s.name, list(s.shape)) for s in OUTPUTS]
        assert [t.data_type for t in config.input] == [mc.TYPE_FP32, mc.TYPE_INT64]
        assert config.max_batch_size == MAX_BATCH
        (group,) = config.instance_group
        assert group.kind == mc.ModelInstanceGroup.KIND_GPU and group.count == INSTANCES
        # Triton's recommended start: dynamic_batching {} (no delay, no preferred sizes).
        assert config.HasField("dynamic_batching")
        assert config.dynamic_batching.max_queue_delay_microseconds == 0
        assert not config.dynamic_batching.preferred_batch_size
        assert [w.batch_size for w in config.model_warmup] == [1, 64]


def test_onnx_models_use_the_tensorrt_accelerator_with_a_cache_volume(gpu_repository: Path) -> None:
    configs = _configs(gpu_repository)
    for name in ONNX_MODELS:
        config = configs[name]
        assert config.backend == "onnxruntime" and config.default_model_filename == "model.onnx"
        assert (gpu_repository / name / "1" / "model.onnx").is_file()
        (accelerator,) = config.optimization.execution_accelerators.gpu_execution_accelerator
        parameters = dict(accelerator.parameters)
        assert accelerator.name == "tensorrt"
        assert parameters["precision_mode"] == ("FP16" if name.endswith("_fp16") else "FP32")
        assert parameters["trt_engine_cache_enable"] == "1"
        assert parameters["trt_engine_cache_path"] == f"/trt_cache/{name}"
        assert parameters["trt_profile_min_shapes"] == "dense_features:1x13,categorical_ids:1x26"
        assert parameters["trt_profile_opt_shapes"] == "dense_features:1024x13,categorical_ids:1024x26"
        assert (
            parameters["trt_profile_max_shapes"]
            == f"dense_features:{MAX_BATCH}x13,categorical_ids:{MAX_BATCH}x26"
        )


def test_torch_model_is_torchscript_for_the_pytorch_backend(gpu_repository: Path) -> None:
    (name,) = TORCH_MODELS
    config = _configs(gpu_repository)[name]
    assert config.platform == "pytorch_libtorch" and not config.backend
    assert config.default_model_filename == "model.pt"
    assert (gpu_repository / name / "1" / "model.pt").is_file()
    assert not config.optimization.execution_accelerators.gpu_execution_accelerator, "no ONNX Runtime here"
    report = json.loads((gpu_repository / name / "export_report.json").read_text())
    assert report["torchscript"]["dtype"] == "float16"
    assert report["cuda_check"]["status"] in ("skipped", "passed")


def test_trt_models_are_plans_with_cuda_graphs_over_contiguous_batches(gpu_repository: Path) -> None:
    configs = _configs(gpu_repository)
    assert find_trt_models(gpu_repository) == TRT_MODELS
    for name in TRT_MODELS:
        config = configs[name]
        assert config.platform == "tensorrt_plan" and not config.backend
        assert config.default_model_filename == PLAN_FILE
        assert (gpu_repository / name / "1").is_dir(), "the version folder waits for the plan"
        assert list((gpu_repository / name / "1").iterdir()) == [], "the plan is built by `export tensorrt`"
        cuda = config.optimization.cuda
        assert cuda.graphs
        sizes = [spec.batch_size for spec in cuda.graph_spec]
        assert sizes == [1, 2, 4, 8, 16, 32, 64, 128]
        # Each graph takes every batch above the previous graph's size: 1..128 all run as graphs.
        lower = [spec.graph_lower_bound.batch_size for spec in cuda.graph_spec]
        assert lower == [1, *(size + 1 for size in sizes[:-1])]
        for spec in cuda.graph_spec:
            for shapes in (spec.input, spec.graph_lower_bound.input):
                assert {key: list(value.dim) for key, value in shapes.items()} == {
                    s.name: list(s.shape) for s in INPUTS
                }
        assert source_models(name) == (name.replace("_trt", "_onnx_fp16"), name.replace("_trt", "_onnx"))


def test_tensorrt_command_fails_with_one_line_without_tensorrt(gpu_repository: Path) -> None:
    if importlib.util.find_spec("tensorrt") is not None:
        pytest.skip("TensorRT is installed here; tests/gpu builds the engines")
    completed = _stage("export", "tensorrt", "--repository", str(gpu_repository))
    assert completed.returncode == 1
    assert completed.stderr.strip().splitlines()[-1].startswith("error: TensorRT is not installed here")
    assert "docker compose run --rm trt-build" in completed.stderr
    assert not list(gpu_repository.glob(f"*_trt/1/{PLAN_FILE}"))


def test_engine_profile_follows_the_config(gpu_repository: Path) -> None:
    config = read_config(gpu_repository / "dlrm_trt" / "config.pbtxt")
    options = TensorRTOptions(repository=gpu_repository)
    assert resolve_profile(config, options) == BatchProfile(1, 1024, MAX_BATCH)
    bigger = TensorRTOptions(repository=gpu_repository, opt_batch=256, max_batch=4 * MAX_BATCH)
    assert resolve_profile(config, bigger) == BatchProfile(1, 256, 4 * MAX_BATCH)
    with pytest.raises(ConfigError, match="Triton would refuse the plan"):
        resolve_profile(config, TensorRTOptions(repository=gpu_repository, max_batch=MAX_BATCH // 2))
    with pytest.raises(ConfigError, match="warmup or CUDA graphs"):
        resolve_profile(config, TensorRTOptions(repository=gpu_repository, min_batch=2))
    with pytest.raises(ConfigError):
        TensorRTOptions(repository=gpu_repository, models=("dlrm_onnx",))
    with pytest.raises(ConfigError):
        BatchProfile(1, 4096, 2048)


def test_a_current_plan_is_kept_and_a_changed_onnx_is_rebuilt(gpu_repository: Path, tmp_path: Path) -> None:
    repository = tmp_path / "repo"
    shutil.copytree(gpu_repository, repository)
    model_dir = repository / "dlrm_trt"
    source = repository / "dlrm_onnx_fp16" / "1" / "model.onnx"
    device = {"name": "NVIDIA H100 80GB HBM3", "compute_capability": "9.0"}
    key = build_key(source, "10.8.0.43", device, BatchProfile(1, 1024, MAX_BATCH))
    assert not plan_is_current(model_dir, key), "no plan yet"
    (model_dir / "1" / PLAN_FILE).write_bytes(b"plan")
    (model_dir / "export_report.json").write_text(json.dumps({"build_key": key}))
    assert plan_is_current(model_dir, key)
    assert not plan_is_current(model_dir, {**key, "tensorrt": "10.9.0"})
    assert not plan_is_current(model_dir, {**key, "compute_capability": "8.0"})
    source.write_bytes(source.read_bytes() + b"\0")
    assert not plan_is_current(
        model_dir, build_key(source, "10.8.0.43", device, BatchProfile(1, 1024, MAX_BATCH))
    )


def test_cpu_export_removes_a_stale_trt_model(trained: Path, gpu_repository: Path, tmp_path: Path) -> None:
    repository = tmp_path / "repo"
    shutil.copytree(gpu_repository, repository)
    _checked("export", "dlrm", "--checkpoint", str(trained / "dlrm"), *_export_args(trained, repository))
    assert not (repository / "dlrm_trt").exists(), "a CPU server cannot load a tensorrt_plan model"
    assert (repository / "wide_deep_trt").is_dir(), "the other family is untouched"
    config = read_config(repository / "dlrm_onnx" / "config.pbtxt")
    assert config.instance_group[0].kind == mc.ModelInstanceGroup.KIND_CPU
    assert config.instance_group[0].count == 1
    assert config.dynamic_batching.max_queue_delay_microseconds == 100
    assert not config.HasField("optimization")
    # The cpu profile keeps DLRM's interaction in FP32 inside the FP16 graph.
    assert _interaction_casts(repository / "dlrm_onnx_fp16") > 0


def _interaction_casts(model_dir: Path) -> int:
    graph = onnx.load(str(model_dir / "1" / "model.onnx"), load_external_data=False).graph
    return sum(1 for node in graph.node if node.op_type == "Cast" and "/interaction/" in node.name)


def test_gpu_fp16_dlrm_has_no_fp32_islands(gpu_repository: Path) -> None:
    """In the gpu profile only the output's sigmoid stays FP32: no activation is cast inside the graph."""
    assert _interaction_casts(gpu_repository / "dlrm_onnx_fp16") == 0
    report = json.loads((gpu_repository / "dlrm_onnx_fp16" / "export_report.json").read_text())
    assert report["fp16_islands"] is False
    assert abs(report["parity"]["auc_delta"]) <= report["auc_tolerance"]


def test_instances_follow_the_profile() -> None:
    assert ServingConfig().instances == 1
    assert ServingConfig(profile="gpu").instances == 4
    assert ServingConfig(profile="gpu", instances=2).instances == 2
    with pytest.raises(ConfigError, match="instances"):
        ServingConfig(instances=-1)


def test_serving_options_that_need_the_gpu_profile() -> None:
    with pytest.raises(ConfigError, match="gpu"):
        ServingConfig(ort_trt=True)
    with pytest.raises(ConfigError, match="gpu"):
        ServingConfig(cuda_graph_batch_sizes=(1, 2))
    with pytest.raises(ConfigError, match="FP16"):
        ExportOptions(repository=Path("x"), serving=ServingConfig(profile="gpu"), fp16=False)
    with pytest.raises(ConfigError, match="TensorRT models exist only"):
        build_trt_config("dlrm_trt", ServingConfig())
    with pytest.raises(ConfigError):
        ServingConfig(profile="gpu", max_batch_size=64, cuda_graph_batch_sizes=(128,))
    no_graphs = build_trt_config("dlrm_trt", ServingConfig(profile="gpu", cuda_graph_batch_sizes=()))
    assert not no_graphs.HasField("optimization")
    assert default_graph_batch_sizes(48) == (1, 2, 4, 8, 16, 32)
    small = build_trt_config(
        "dlrm_trt", ServingConfig(profile="gpu", max_batch_size=48, warmup_batch_sizes=(1, 32))
    )
    assert [spec.batch_size for spec in small.optimization.cuda.graph_spec] == [1, 2, 4, 8, 16, 32]
