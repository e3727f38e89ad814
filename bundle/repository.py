"""The contract of a Triton model repository: names, layout, configs and export reports.

Every config.pbtxt is built as a ``model_config_pb2.ModelConfig`` message and
written with ``text_format``, so Triton's own schema rejects a bad field at
write time; :func:`read_config` parses one back.

Two serving profiles:

- ``cpu``: ONNX models on KIND_CPU instances (the local server and the
  compose ``cpu`` profile).
- ``gpu``: the same ONNX files on KIND_GPU instances (ONNX Runtime CUDA,
  optionally with its TensorRT execution accelerator), plus one
  ``<family>_trt`` model per family (``platform: "tensorrt_plan"``) whose
  ``model.plan`` is built afterwards by ``python -m export tensorrt``, and for
  a PyTorch family ``<family>_torch`` (``platform: "pytorch_libtorch"``,
  TorchScript FP16; also on KIND_CPU when a cpu-profile export asks for it) and
  ``<family>_aoti``, an ensemble around ``<family>_aoti_package`` (``platform:
  "torch_aoti"``, an AOTInductor package in FP32; also on KIND_CPU when a
  cpu-profile export asks for it).
"""

from __future__ import annotations

import json
import shutil
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Any, Literal

from google.protobuf import text_format
from tritonclient.grpc import model_config_pb2 as mc

from bundle.errors import ConfigError
from bundle.schema import (
    AGREE_PARAMETER,
    BAG_INPUTS,
    BAG_OUTPUTS,
    CANDIDATE_CATEGORICAL_INPUT,
    CANDIDATE_DENSE_INPUT,
    CANDIDATE_DENSE_SHAPE_INPUT,
    CANDIDATE_SHAPE_INPUT,
    DLRMV3_CANDIDATE_INPUTS,
    DLRMV3_CANDIDATE_LENGTHS,
    DLRMV3_CANDIDATE_WIDTH,
    DLRMV3_HISTORY_INPUTS,
    DLRMV3_HISTORY_LENGTHS,
    DLRMV3_HISTORY_WIDTH,
    DLRMV3_USER_INPUT,
    EMPTY_RAGGED_PARAMETER,
    HOTNESS_PARAMETER,
    INPUTS,
    MAX_ELEMENTS_PARAMETER,
    NON_NEGATIVE_PARAMETER,
    NUM_CATEGORICAL,
    OUTPUT,
    OUTPUTS,
    USER_FEATURES_PARAMETER,
    VARIABLE_HOTNESS,
    FeatureSplit,
    TensorSpec,
    dlrmv3_inputs,
    dlrmv3_outputs,
    inputs_for,
    parse_hotness_parameter,
)
from bundle.staging import write_file_atomically

CONFIG_NAME = "config.pbtxt"
MODEL_FILE = "model.onnx"
#: The TensorRT engine file of a ``<family>_trt`` model.
PLAN_FILE = "model.plan"
#: The backend name, the same for the local server's Python-based backend and the NGC image's C++ one.
ONNX_BACKEND = "onnxruntime"
#: The platform of a serialized TensorRT engine.
TRT_PLATFORM = "tensorrt_plan"
#: Suffix of the TensorRT model of a family (``dlrm_trt``); it exists only in the gpu profile.
TRT_SUFFIX = "_trt"
#: The TorchScript file of a ``<family>_torch`` model.
TORCHSCRIPT_FILE = "model.pt"
#: The platform of a TorchScript model: the NGC image's LibTorch backend; locally,
#: ``backends/pytorch/model.py`` (Triton maps the platform to backend ``pytorch``).
TORCH_PLATFORM = "pytorch_libtorch"
#: Suffix of the TorchScript (FP16) model of a PyTorch family (``dlrm_torch``).
TORCH_SUFFIX = "_torch"
#: The AOTInductor package of a ``<family>_aoti`` model (PyTorch 2: compiled, no Python to serve).
AOTI_FILE = "model.pt2"
#: The platform of an AOTInductor package: the NGC image's pytorch backend from 26.03
#: (``backend: "pytorch"``); locally, ``backends/pytorch/model.py``.
AOTI_PLATFORM = "torch_aoti"
#: Suffix of the AOTInductor model of a PyTorch family (``dlrm_aoti``): an ensemble with the
#: schema's tensors around the package model (:func:`build_aoti_ensemble_config`).
AOTI_SUFFIX = "_aoti"
#: Suffix of the model that holds a family's AOTInductor package (``dlrm_aoti_package``), the one
#: step of ``<family>_aoti``; its tensors have the pytorch backend's forward-based names.
AOTI_PACKAGE_SUFFIX = "_aoti_package"
#: The backend of TorchScript and AOTInductor models (Triton maps ``pytorch_libtorch`` to it).
PYTORCH_BACKEND = "pytorch"
#: The output name of an AOTInductor package whose forward returns one tensor (pytorch backend
#: 26.05 and later: ``RESULT``; a dict output is ``RESULT[<key>]``).
AOTI_RESULT = "RESULT"
#: The platform of an ensemble.
ENSEMBLE_PLATFORM = "ensemble"

Profile = Literal["cpu", "gpu"]
PROFILES: tuple[str, ...] = ("cpu", "gpu")

#: Default dynamic batcher delay per profile. The gpu profile follows Triton's
#: recommended starting point (``dynamic_batching {}``: no delay, no preferred
#: sizes, batches as large as are queued), to be raised only after measuring;
#: the cpu profile keeps the 100 us the local server was tuned with.
QUEUE_DELAY_US: dict[str, int] = {"cpu": 100, "gpu": 0}
#: Default instances per model: one on the CPU (ONNX Runtime's threads use the cores); four per
#: GPU, where one instance leaves the GPU idle while its Python stub copies and batches: on an
#: H100 at batch 8192, dlrm_onnx's served samples/s and served/in-process rose from 1 to 2 to 4
#: instances, and only with 4 did the fastest DLRM meet the GPU run's served target
#: (benchmarks/gpu/result.md for 1 and 2 instances, benchmarks/gpu/instances/result.md for 4).
INSTANCES: dict[str, int] = {"cpu": 1, "gpu": 4}

#: Default preferred batch sizes per profile (capped: none above ``max_batch_size``); none in
#: either profile. Measured for the cpu profile (benchmarks/cpu/concurrency.md): on a quiet
#: machine, preferred 1024 scaled worse from concurrency 1 to 2 and 4 at batch 1024 than none.
PREFERRED_BATCH_SIZES: dict[str, tuple[int, ...]] = {"cpu": (), "gpu": ()}
#: The config parameter (ONNX Runtime's own session config key) that turns the
#: spin-waiting of idle intra-op threads on ("1", ONNX Runtime's default and the bundle's) or
#: off ("0"). Spinning off was slower on a quiet machine (benchmarks/cpu/concurrency.md); it
#: may help where other processes share the cores. The local backend reads it; Triton's C++
#: onnxruntime backend does not read this key.
ORT_SPINNING_KEY = "session.intra_op.allow_spinning"
#: Where the ONNX Runtime TensorRT accelerator caches its engines, inside the
#: serving container (a writable volume; the repository itself is read-only).
ORT_TRT_CACHE_DIR = "/trt_cache"
#: Default ``opt`` batch of a TensorRT optimization profile (capped at the max):
#: a ranking request carries hundreds of candidates, and the dynamic batcher
#: merges a few requests under load.
DEFAULT_OPT_BATCH = 1024
#: CUDA graphs pay off where kernel launches dominate: small batches.
MAX_DEFAULT_GRAPH_BATCH = 128

_DATA_TYPES = {
    "FP32": mc.TYPE_FP32,
    "FP16": mc.TYPE_FP16,
    "INT64": mc.TYPE_INT64,
    "INT32": mc.TYPE_INT32,
}


def trt_model_name(family: str) -> str:
    """The TensorRT model of a family: ``dlrm`` -> ``dlrm_trt``."""
    return f"{family}{TRT_SUFFIX}"


def torch_model_name(family: str) -> str:
    """The TorchScript model of a family: ``dlrm`` -> ``dlrm_torch``."""
    return f"{family}{TORCH_SUFFIX}"


def aoti_model_name(family: str) -> str:
    """The AOTInductor model of a family, the ensemble clients call: ``dlrm`` -> ``dlrm_aoti``."""
    return f"{family}{AOTI_SUFFIX}"


def aoti_package_name(family: str) -> str:
    """The model that holds a family's AOTInductor package: ``dlrm`` -> ``dlrm_aoti_package``."""
    return f"{family}{AOTI_PACKAGE_SUFFIX}"


def aoti_input_name(name: str) -> str:
    """The config name of the package's keyword argument ``name``: ``KWARGS[<name>]`` (pytorch
    backend 26.05 and later, which reads the argument names from the package's call spec)."""
    return f"KWARGS[{name}]"


@dataclass(frozen=True)
class BatchProfile:
    """A TensorRT optimization profile over the batch dimension ``B`` of every input.

    Args:
        min_batch: the smallest batch the engine accepts.
        opt_batch: the batch TensorRT tunes its kernels for.
        max_batch: the largest batch the engine accepts (>= the config's max_batch_size).
    """

    min_batch: int
    opt_batch: int
    max_batch: int
    inputs: tuple[TensorSpec, ...] = INPUTS

    def __post_init__(self) -> None:
        if not 1 <= self.min_batch <= self.opt_batch <= self.max_batch:
            raise ConfigError(
                "a TensorRT profile needs 1 <= min <= opt <= max, got "
                f"min={self.min_batch} opt={self.opt_batch} max={self.max_batch}"
            )

    @classmethod
    def for_max(
        cls, max_batch: int, opt_batch: int = 0, min_batch: int = 1, inputs: tuple[TensorSpec, ...] = INPUTS
    ) -> BatchProfile:
        """The profile up to ``max_batch``; ``opt_batch=0`` picks :data:`DEFAULT_OPT_BATCH` (capped)."""
        opt = opt_batch or max(min_batch, min(DEFAULT_OPT_BATCH, max_batch))
        return cls(min_batch, opt, max_batch, inputs)

    def key(self) -> dict[str, Any]:
        """The profile as JSON: its batch sizes, and its inputs' shapes when they are not the schema's."""
        key: dict[str, Any] = {
            "min_batch": self.min_batch,
            "opt_batch": self.opt_batch,
            "max_batch": self.max_batch,
        }
        if self.inputs != INPUTS:
            key["inputs"] = {spec.name: list(spec.shape) for spec in self.inputs}
        return key

    def shapes(self) -> dict[str, tuple[tuple[int, ...], tuple[int, ...], tuple[int, ...]]]:
        """``{input name: (min shape, opt shape, max shape)}``, each ``B x dims``."""
        return {
            spec.name: tuple(  # type: ignore[misc]
                (batch, *spec.shape) for batch in (self.min_batch, self.opt_batch, self.max_batch)
            )
            for spec in self.inputs
        }

    def ort_shapes(self, batch: int) -> str:
        """ONNX Runtime's TensorRT profile syntax: ``dense_features:1x13,categorical_ids:1x26``."""
        return ",".join(f"{spec.name}:{'x'.join(map(str, (batch, *spec.shape)))}" for spec in self.inputs)


def default_graph_batch_sizes(max_batch_size: int) -> tuple[int, ...]:
    """Powers of two up to ``min(128, max_batch_size)``: each CUDA graph also serves
    every batch down to the next smaller graph's size + 1 (Triton pads it)."""
    sizes = []
    size = 1
    while size <= min(MAX_DEFAULT_GRAPH_BATCH, max_batch_size):
        sizes.append(size)
        size *= 2
    return tuple(sizes)


@dataclass(frozen=True)
class ServingConfig:
    """How Triton serves one model.

    Args:
        profile: ``cpu`` (KIND_CPU instances) or ``gpu`` (KIND_GPU instances, TensorRT models).
        max_batch_size: the largest batch Triton forms or accepts.
        instances: model instances (each runs batches independently; per GPU in the gpu profile);
            0: the profile's :data:`INSTANCES`, resolved at construction.
        max_queue_delay_us: how long the dynamic batcher waits to fill a batch
            (see :data:`QUEUE_DELAY_US` for each profile's default).
        preferred_batch_sizes: batch sizes the dynamic batcher aims for (empty: as large as
            queued; None: the profile's :data:`PREFERRED_BATCH_SIZES` up to ``max_batch_size``,
            resolved at construction, so the field always holds a tuple afterwards).
        intra_op_threads: ONNX Runtime threads per instance (0: ONNX Runtime's default).
        intra_op_spinning: let ONNX Runtime's idle intra-op threads spin-wait for work
            (ONNX Runtime's own default, kept) instead of sleeping (see :data:`ORT_SPINNING_KEY`).
        warmup_batch_sizes: batch sizes run once at load, so the first request is not slow.
        ort_trt: gpu profile: run the ONNX models through ONNX Runtime's TensorRT
            execution accelerator (FP16 for the FP16 model, FP32 for the FP32 one).
        ort_trt_cache_dir: where that accelerator caches engines inside the serving
            container (absolute; one subfolder per model).
        opt_batch_size: ``opt`` batch of the accelerator's TensorRT profile (0: the default,
            :data:`DEFAULT_OPT_BATCH` capped at ``max_batch_size``).
        hotness: a multi-hot model's ids per table, C1..C26 (None: one each); its
            ``categorical_ids`` is then ``B x sum(hotness)`` and the config records them.
        variable_bags: the model takes bags of any size (:data:`bundle.schema.BAG_INPUTS`):
            ``max_batch_size: 0`` (each request runs as it comes), no dynamic batcher and no
            warmup, and the ``hotness`` parameter says ``variable``.
        cuda_graph_batch_sizes: gpu profile: batch sizes the TensorRT models capture CUDA
            graphs for (None: :func:`default_graph_batch_sizes`; empty: no graphs).
    """

    profile: Profile = "cpu"
    max_batch_size: int = 4096
    instances: int = 0
    max_queue_delay_us: int = 100
    preferred_batch_sizes: tuple[int, ...] | None = None
    intra_op_threads: int = 0
    intra_op_spinning: bool = True
    warmup_batch_sizes: tuple[int, ...] = (1, 64)
    ort_trt: bool = False
    ort_trt_cache_dir: str = ORT_TRT_CACHE_DIR
    opt_batch_size: int = 0
    cuda_graph_batch_sizes: tuple[int, ...] | None = None
    hotness: tuple[int, ...] | None = None
    variable_bags: bool = False

    def __post_init__(self) -> None:
        if self.variable_bags and (self.hotness is not None or self.ort_trt):
            raise ConfigError("bags of any size take no fixed hotness and no TensorRT accelerator")
        if self.hotness is not None and (len(self.hotness) != NUM_CATEGORICAL or min(self.hotness) < 1):
            raise ConfigError(f"hotness needs {NUM_CATEGORICAL} counts >= 1, got {self.hotness}")
        if self.profile not in PROFILES:
            raise ConfigError(f"unknown profile {self.profile!r}; choose one of {', '.join(PROFILES)}")
        if self.max_batch_size <= 0:
            raise ConfigError(f"max_batch_size must be positive, got {self.max_batch_size}")
        if self.instances < 0:
            raise ConfigError(f"instances must be positive (0: the profile's default), got {self.instances}")
        if self.instances == 0:
            object.__setattr__(self, "instances", INSTANCES[self.profile])
        if self.max_queue_delay_us < 0:
            raise ConfigError(f"max_queue_delay_us must be >= 0, got {self.max_queue_delay_us}")
        if self.intra_op_threads < 0:
            raise ConfigError(f"intra_op_threads must be >= 0, got {self.intra_op_threads}")
        if self.preferred_batch_sizes is None:
            defaults = PREFERRED_BATCH_SIZES[self.profile]
            object.__setattr__(
                self, "preferred_batch_sizes", tuple(s for s in defaults if s <= self.max_batch_size)
            )
        for size in (
            *self.preferred_sizes,
            *self.warmup_batch_sizes,
            *(self.cuda_graph_batch_sizes or ()),
        ):
            if not 0 < size <= self.max_batch_size:
                raise ConfigError(f"batch size {size} is outside 1..max_batch_size={self.max_batch_size}")
        if self.opt_batch_size < 0 or self.opt_batch_size > self.max_batch_size:
            raise ConfigError(f"opt_batch_size must be in 0..max_batch_size, got {self.opt_batch_size}")
        if self.profile != "gpu":
            if self.ort_trt:
                raise ConfigError("the ONNX Runtime TensorRT accelerator needs --profile gpu")
            if self.cuda_graph_batch_sizes:
                raise ConfigError("CUDA graphs need --profile gpu")
        if not PurePosixPath(self.ort_trt_cache_dir).is_absolute():
            raise ConfigError(f"ort_trt_cache_dir must be an absolute path, got {self.ort_trt_cache_dir!r}")

    @property
    def preferred_sizes(self) -> tuple[int, ...]:
        """The dynamic batcher's preferred batch sizes (the profile's default resolved)."""
        return self.preferred_batch_sizes or ()

    @property
    def instance_kind(self) -> int:
        """``KIND_GPU`` in the gpu profile, else ``KIND_CPU``."""
        return mc.ModelInstanceGroup.KIND_GPU if self.profile == "gpu" else mc.ModelInstanceGroup.KIND_CPU

    @property
    def inputs(self) -> tuple[TensorSpec, ...]:
        """The model's inputs: :data:`bundle.schema.INPUTS`, ``categorical_ids`` ``B x H`` when multi-hot."""
        return inputs_for(self.hotness)

    @property
    def batch_profile(self) -> BatchProfile:
        """The TensorRT profile ``1 .. opt .. max_batch_size`` these settings serve."""
        return BatchProfile.for_max(self.max_batch_size, self.opt_batch_size, inputs=self.inputs)

    @property
    def graph_batch_sizes(self) -> tuple[int, ...]:
        """The CUDA graph batch sizes, ascending (empty outside the gpu profile)."""
        if self.profile != "gpu":
            return ()
        if self.cuda_graph_batch_sizes is None:
            return default_graph_batch_sizes(self.max_batch_size)
        return tuple(sorted(set(self.cuda_graph_batch_sizes)))


def _tensor(spec: TensorSpec, message: Any) -> None:
    message.name = spec.name
    message.data_type = _DATA_TYPES[spec.triton_dtype]
    message.dims.extend(spec.shape)


def _base_config(name: str, serving: ServingConfig) -> mc.ModelConfig:
    """What every model shares: schema tensors, dynamic batching, instances, warmup."""
    if serving.variable_bags:
        return _bag_config(name, serving)
    config = mc.ModelConfig(name=name, max_batch_size=serving.max_batch_size)
    for spec in serving.inputs:
        _tensor(spec, config.input.add())
    if serving.hotness is not None:
        config.parameters[HOTNESS_PARAMETER].string_value = ",".join(map(str, serving.hotness))
    for spec in OUTPUTS:
        _tensor(spec, config.output.add())
    # Set explicitly even when 0, so `dynamic_batching {}` is present and enabled.
    config.dynamic_batching.max_queue_delay_microseconds = serving.max_queue_delay_us
    config.dynamic_batching.SetInParent()
    config.dynamic_batching.preferred_batch_size.extend(serving.preferred_sizes)
    group = config.instance_group.add()
    group.count = serving.instances
    group.kind = serving.instance_kind
    for size in serving.warmup_batch_sizes:
        warmup = config.model_warmup.add()
        warmup.name = f"zeros_batch_{size}"
        warmup.batch_size = size
        for spec in serving.inputs:
            data = warmup.inputs[spec.name]
            data.data_type = _DATA_TYPES[spec.triton_dtype]
            data.dims.extend(spec.shape)
            data.zero_data = True
    return config


def _bag_config(name: str, serving: ServingConfig) -> mc.ModelConfig:
    """:func:`_base_config` for bags of any size: full shapes, no batching, no warmup (a
    request of zeros would need lengths that add up to its values)."""
    config = mc.ModelConfig(name=name, max_batch_size=0)
    for spec in BAG_INPUTS:
        _tensor(spec, config.input.add())
    for spec in BAG_OUTPUTS:
        _tensor(spec, config.output.add())
    config.parameters[HOTNESS_PARAMETER].string_value = VARIABLE_HOTNESS
    group = config.instance_group.add()
    group.count = serving.instances
    group.kind = serving.instance_kind
    return config


def build_config(name: str, serving: ServingConfig, fp16: bool = False) -> mc.ModelConfig:
    """The ModelConfig of an ONNX model named ``name`` with the shared schema's tensors.

    Args:
        name: the model name.
        serving: how Triton serves it.
        fp16: the graph is the FP16 variant (sets the TensorRT accelerator's precision).
    """
    config = _base_config(name, serving)
    config.backend = ONNX_BACKEND
    config.default_model_filename = MODEL_FILE
    set_ort_threading(config, serving)
    if serving.ort_trt:
        _add_ort_tensorrt(config, name, serving, fp16)
    return config


#: Users a ranking model's batch holds at most (each with its own candidates): Triton's dynamic
#: batcher counts a ranking request as one, whatever its candidates.
RANKING_MAX_USERS = 64
#: Candidates of each user in a ranking model's warmup request.
RANKING_WARMUP_CANDIDATES = 8


def _batch_users(
    config: mc.ModelConfig, serving: ServingConfig, specs: tuple[TensorSpec, ...], candidates: int
) -> None:
    """What a model of one user a request shares (ranking, DLRMv3): the dynamic batcher, the
    instances, and a warmup of one user of ``candidates`` (each ``-1`` of an input's shape), zeros."""
    config.dynamic_batching.max_queue_delay_microseconds = serving.max_queue_delay_us
    config.dynamic_batching.SetInParent()
    group = config.instance_group.add()
    group.count = serving.instances
    group.kind = serving.instance_kind
    warmup = config.model_warmup.add(name=f"zeros_one_user_{candidates}_candidates", batch_size=1)
    for spec in specs:
        data = warmup.inputs[spec.name]
        data.data_type = _DATA_TYPES[spec.triton_dtype]
        data.dims.extend(candidates if dim == -1 else dim for dim in spec.shape)
        data.zero_data = True


def build_ranking_config(
    name: str,
    serving: ServingConfig,
    split: FeatureSplit,
    hotness: tuple[int, ...] | None = None,
    fp16: bool = False,
) -> mc.ModelConfig:
    """The ModelConfig of a ranking model (:mod:`bundle.schema`'s ranking tensors): a batch of
    users, each request one user with its candidates.

    The user's parts are batched as usual (``[1, Du]`` a request, ``U`` rows a batch); the
    candidates' are ragged inputs (``[1, C, Dc]`` a request, every user's values concatenated
    for the model); ``candidate_shape`` is a ``batch_input`` (``BATCH_ITEM_SHAPE``: each user's
    ``(C, width)``), and the answer, ``[1, C, 1]`` a request, a ``batch_output``
    (``BATCH_SCATTER_WITH_INPUT_SHAPE``) cut from the model's ``N x 1`` by the same input.
    Where both candidate parts exist, ``candidate_dense_shape`` gives the dense part's shapes
    too, so the model can refuse a user whose two parts disagree. The config records the
    split (``user_features``) and, for a multi-hot model, its ``hotness``.
    """
    config = mc.ModelConfig(name=name, max_batch_size=min(RANKING_MAX_USERS, serving.max_batch_size))
    config.backend = ONNX_BACKEND
    config.default_model_filename = MODEL_FILE
    specs = split.inputs(hotness)
    for spec in specs:
        entry = config.input.add()
        _tensor(spec, entry)
        entry.allow_ragged_batch = spec.name in (CANDIDATE_DENSE_INPUT, CANDIDATE_CATEGORICAL_INPUT)
    source = split.shape_source(hotness)
    shapes = [(CANDIDATE_SHAPE_INPUT, source)]
    if source == CANDIDATE_CATEGORICAL_INPUT and split.candidate_dense:
        shapes.append((CANDIDATE_DENSE_SHAPE_INPUT, CANDIDATE_DENSE_INPUT))
    for target, shaped in shapes:
        config.batch_input.add(
            kind=mc.BatchInput.BATCH_ITEM_SHAPE,
            target_name=[target],
            data_type=mc.TYPE_INT32,
            source_input=[shaped],
        )
    output = config.output.add(name=OUTPUT, data_type=mc.TYPE_FP32)
    output.dims.extend([-1, 1])
    config.batch_output.add(
        target_name=[OUTPUT], kind=mc.BatchOutput.BATCH_SCATTER_WITH_INPUT_SHAPE, source_input=[source]
    )
    config.parameters[USER_FEATURES_PARAMETER].string_value = split.text
    if hotness is not None:
        config.parameters[HOTNESS_PARAMETER].string_value = ",".join(map(str, hotness))
    _batch_users(config, serving, specs, RANKING_WARMUP_CANDIDATES)
    set_ort_threading(config, serving)
    if serving.ort_trt:
        _add_ort_tensorrt(config, name, serving, fp16)
    return config


def add_ranking_model(
    repository: Path,
    name: str,
    serving: ServingConfig,
    split: FeatureSplit,
    report: dict[str, Any] | None = None,
    hotness: tuple[int, ...] | None = None,
    fp16: bool = False,
    version: int = 1,
) -> Path:
    """Write the config of ranking model ``name`` (:func:`build_ranking_config`), whose ONNX file
    is already in its version folder; ``report`` beside it as ``export_report.json``."""
    onnx_path = version_dir(repository, name, version) / MODEL_FILE
    if not onnx_path.is_file():
        raise ConfigError(f"{onnx_path} is missing: export the model before writing its config")
    if report is not None:
        write_report(repository, name, report)
    return write_config(repository / name, build_ranking_config(name, serving, split, hotness, fp16))


#: Users a DLRMv3 batch holds at most, and the candidates of its warmup user.
DLRMV3_MAX_USERS = 32
DLRMV3_WARMUP_CANDIDATES = 8


def build_dlrmv3_config(
    name: str,
    serving: ServingConfig,
    tasks: tuple[str, ...],
    max_candidates: int,
    max_users: int = DLRMV3_MAX_USERS,
) -> mc.ModelConfig:
    """The ModelConfig of a DLRMv3 ONNX model (:func:`bundle.schema.dlrmv3_inputs`): a batch of
    users, each request one user.

    ``user_id`` is batched as usual (``[1, 1]`` a request); the history and candidate inputs are
    ragged (``[1, L]`` and ``[1, C]`` a request, every user's values concatenated for the model;
    a history may be empty, which the config's ``ragged_may_be_empty`` parameter says); the
    model's ``batch_input``s are each user's counts (``BATCH_ELEMENT_COUNT``) and the batch's
    longest of each as a shape (``BATCH_MAX_ELEMENT_COUNT_AS_SHAPE``); each task's output,
    ``[1, C]`` a request, is a ``batch_output`` cut by the candidates' shapes."""
    config = mc.ModelConfig(name=name, max_batch_size=min(max_users, serving.max_batch_size))
    config.backend = ONNX_BACKEND
    config.default_model_filename = MODEL_FILE
    for spec in dlrmv3_inputs():
        entry = config.input.add()
        _tensor(spec, entry)
        entry.allow_ragged_batch = spec.name != DLRMV3_USER_INPUT
    for target, kind, source in (
        (DLRMV3_HISTORY_LENGTHS, mc.BatchInput.BATCH_ELEMENT_COUNT, DLRMV3_HISTORY_INPUTS[0]),
        (DLRMV3_CANDIDATE_LENGTHS, mc.BatchInput.BATCH_ELEMENT_COUNT, DLRMV3_CANDIDATE_INPUTS[0]),
        (DLRMV3_HISTORY_WIDTH, mc.BatchInput.BATCH_MAX_ELEMENT_COUNT_AS_SHAPE, DLRMV3_HISTORY_INPUTS[0]),
        (DLRMV3_CANDIDATE_WIDTH, mc.BatchInput.BATCH_MAX_ELEMENT_COUNT_AS_SHAPE, DLRMV3_CANDIDATE_INPUTS[0]),
    ):
        config.batch_input.add(
            kind=kind, target_name=[target], data_type=mc.TYPE_INT32, source_input=[source]
        )
    outputs = dlrmv3_outputs(tasks)
    for spec in outputs:
        _tensor(spec, config.output.add())
    config.batch_output.add(
        target_name=[spec.name for spec in outputs],
        kind=mc.BatchOutput.BATCH_SCATTER_WITH_INPUT_SHAPE,
        source_input=[DLRMV3_CANDIDATE_INPUTS[0]],
    )
    # What the local server's backends check of each user (the graph reduces ids into its tables).
    config.parameters[EMPTY_RAGGED_PARAMETER].string_value = ",".join(DLRMV3_HISTORY_INPUTS)
    config.parameters[AGREE_PARAMETER].string_value = ";".join(
        ",".join(group) for group in (DLRMV3_HISTORY_INPUTS, DLRMV3_CANDIDATE_INPUTS)
    )
    config.parameters[MAX_ELEMENTS_PARAMETER].string_value = f"{DLRMV3_CANDIDATE_INPUTS[0]}:{max_candidates}"
    config.parameters[NON_NEGATIVE_PARAMETER].string_value = DLRMV3_HISTORY_INPUTS[2]
    _batch_users(config, serving, dlrmv3_inputs(), DLRMV3_WARMUP_CANDIDATES)
    set_ort_threading(config, serving)
    return config


def set_ort_threading(config: mc.ModelConfig, serving: ServingConfig) -> None:
    """The ONNX Runtime thread parameters of ``serving`` on an onnxruntime-backend ``config``."""
    if serving.intra_op_threads:
        # The key the NGC image's onnxruntime backend reads; the local backend reads it too.
        config.parameters["intra_op_thread_count"].string_value = str(serving.intra_op_threads)
    config.parameters[ORT_SPINNING_KEY].string_value = "1" if serving.intra_op_spinning else "0"


def _add_ort_tensorrt(config: mc.ModelConfig, name: str, serving: ServingConfig, fp16: bool) -> None:
    """ONNX Runtime's TensorRT execution accelerator, keys as Triton's onnxruntime backend names them.

    The FP32 model stays FP32 (TensorRT kernels, same precision); the FP16 one
    gets ``precision_mode: FP16``. An explicit profile over the batch keeps
    ONNX Runtime from rebuilding the engine whenever a larger batch arrives,
    and the engine cache on a volume makes later starts skip the build.
    """
    profile = serving.batch_profile
    accelerator = config.optimization.execution_accelerators.gpu_execution_accelerator.add()
    accelerator.name = "tensorrt"
    parameters = accelerator.parameters
    parameters["precision_mode"] = "FP16" if fp16 else "FP32"
    parameters["trt_engine_cache_enable"] = "1"
    parameters["trt_engine_cache_path"] = str(PurePosixPath(serving.ort_trt_cache_dir) / name)
    parameters["trt_profile_min_shapes"] = profile.ort_shapes(profile.min_batch)
    parameters["trt_profile_opt_shapes"] = profile.ort_shapes(profile.opt_batch)
    parameters["trt_profile_max_shapes"] = profile.ort_shapes(profile.max_batch)


def build_trt_config(name: str, serving: ServingConfig) -> mc.ModelConfig:
    """The ModelConfig of a TensorRT engine model (``platform: "tensorrt_plan"``).

    CUDA graphs are captured for :attr:`ServingConfig.graph_batch_sizes`; each
    graph also takes every batch above the next smaller graph's size
    (``graph_lower_bound``), which Triton pads up to the graph's size, so every
    batch up to the largest graph runs as one graph launch.
    """
    if serving.profile != "gpu":
        raise ConfigError(f"{name}: TensorRT models exist only in the gpu profile")
    config = _base_config(name, serving)
    config.platform = TRT_PLATFORM
    config.default_model_filename = PLAN_FILE
    sizes = serving.graph_batch_sizes
    if sizes:
        cuda = config.optimization.cuda
        cuda.graphs = True
        lower = 1
        for size in sizes:
            spec = cuda.graph_spec.add()
            spec.batch_size = size
            spec.graph_lower_bound.batch_size = lower
            for tensor in serving.inputs:
                spec.input[tensor.name].dim.extend(tensor.shape)
                spec.graph_lower_bound.input[tensor.name].dim.extend(tensor.shape)
            lower = size + 1
    return config


def build_torch_config(name: str, serving: ServingConfig) -> mc.ModelConfig:
    """The ModelConfig of a TorchScript model (``platform: "pytorch_libtorch"``, ``model.pt``).

    The inputs keep the schema's names: Triton's PyTorch backend maps them to the
    traced ``forward``'s arguments of the same names (:mod:`export.engines.torchscript`),
    and the one output by order. ``INFERENCE_MODE`` is the backend's default since
    24.xx, set here so the local backend reads the same value; the intra-op thread
    count goes by the key both backends read.
    """
    config = _base_config(name, serving)
    config.platform = TORCH_PLATFORM
    config.default_model_filename = TORCHSCRIPT_FILE
    config.parameters["INFERENCE_MODE"].string_value = "true"
    if serving.intra_op_threads:
        config.parameters["INTRA_OP_THREAD_COUNT"].string_value = str(serving.intra_op_threads)
    return config


def build_aoti_config(name: str, serving: ServingConfig, device: str | None = None) -> mc.ModelConfig:
    """The ModelConfig of an AOTInductor package model (``platform: "torch_aoti"``, ``model.pt2``).

    Batching, instances and warmup are the profile's, as for every model, but a package runs only
    on the device it is compiled for: ``device`` ``cpu`` gives KIND_CPU instances and ``cuda``
    KIND_GPU ones, whatever the profile (None: the profile's kind). The tensors have the
    pytorch backend's forward-based names (26.05 and later, which reads the package's call
    spec): ``KWARGS[<schema input>]`` for the keyword arguments the export compiles the module
    with (:mod:`export.engines.aoti`), ``RESULT`` for its one output tensor. Clients call the
    ensemble around it (:func:`build_aoti_ensemble_config`), which has the schema's names.

    No backend parameter is set: the AOTInductor path of the pytorch backend documents none
    of the TorchScript ones (``INFERENCE_MODE``, thread counts).

    Raises:
        ConfigError: bags of any size (a package takes ``categorical_ids``).
    """
    if serving.variable_bags:
        raise ConfigError(
            f"{name}: an AOTInductor package takes categorical_ids; bags of any size are served by the "
            "ONNX models"
        )
    config = _base_config(name, serving)
    config.platform = AOTI_PLATFORM
    config.backend = PYTORCH_BACKEND
    config.default_model_filename = AOTI_FILE
    if device is not None:
        kinds = {"cpu": mc.ModelInstanceGroup.KIND_CPU, "cuda": mc.ModelInstanceGroup.KIND_GPU}
        if device not in kinds:
            raise ConfigError(f"{name}: a package is compiled for cpu or cuda, not {device!r}")
        for group in config.instance_group:
            group.kind = kinds[device]
    for tensor in config.input:
        tensor.name = aoti_input_name(tensor.name)
    for tensor in config.output:
        tensor.name = AOTI_RESULT
    for warmup in config.model_warmup:
        for spec in serving.inputs:
            warmup.inputs[aoti_input_name(spec.name)].CopyFrom(warmup.inputs[spec.name])
            del warmup.inputs[spec.name]
    return config


def build_aoti_ensemble_config(name: str, package: str, serving: ServingConfig) -> mc.ModelConfig:
    """The ModelConfig of ``<family>_aoti``: an ensemble of one step, the package model ``package``.

    Every served model has the schema's tensors (``dense_features``, ``categorical_ids``,
    ``click_probability``), whatever the model inside names them; the pytorch backend takes an
    AOTInductor package's tensors only by its own conventions (``KWARGS[...]``, ``RESULT``), so
    the ensemble maps one set of names to the other. It batches as the package model does
    (same ``max_batch_size``) and has no scheduler or instances of its own.

    Raises:
        ConfigError: bags of any size (as :func:`build_aoti_config`).
    """
    if serving.variable_bags:
        raise ConfigError(f"{name}: an AOTInductor package takes categorical_ids, not bags of any size")
    config = mc.ModelConfig(name=name, platform=ENSEMBLE_PLATFORM, max_batch_size=serving.max_batch_size)
    for spec in serving.inputs:
        _tensor(spec, config.input.add())
    for spec in OUTPUTS:
        _tensor(spec, config.output.add())
    if serving.hotness is not None:
        config.parameters[HOTNESS_PARAMETER].string_value = ",".join(map(str, serving.hotness))
    step = config.ensemble_scheduling.step.add(model_name=package, model_version=-1)
    for spec in serving.inputs:
        step.input_map[aoti_input_name(spec.name)] = spec.name
    (output,) = OUTPUTS
    step.output_map[AOTI_RESULT] = output.name
    return config


def write_config(model_dir: Path, config: mc.ModelConfig) -> Path:
    """Write ``config`` as ``model_dir/config.pbtxt`` (in one rename: a server polling the repository
    reads the old config or the new one, never a part)."""
    return write_file_atomically(model_dir / CONFIG_NAME, text_format.MessageToString(config))


def read_config(path: Path) -> mc.ModelConfig:
    """Parse a config.pbtxt into a ModelConfig (raises ConfigError when it does not parse)."""
    try:
        return text_format.Parse(path.read_text(), mc.ModelConfig())
    except (OSError, text_format.ParseError) as exc:
        raise ConfigError(f"{path}: not a valid Triton model config ({exc})") from None


def config_hotness(config: mc.ModelConfig) -> tuple[int, ...] | None:
    """A multi-hot model's ids per table, from its config's ``hotness`` parameter (None: one id each).

    Raises:
        ConfigError: the parameter is there but not 26 counts >= 1.
    """
    if HOTNESS_PARAMETER not in config.parameters:
        return None
    if config.parameters[HOTNESS_PARAMETER].string_value == VARIABLE_HOTNESS:
        return None  # bags of any size: see config_variable_bags
    return parse_hotness_parameter(config.parameters[HOTNESS_PARAMETER].string_value, config.name)


def config_variable_bags(config: mc.ModelConfig) -> bool:
    """Whether the model takes bags of any size (its ``hotness`` parameter is ``variable``)."""
    return (
        HOTNESS_PARAMETER in config.parameters
        and config.parameters[HOTNESS_PARAMETER].string_value == VARIABLE_HOTNESS
    )


def config_bags(config: mc.ModelConfig) -> tuple[int, ...] | str | None:
    """The ids per table a model takes: its hotness (26 counts), ``variable`` for bags of any size
    (:func:`config_variable_bags`), or None for one id each (:func:`config_hotness`)."""
    return VARIABLE_HOTNESS if config_variable_bags(config) else config_hotness(config)


def version_dir(repository: Path, name: str, version: int = 1) -> Path:
    """The folder that holds version ``version`` of model ``name``."""
    return repository / name / str(version)


#: The file that keeps an ensemble's (otherwise empty) version folder.
ENSEMBLE_VERSION_FILE = "ensemble.txt"


#: The file that keeps a compiled stage's version folder (:func:`make_compiled_stage_version`).
STAGE_VERSION_FILE = "stage.txt"


def _kept_version(repository: Path, name: str, version: int, filename: str, text: str) -> Path:
    """``name``'s version folder, which Triton needs, with one small file in it: object storage
    (an ``s3://`` repository) and git keep no empty folder, and without one Triton finds no
    version to load."""
    folder = version_dir(repository, name, version)
    folder.mkdir(parents=True, exist_ok=True)
    (folder / filename).write_text(text)
    return folder


def make_ensemble_version(repository: Path, name: str, version: int = 1) -> Path:
    """Create ensemble ``name``'s version folder (see :func:`_kept_version`)."""
    return _kept_version(
        repository, name, version, ENSEMBLE_VERSION_FILE,
        "An ensemble has no file of its own; this one keeps its version folder in object storage.\n",
    )  # fmt: skip


def make_compiled_stage_version(repository: Path, name: str, backend: str, version: int = 1) -> Path:
    """Create the version folder of ``name``, a model of the compiled stage ``backend`` (a Triton
    C++ backend, whose code is the backend's library), see :func:`_kept_version`."""
    return _kept_version(
        repository, name, version, STAGE_VERSION_FILE,
        f"A model of the compiled stage '{backend}' (libtriton_{backend}.so) has no file of its own; "
        "this one keeps its version folder in object storage.\n",
    )  # fmt: skip


#: The export's checks beside a model's config (:func:`write_report`).
REPORT_FILE = "export_report.json"


def write_report(repository: Path, name: str, report: dict[str, Any]) -> Path:
    """Write ``report`` as ``<repository>/<name>/export_report.json``."""
    return write_file_atomically(repository / name / REPORT_FILE, json.dumps(report, indent=2) + "\n")


def read_report(repository: Path, name: str) -> dict[str, Any]:
    """``<repository>/<name>/export_report.json`` as :func:`write_report` wrote it (empty if absent)."""
    path = repository / name / REPORT_FILE
    return json.loads(path.read_text()) if path.is_file() else {}


def add_model(
    repository: Path,
    name: str,
    serving: ServingConfig,
    version: int = 1,
    report: dict[str, Any] | None = None,
    fp16: bool = False,
) -> Path:
    """Write the config of model ``name`` whose ONNX file is already in its version folder.

    Args:
        repository: the model repository root.
        name: the model name (``dlrm_onnx``, ...).
        serving: how Triton serves it.
        version: the version folder holding ``model.onnx``.
        report: export checks to keep beside the config as ``export_report.json``.
        fp16: the ONNX file is the FP16 variant.

    Returns:
        The config path.
    """
    onnx_path = version_dir(repository, name, version) / MODEL_FILE
    if not onnx_path.is_file():
        raise ConfigError(f"{onnx_path} is missing: export the model before writing its config")
    if report is not None:
        write_report(repository, name, report)
    return write_config(repository / name, build_config(name, serving, fp16=fp16))


def add_trt_model(repository: Path, name: str, serving: ServingConfig, version: int = 1) -> Path:
    """Write the config of TensorRT model ``name`` and create its empty version folder.

    The plan (``<name>/<version>/model.plan``) is built later, on the serving
    GPU's TensorRT, by ``python -m export tensorrt``; until then Triton fails
    to load this model (and, with ``--exit-on-error``, to start).

    Returns:
        The config path.
    """
    config = build_trt_config(name, serving)
    version_dir(repository, name, version).mkdir(parents=True, exist_ok=True)
    return write_config(repository / name, config)


def add_torch_model(
    repository: Path,
    name: str,
    serving: ServingConfig,
    version: int = 1,
    report: dict[str, Any] | None = None,
) -> Path:
    """Write the config of TorchScript model ``name`` whose ``model.pt`` is already in its version folder.

    Returns:
        The config path.
    """
    path = version_dir(repository, name, version) / TORCHSCRIPT_FILE
    if not path.is_file():
        raise ConfigError(f"{path} is missing: write the TorchScript file before its config")
    if report is not None:
        write_report(repository, name, report)
    return write_config(repository / name, build_torch_config(name, serving))


def add_aoti_model(
    repository: Path,
    name: str,
    package: str,
    serving: ServingConfig,
    version: int = 1,
    report: dict[str, Any] | None = None,
    device: str | None = None,
) -> Path:
    """Write the configs of ``package`` (whose ``model.pt2`` is already in its version folder) and of
    ``name``, the ensemble clients call (:func:`build_aoti_ensemble_config`).

    Args:
        repository: the model repository root.
        name: the served model (``dlrm_aoti``); ``report`` is kept beside its config.
        package: the package model (``dlrm_aoti_package``).
        serving: how Triton serves them.
        version: the package's version folder.
        report: export checks to keep as ``<name>/export_report.json``.
        device: what the package is compiled for, ``cpu`` or ``cuda`` (see :func:`build_aoti_config`).

    Returns:
        The ensemble's config path.
    """
    path = version_dir(repository, package, version) / AOTI_FILE
    if not path.is_file():
        raise ConfigError(f"{path} is missing: write the AOTInductor package before its config")
    write_config(repository / package, build_aoti_config(package, serving, device))
    ensemble = build_aoti_ensemble_config(name, package, serving)
    make_ensemble_version(repository, name)
    if report is not None:
        write_report(repository, name, report)
    return write_config(repository / name, ensemble)


def clear_model(repository: Path, name: str) -> None:
    """Remove model ``name`` from the repository (before writing it anew)."""
    target = repository / name
    if target.exists():
        shutil.rmtree(target)
