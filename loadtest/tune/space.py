"""The space ``python -m loadtest tune`` searches: server configurations and client loads.

A server point is one ``config.pbtxt`` of one variant of a family
(``<family>_onnx``, ``_onnx_fp16``, ``_onnx_int8``): instances, ONNX Runtime
intra-op threads, the dynamic batcher's max queue delay and preferred batch
sizes. Each needs a model (re)load. A client point is the request batch size
and the requests in flight, swept per loaded configuration at no reload cost.

Candidate configs are the repository's own config of that variant with only
the searched fields changed (:func:`candidate_config`), built and compared
as ``ModelConfig`` messages; so a candidate's diff against the default shows
exactly what tuning changes, and ``--apply`` writes nothing else.
"""

from __future__ import annotations

import difflib
import itertools
from dataclasses import dataclass, field
from pathlib import Path

from google.protobuf import text_format
from tritonclient.grpc import model_config_pb2 as mc

from bundle.errors import ConfigError
from bundle.repository import CONFIG_NAME, QUEUE_DELAY_US, ServingConfig, read_config
from loadtest.engine.session import THREADS_PARAMETER

#: Variant -> suffix of its model name (the repository's naming contract).
VARIANTS: dict[str, str] = {"fp32": "_onnx", "fp16": "_onnx_fp16", "int8": "_onnx_int8"}
#: The variant the cpu profile serves by default (docs/export.md, "CPU serving: which model to call").
DEFAULT_VARIANT = "int8"


def model_name(family: str, variant: str) -> str:
    """``dlrm`` + ``int8`` -> ``dlrm_onnx_int8``."""
    if variant not in VARIANTS:
        raise ConfigError(f"unknown variant {variant!r}; choose from {', '.join(VARIANTS)}")
    return f"{family}{VARIANTS[variant]}"


@dataclass(frozen=True, order=True)
class ServerPoint:
    """One served configuration (needs a model load).

    Args:
        variant: ``fp32``, ``fp16`` or ``int8``.
        instances: model instances (KIND_CPU).
        threads: ONNX Runtime intra-op threads per instance (0: its default, one per core).
        queue_delay_us: the dynamic batcher's max queue delay.
        preferred: the dynamic batcher's preferred batch sizes (empty: none).
    """

    variant: str
    instances: int
    threads: int
    queue_delay_us: int
    preferred: tuple[int, ...] = ()

    def __post_init__(self) -> None:
        if self.variant not in VARIANTS:
            raise ConfigError(f"unknown variant {self.variant!r}; choose from {', '.join(VARIANTS)}")
        if self.instances < 1 or self.threads < 0 or self.queue_delay_us < 0:
            raise ConfigError(f"instances >= 1, threads >= 0 and queue delay >= 0, got {self}")
        if any(size < 1 for size in self.preferred):
            raise ConfigError(f"preferred batch sizes must be >= 1, got {self.preferred}")

    @property
    def label(self) -> str:
        """A short name, e.g. ``int8 2x1t d100 p-``."""
        preferred = ",".join(map(str, self.preferred)) or "-"
        threads = f"{self.threads}t" if self.threads else "auto-t"
        return f"{self.variant} {self.instances}x{threads} d{self.queue_delay_us} p{preferred}"

    def as_dict(self) -> dict[str, object]:
        return {
            "variant": self.variant,
            "instances": self.instances,
            "threads": self.threads,
            "queue_delay_us": self.queue_delay_us,
            "preferred": list(self.preferred),
        }


def default_point(variants: tuple[str, ...]) -> ServerPoint:
    """What ``python -m export`` writes for the cpu profile: :class:`ServingConfig`'s defaults on
    the cpu profile's variant (INT8; FP32 when the repository has no INT8 model)."""
    serving = ServingConfig()
    return ServerPoint(
        variant=DEFAULT_VARIANT if DEFAULT_VARIANT in variants else "fp32",
        instances=serving.instances,
        threads=serving.intra_op_threads,
        queue_delay_us=QUEUE_DELAY_US["cpu"],
        preferred=serving.preferred_sizes,
    )


@dataclass(frozen=True)
class ClientPoint:
    """One client load: ``concurrency`` requests of ``batch_size`` rows in flight."""

    batch_size: int
    concurrency: int

    @property
    def label(self) -> str:
        return f"B={self.batch_size} c={self.concurrency}"


@dataclass(frozen=True)
class Space:
    """Every value of each searched dimension; the grid is their product.

    Args:
        family: ``dlrm`` or ``wide_deep`` (the model names' prefix).
        variants: which of :data:`VARIANTS` to try.
        instances: model instances (KIND_CPU) to try.
        threads: ONNX Runtime intra-op thread counts to try (0: its default).
        queue_delays_us: the dynamic batcher's max queue delays to try.
        preferred: the dynamic batcher's preferred batch size sets to try (empty: none).
        batch_sizes: request batch sizes, ascending.
        concurrency: requests in flight, ascending (a ladder, climbed per batch size).
    """

    family: str
    variants: tuple[str, ...] = ("fp32", "fp16", "int8")
    instances: tuple[int, ...] = (1, 2)
    threads: tuple[int, ...] = (0, 1)
    queue_delays_us: tuple[int, ...] = (100, 2000)
    preferred: tuple[tuple[int, ...], ...] = ((),)
    batch_sizes: tuple[int, ...] = (64, 256, 1024)
    concurrency: tuple[int, ...] = (1, 2, 4, 8)
    extra: tuple[ServerPoint, ...] = field(default=())

    def __post_init__(self) -> None:
        for name in ("variants", "instances", "threads", "queue_delays_us", "preferred"):
            if not getattr(self, name):
                raise ConfigError(f"the space needs at least one value of {name}")
        object.__setattr__(self, "batch_sizes", tuple(sorted(set(self.batch_sizes))))
        object.__setattr__(self, "concurrency", tuple(sorted(set(self.concurrency))))
        if not self.batch_sizes or self.batch_sizes[0] < 1:
            raise ConfigError(f"batch sizes must be >= 1, got {self.batch_sizes}")
        if not self.concurrency or self.concurrency[0] < 1:
            raise ConfigError(f"concurrency levels must be >= 1, got {self.concurrency}")
        if not self.family:
            raise ConfigError("name the model family (dlrm or wide_deep)")
        for variant in self.variants:
            model_name(self.family, variant)

    def server_points(self) -> list[ServerPoint]:
        """The grid's server points, then ``extra`` ones not in it (the default), without repeats."""
        points = [
            ServerPoint(v, i, t, d, p)
            for v, i, t, d, p in itertools.product(
                self.variants, self.instances, self.threads, self.queue_delays_us, self.preferred
            )
        ]
        return list(dict.fromkeys([*points, *self.extra]))

    def client_points(self) -> list[ClientPoint]:
        return [ClientPoint(b, c) for b in self.batch_sizes for c in self.concurrency]

    @property
    def size(self) -> int:
        """Points of the full grid (server x client): what a brute-force search measures."""
        return len(self.server_points()) * len(self.client_points())


def parse_preferred(text: str) -> tuple[tuple[int, ...], ...]:
    """``"none;2048;1024,2048"`` -> ``((), (2048,), (1024, 2048))``: sets separated by ``;``."""
    sets: list[tuple[int, ...]] = []
    for part in text.split(";"):
        part = part.strip()
        if part in ("", "none", "-"):
            sets.append(())
            continue
        try:
            sizes = tuple(sorted({int(size) for size in part.split(",") if size.strip()}))
        except ValueError:
            raise ConfigError(
                f"preferred batch sizes are ';'-separated sets like 'none;2048', got {text!r}"
            ) from None
        if not sizes or sizes[0] < 1:
            raise ConfigError(f"preferred batch sizes must be >= 1, got {part!r}")
        sets.append(sizes)
    return tuple(dict.fromkeys(sets))


def candidate_config(base: mc.ModelConfig, point: ServerPoint) -> mc.ModelConfig:
    """``base`` (the repository's config of ``point.variant``) with ``point``'s settings.

    Raises:
        ConfigError: a preferred batch size above the model's ``max_batch_size``.
    """
    if any(size > base.max_batch_size for size in point.preferred):
        raise ConfigError(
            f"{base.name}: preferred {point.preferred} exceed max_batch_size {base.max_batch_size}"
        )
    config = mc.ModelConfig()
    config.CopyFrom(base)
    kind = base.instance_group[0].kind if base.instance_group else mc.ModelInstanceGroup.KIND_CPU
    del config.instance_group[:]
    group = config.instance_group.add()
    group.count = point.instances
    group.kind = kind
    if point.threads:
        config.parameters[THREADS_PARAMETER].string_value = str(point.threads)
    elif THREADS_PARAMETER in config.parameters:
        del config.parameters[THREADS_PARAMETER]
    config.dynamic_batching.SetInParent()
    config.dynamic_batching.max_queue_delay_microseconds = point.queue_delay_us
    del config.dynamic_batching.preferred_batch_size[:]
    config.dynamic_batching.preferred_batch_size.extend(point.preferred)
    return config


def base_configs(repository: Path, family: str, variants: tuple[str, ...]) -> dict[str, mc.ModelConfig]:
    """The repository's config of each variant that it holds (at least one needed).

    Raises:
        ConfigError: none of ``variants`` is in the repository.
    """
    found = {}
    for variant in variants:
        path = repository / model_name(family, variant) / CONFIG_NAME
        if path.is_file():
            found[variant] = read_config(path)
    if not found:
        names = ", ".join(model_name(family, v) for v in variants)
        raise ConfigError(f"{repository} holds none of {names}: export the family first")
    return found


def config_text(config: mc.ModelConfig) -> str:
    """The config.pbtxt text of ``config`` (what :func:`bundle.repository.write_config` writes)."""
    return text_format.MessageToString(config)


def config_diff(before: mc.ModelConfig, after: mc.ModelConfig) -> str:
    """A unified diff of two config.pbtxt files (empty when equal)."""
    lines = difflib.unified_diff(
        config_text(before).splitlines(keepends=True),
        config_text(after).splitlines(keepends=True),
        fromfile=f"{before.name}/{CONFIG_NAME}",
        tofile=f"{after.name}/{CONFIG_NAME}",
    )
    return "".join(lines)
