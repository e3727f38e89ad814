"""What one export run is asked to do: the options of ``python -m export dlrm|wide-deep``, validated.

:class:`ExportOptions` holds every option of one export run and refuses a wrong
combination where it is built, so the pipeline (:mod:`export.pipeline`) and the
placement of tables (:mod:`export.tables.placement`) both take it without either
importing the other. :class:`PlacementOptions` says where the embedding tables go
(in the graph, or hot/cold). The profile's defaults (:data:`INT8_BY_DEFAULT`,
:data:`TORCH_BY_DEFAULT`) live here, beside the options they decide.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from bundle.errors import ConfigError
from bundle.repository import ServingConfig
from bundle.schema import FeatureSplit
from export.graphs.quantize import QuantizeOptions
from export.stage.hot_cold_lookup import STORE_DTYPES

#: How the export places embedding tables (``--embeddings``).
PLACEMENTS: tuple[str, ...] = ("auto", "in-graph", "hot-cold")
#: Placements that earlier versions named otherwise (as ``--embeddings`` values and as the
#: ``placement`` of export reports), and their names now.
RENAMED_PLACEMENTS: dict[str, str] = {"hierarchical": "hot-cold"}
#: The error when no file can choose the hot rows.
NO_PROFILE_DATA = (
    "a hot/cold export chooses its hot rows from measured lookups: give --profile-data FILE "
    "(a Criteo TSV such as the training data), or --calibration-data / --check-data"
)
#: Whether an export writes ``<family>_onnx_int8`` unless told otherwise, per profile: the
#: INT8 variant is the cpu profile's fastest model that passes the accuracy gate
#: (benchmarks/cpu/precision.md); the gpu profile serves FP16 TensorRT instead.
INT8_BY_DEFAULT: dict[str, bool] = {"cpu": True, "gpu": False}
#: Whether a PyTorch family's export writes ``<family>_torch`` unless told otherwise, per profile:
#: it is a GPU model (FP16 weights; the PyTorch backend); on a CPU the ONNX models serve.
TORCH_BY_DEFAULT: dict[str, bool] = {"cpu": False, "gpu": True}
#: Precisions of ``<family>_torch`` (BF16 has FP32's range, FP16 more mantissa).
TORCH_DTYPES: tuple[str, ...] = ("float16", "bfloat16")


def current_placement(value: str) -> str:
    """``value`` as this version names it: an earlier version's name of a placement
    (:data:`RENAMED_PLACEMENTS`) becomes the current one; any other value stays as it is.

    The CLI takes an old ``--embeddings`` value with it, and files that earlier versions wrote
    (an export report's ``placement``) are read with it.
    """
    return RENAMED_PLACEMENTS.get(value, value)


@dataclass(frozen=True)
class PlacementOptions:
    """Where the embedding tables go (options ``--embeddings``, ``--hot-budget``, ``--profile-data``, ...).

    Args:
        mode: ``auto`` (hot/cold when ``hot_budget`` is given and the tables'
            bytes exceed it, else in-graph), ``in-graph`` or ``hot-cold``.
        hot_budget: bytes of hot rows the dense model keeps (see
            :func:`export.tables.hot_rows.parse_size`); None: no budget (in-graph).
        profile_data: Criteo TSV whose lookups choose the hot rows, or the folder of a profile
            ``python -m criteo profile`` wrote (None: the export's calibration data, else its
            check data; see :meth:`profile_source`).
        store_dtype: the row store's values, ``float32``, ``float16`` or ``int8`` (row-wise quantized).
        stage_instances: instances of the embedding stage (python stubs; each maps the
            same store and holds its own slot map).
        stream_tables: never build the all-in-graph graph: write the row store from the
            checkpoint's tables (memory-mapped) and take the layers from a graph with
            placeholder tables (:func:`place_streamed`), for tables larger than memory.

    Raises:
        ConfigError: an unknown mode or dtype, a negative budget, ``hot-cold``
            without a budget, a budget with ``in-graph``, profile data or an FP16 store
            without a budget, fewer than 1 stage instance (or more without a budget), or
            profile data that does not exist.
    """

    mode: str = "auto"
    hot_budget: int | None = None
    profile_data: Path | None = None
    store_dtype: str = "float32"
    stage_instances: int = 1
    stream_tables: bool = False

    def __post_init__(self) -> None:
        if self.mode not in PLACEMENTS:
            raise ConfigError(f"--embeddings must be {', '.join(PLACEMENTS)}; got {self.mode!r}")
        if self.store_dtype not in STORE_DTYPES:
            raise ConfigError(f"--store-dtype must be {' or '.join(STORE_DTYPES)}; got {self.store_dtype!r}")
        budget = self.hot_budget
        if budget is not None and (isinstance(budget, bool) or not isinstance(budget, int) or budget < 0):
            raise ConfigError(f"--hot-budget must be a byte count >= 0, got {budget!r}")
        if self.mode == "hot-cold" and budget is None:
            raise ConfigError(
                "--embeddings hot-cold needs --hot-budget SIZE: the bytes of hot rows the dense "
                "model keeps (e.g. 512M)"
            )
        if self.mode == "in-graph" and budget is not None:
            raise ConfigError(
                "--hot-budget places tables hot/cold; --embeddings in-graph keeps them all in the graph: "
                "drop one"
            )
        instances = self.stage_instances
        if isinstance(instances, bool) or not isinstance(instances, int) or instances < 1:
            raise ConfigError(f"--stage-instances must be an int >= 1, got {instances!r}")
        if budget is None and (
            self.profile_data is not None or self.store_dtype != "float32" or instances != 1
        ):
            raise ConfigError(
                "--profile-data, --store-dtype and --stage-instances apply to hot/cold models: "
                "give --hot-budget too"
            )
        if self.stream_tables and (budget is None or self.mode == "in-graph"):
            raise ConfigError(
                "--stream-tables writes the row store straight from the checkpoint's tables for a hot/cold "
                "model: give --hot-budget SIZE (and --embeddings hot-cold to split whatever the size)"
            )
        if self.profile_data is not None and not Path(self.profile_data).exists():
            raise ConfigError(f"profile data {self.profile_data} does not exist")

    @property
    def may_split(self) -> bool:
        """Whether the export may place the tables hot/cold (a budget is given)."""
        return self.hot_budget is not None

    def profile_source(
        self, calibration_data: Path | None, check_data: Path | None
    ) -> tuple[Path, str] | None:
        """The file whose lookups choose the hot rows and the option it came from (None: no file)."""
        for path, option in (
            (self.profile_data, "--profile-data"),
            (calibration_data, "--calibration-data"),
            (check_data, "--check-data"),
        ):
            if path is not None:
                return Path(path), option
        return None


@dataclass(frozen=True)
class ExportOptions:
    """Options of one export run.

    Args:
        repository: the Triton model repository to write into.
        serving: how Triton serves the exported models.
        opset: ONNX opset of the exported graphs.
        fp16: also write the FP16 variant.
        check_data: labeled Criteo TSV for the checks (None: synthetic rows).
        check_rows: rows compared against the framework (>= 1024).
        fp32_tolerance: max abs difference of FP32 ONNX vs framework probabilities.
        fp16_auc_tolerance: max |AUC(FP16) - AUC(FP32)| on the check rows.
        fp16_islands: keep the exporter's FP32 islands (DLRM's interaction) in the FP16
            variant; False: only the node that makes the output (the sigmoid) stays FP32, so
            no activation is cast between precisions inside the graph; None: islands in the
            cpu profile, none in the gpu profile. On an H100 the islands' casts and FP32
            concat cost more than the FP16 matrix products save, so FP16 with them was no
            faster than FP32 (measured in benchmarks/gpu/kernels.txt and
            benchmarks/gpu/fp16/result.md); the AUC gate still applies.
        int8: write the INT8 variant ``<family>_onnx_int8`` (cpu profile only): True
            (a failed check is an error), False, or None: the profile's default
            (:data:`INT8_BY_DEFAULT`), where a variant that fails its check is
            left out with a warning.
        quantize: how the INT8 variant quantizes its MLP layers.
        int8_auc_tolerance: max |AUC(INT8) - AUC(FP32)| on the check rows.
        calibration_data: Criteo TSV whose rows calibrate the static INT8 variant
            (None: the check data, after the check rows when it has enough; synthetic
            rows of another seed when there is no check data either).
        placement: where the embedding tables go (in the graph, or hot/cold).
        torch: write ``<family>_torch`` (TorchScript, PyTorch families only): True (a
            failed check is an error), False, or None: the profile's default
            (:data:`TORCH_BY_DEFAULT`), where a variant that fails is left out with a warning.
            Its instances follow the profile: KIND_GPU, or KIND_CPU in the cpu profile.
        torch_dtype: the TorchScript's precision, one of :data:`TORCH_DTYPES`; gated like
            FP16 (``fp16_auc_tolerance``) and by :data:`export.pipeline.TORCH_MAX_ABS_DIFF`.
        aoti: also write ``<family>_aoti`` (an AOTInductor package in FP32 inside an ensemble
            with the schema's tensors, PyTorch families only; a failed check is an error). Off
            unless asked in every profile: a package loads only under the PyTorch that compiled
            it, so it is exported with the serving image's own torch. Gated against the framework
            by :data:`export.pipeline.AOTI_MAX_ABS_DIFF` and ``fp16_auc_tolerance``. Compiled for
            CUDA in the gpu profile where torch sees a GPU (KIND_GPU instances), else for the CPU
            (KIND_CPU instances).
        raw_rows: also write ``<model>_raw`` for each model (:mod:`export.raw_rows`).
        user_features: also write ``<model>_ranking`` for each ONNX model, these features the
            user's (:mod:`export.ranking`); None: none written.
        auc_target: MLPerf's accuracy rule in place of the AUC tolerances: a variant gated on
            AUC (FP16, INT8, TorchScript, AOTInductor) passes when its AUC on the check rows is at
            least this percent of FP32's (99 or 99.9 for MLPerf's two targets); None: the
            tolerances.
    """

    repository: Path
    serving: ServingConfig = field(default_factory=ServingConfig)
    opset: int = 17
    fp16: bool = True
    check_data: Path | None = None
    check_rows: int = 4096
    fp32_tolerance: float = 1e-5
    fp16_auc_tolerance: float = 1e-3
    fp16_islands: bool | None = None
    int8: bool | None = None
    quantize: QuantizeOptions = field(default_factory=QuantizeOptions)
    int8_auc_tolerance: float = 1e-3
    calibration_data: Path | None = None
    placement: PlacementOptions = field(default_factory=PlacementOptions)
    torch: bool | None = None
    torch_dtype: str = "float16"
    aoti: bool = False
    raw_rows: bool = True
    user_features: FeatureSplit | None = None
    auc_target: float | None = None

    @property
    def writes_int8(self) -> bool:
        """Whether the export tries the INT8 variant."""
        return self.int8 if self.int8 is not None else INT8_BY_DEFAULT.get(self.serving.profile, False)

    @property
    def writes_torch(self) -> bool:
        """Whether the export tries the TorchScript variant (of a PyTorch family)."""
        return self.torch if self.torch is not None else TORCH_BY_DEFAULT.get(self.serving.profile, False)

    def __post_init__(self) -> None:
        if not 13 <= self.opset <= 23:
            raise ConfigError(f"opset must be in 13..23, got {self.opset}")
        if self.check_rows < 1024:
            raise ConfigError(f"check_rows must be >= 1024, got {self.check_rows}")
        if self.fp32_tolerance <= 0 or self.fp16_auc_tolerance <= 0 or self.int8_auc_tolerance <= 0:
            raise ConfigError("tolerances must be positive")
        if self.auc_target is not None and not 0 < self.auc_target < 100:
            raise ConfigError(
                f"--auc-target is a percent of FP32's AUC in (0, 100), e.g. 99.9; got {self.auc_target}"
            )
        if self.serving.profile == "gpu" and not self.fp16:
            raise ConfigError("the gpu profile builds its TensorRT models from the FP16 ONNX: drop --no-fp16")
        if self.serving.profile == "gpu" and self.int8 is True:
            raise ConfigError(
                "INT8 variants run on ONNX Runtime's CPU kernels: export them with --profile cpu "
                "(the gpu profile serves FP16 TensorRT)"
            )
        if self.torch_dtype not in TORCH_DTYPES:
            raise ConfigError(
                f"unknown TorchScript precision {self.torch_dtype!r}; choose one of {', '.join(TORCH_DTYPES)}"
            )
        if self.calibration_data is not None and not Path(self.calibration_data).is_file():
            raise ConfigError(f"calibration data {self.calibration_data} is not a file")
        if self.placement.may_split:
            if self.placement.profile_source(self.calibration_data, self.check_data) is None:
                raise ConfigError(NO_PROFILE_DATA)
            if self.placement.mode == "hot-cold" and self.serving.ort_trt:
                raise ConfigError("--ort-trt does not apply to a hot/cold model's dense part: drop it")

    def auc_gate(self, auc: float | None, delta: float | None, tolerance: float) -> tuple[bool, str]:
        """Whether a variant of AUC ``auc`` (``delta`` from FP32's) passes, and the rule, for messages.

        With :attr:`auc_target`, MLPerf's rule: at least that percent of FP32's AUC (one-sided);
        else ``|delta| <= tolerance``.
        """
        if delta is None or auc is None or delta != delta:
            return (
                False,
                f"tolerance {tolerance:g}" if self.auc_target is None else f"target {self.auc_target:g}%",
            )
        if self.auc_target is None:
            return abs(delta) <= tolerance, f"tolerance {tolerance:g}"
        floor = (auc - delta) * self.auc_target / 100
        return auc >= floor, f"target {self.auc_target:g}% of FP32's AUC {auc - delta:.4f}: {floor:.4f}"
