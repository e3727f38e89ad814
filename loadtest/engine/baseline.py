"""In-process throughput and latency: the same ONNX file under ONNX Runtime in this process.

The reference every served number is divided by. The session is set up as
the local Triton backend sets up its own (:mod:`loadtest.engine.session`), with
the intra-op thread count of the model's config.pbtxt unless told otherwise,
and runs on batches from the same payload pool the load test sends. Each
batch size is timed by :mod:`loadtest.engine.timer`, ``repeats`` times for
``seconds`` each; the median repeat is reported, so one noisy second does not
move the result.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from bundle.errors import ConfigError
from bundle.schema import OUTPUT
from loadtest.engine.payload import PayloadPool, build_pool
from loadtest.engine.session import ort_session, serving_device, serving_settings
from loadtest.engine.timer import Call, TimerConfig, Timing, time_call, time_calls

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class BaselineConfig:
    """How to time a model in-process.

    Args:
        model_file: the ``model.onnx`` to run.
        batch_sizes: rows per call, each timed on its own.
        repeats: timed repeats per batch size (the median is reported).
        seconds: length of one repeat (at least 3 calls run).
        threads: ONNX Runtime intra-op threads; None: what the model's
            config.pbtxt asks the server for (0: ONNX Runtime's default).
        warmup_calls: untimed calls before the first repeat.
    """

    model_file: Path
    batch_sizes: tuple[int, ...]
    repeats: int = 5
    seconds: float = 1.0
    threads: int | None = None
    warmup_calls: int = 3

    def __post_init__(self) -> None:
        object.__setattr__(self, "model_file", Path(self.model_file))
        object.__setattr__(self, "batch_sizes", tuple(self.batch_sizes))
        if not self.batch_sizes or any(b < 1 for b in self.batch_sizes):
            raise ConfigError(f"batch sizes must be >= 1, got {self.batch_sizes}")
        if self.repeats < 1:
            raise ConfigError(f"repeats must be >= 1, got {self.repeats}")
        if not self.seconds > 0:
            raise ConfigError(f"seconds must be > 0, got {self.seconds}")
        if self.threads is not None and self.threads < 0:
            raise ConfigError(f"threads must be >= 0, got {self.threads}")
        if self.warmup_calls < 0:
            raise ConfigError(f"warmup_calls must be >= 0, got {self.warmup_calls}")

    def timer(self) -> TimerConfig:
        """How :mod:`loadtest.engine.timer` times one batch size."""
        return TimerConfig(self.repeats, self.seconds, self.warmup_calls)


@dataclass(frozen=True)
class BaselineResult:
    """In-process numbers of one batch size.

    Attributes:
        model_file: the ONNX file.
        batch_size: rows per call ``B``.
        threads: intra-op threads the session ran with (0: ONNX Runtime's default).
        samples_per_s: median over repeats of rows per second.
        calls_per_s: ``samples_per_s / batch_size``.
        p50_ms, p99_ms: latency of single calls over all repeats.
        repeats: the samples/s of each repeat.
        provider: the ONNX Runtime provider the session ran on: the served model's
            device (CUDA for a KIND_GPU instance), so the ratio compares like with like.
    """

    model_file: str
    batch_size: int
    threads: int
    samples_per_s: float
    calls_per_s: float
    p50_ms: float
    p99_ms: float
    repeats: tuple[float, ...]
    provider: str = "CPUExecutionProvider"

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> BaselineResult:
        values = dict(data)
        values["repeats"] = tuple(values.get("repeats", ()))
        return cls(**values)


class _InProcess:
    """What both in-process runners share: a result from the timer's repeats, and timing one
    batch size. A runner sets ``config`` and ``threads`` and defines ``call`` and ``provider``."""

    config: BaselineConfig
    threads: int

    @property
    def provider(self) -> str:
        raise NotImplementedError

    def call(self, pool: PayloadPool) -> Call:
        raise NotImplementedError

    def result(self, batch_size: int, timing: Timing) -> BaselineResult:
        """The timer's repeats at ``batch_size`` as a result."""
        median = timing.median
        result = BaselineResult(
            model_file=str(self.config.model_file),
            batch_size=batch_size,
            threads=self.threads,
            samples_per_s=median,
            calls_per_s=median / batch_size,
            p50_ms=timing.percentile_ms(50),
            p99_ms=timing.percentile_ms(99),
            repeats=tuple(timing.rates),
            provider=self.provider,
        )
        logger.debug(
            "in-process %s B=%d: %.0f samples/s (median of %d), p50 %.3f ms",
            self.config.model_file,
            batch_size,
            result.samples_per_s,
            len(timing.rates),
            result.p50_ms,
        )
        return result

    def measure(self, batch_size: int, pool: PayloadPool) -> BaselineResult:
        """Time calls of ``batch_size`` rows from ``pool`` (re-cut to that batch size)."""
        timing = time_call(self.call(pool.rebatched(batch_size)), batch_size, self.config.timer())
        return self.result(batch_size, timing)


class InProcessModel(_InProcess):
    """One ONNX Runtime session of a model file, kept to be timed at several batch sizes.

    Args:
        config: the model file, repeats, seconds and threads (its batch sizes are
            what :meth:`measure_all` times).
    """

    def __init__(self, config: BaselineConfig) -> None:
        self.config = config
        threads = config.threads
        if threads is None:
            threads = serving_settings(config.model_file)["threads"]
        self.threads = threads
        self.device = serving_device(config.model_file)
        self._session = ort_session(config.model_file, threads, self.device)

    @property
    def provider(self) -> str:
        return str(self._session.get_providers()[0])

    def call(self, pool: PayloadPool) -> Call:
        """One session run per call, on the pool's batches in turn (for :mod:`loadtest.engine.timer`)."""
        batches = pool.batches()
        session = self._session
        return lambda index: session.run([OUTPUT], batches[index % len(batches)])

    def measure_all(self, pool: PayloadPool) -> list[BaselineResult]:
        """Time every batch size of the config, in order."""
        return [self.measure(batch_size, pool) for batch_size in self.config.batch_sizes]


def run_baseline(config: BaselineConfig, pool: PayloadPool | None = None) -> list[BaselineResult]:
    """Time ``config.model_file`` in-process at each batch size.

    Args:
        config: the model file, batch sizes, repeats.
        pool: rows to run (batch size 1 or any; re-cut per batch size); synthetic rows when None.

    Returns:
        One result per batch size, in the order given.
    """
    rows = pool if pool is not None else build_pool(1, batches=max(config.batch_sizes) * 4)
    return InProcessModel(config).measure_all(rows)


def ratio(served: float, in_process: float) -> float:
    """``served / in_process`` (NaN when either is missing or zero)."""
    if not in_process or math.isnan(in_process) or math.isnan(served):
        return math.nan
    return served / in_process


def measure_interleaved(
    models: Mapping[str, InProcessModel], pool: PayloadPool, config: TimerConfig
) -> dict[str, BaselineResult]:
    """Several sessions at the pool's batch size, timed in turns (:func:`loadtest.engine.timer.time_calls`),
    so a burst of background load hits them alike."""
    timings = time_calls({name: model.call(pool) for name, model in models.items()}, pool.batch_size, config)
    return {name: models[name].result(pool.batch_size, timing) for name, timing in timings.items()}


def load_torchscript(path: Path, device: Any) -> tuple[Any, list[str]]:
    """The TorchScript module at ``path`` on ``device`` (a ``torch.device``), in eval mode, and the
    names of its ``forward``'s arguments: the order in which it takes the model's inputs.

    Raises:
        ConfigError: ``path`` is not a TorchScript file torch can load.
    """
    import torch

    try:
        module = torch.jit.load(str(path), map_location=device).eval()
    except (RuntimeError, ValueError) as exc:
        raise ConfigError(f"torch.jit.load cannot load {path}: {exc}") from None
    return module, [argument.name for argument in module.forward.schema.arguments][1:]


class TorchInProcessModel(_InProcess):
    """A TorchScript ``model.pt`` (a ``<family>_torch`` variant) in this process, timed like
    :class:`InProcessModel`: on the device its config puts the served instance on
    (``cuda:0`` for KIND_GPU), fed numpy batches that are copied to the device and
    answered back to numpy on every call, as the served backend does.

    Args:
        config: the model file, repeats, seconds (``threads``: torch's intra-op threads; 0 or
            None: torch's default).
    """

    def __init__(self, config: BaselineConfig) -> None:
        import torch

        self.config = config
        self.threads = config.threads or 0
        if self.threads:
            torch.set_num_threads(self.threads)
        if serving_device(config.model_file) == "gpu":
            if not torch.cuda.is_available():
                raise ConfigError(
                    f"{config.model_file} is served on a GPU (KIND_GPU), but torch {torch.__version__} "
                    "sees no CUDA device: its in-process baseline would time the CPU against the GPU"
                )
            self._device = torch.device("cuda", 0)
        else:
            self._device = torch.device("cpu")
        self._module, self._order = load_torchscript(config.model_file, self._device)

    @property
    def provider(self) -> str:
        return f"torch {self._device}"

    def call(self, pool: PayloadPool) -> Call:
        """One forward per call, numpy in and out, on the pool's batches in turn."""
        import torch

        batches = [[torch.from_numpy(batch[name]) for name in self._order] for batch in pool.batches()]
        module, device = self._module, self._device

        def run(index: int) -> Any:
            with torch.inference_mode():
                tensors = [t.to(device) for t in batches[index % len(batches)]]
                return module(*tensors).cpu().numpy()

        return run


def in_process_model(config: BaselineConfig) -> InProcessModel | TorchInProcessModel:
    """The in-process runner for ``config.model_file``: TorchScript for ``.pt``, else ONNX Runtime."""
    if config.model_file.suffix == ".pt":
        return TorchInProcessModel(config)
    return InProcessModel(config)
