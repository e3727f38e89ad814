"""How close a model runs to this machine's compute ceiling, in one run.

Three measurements, taken one after another in one process so that they
share the machine's state:

- the FP32 ceiling: numpy's sgemm (its BLAS, all cores) on ``N x N`` float32
  matrices, median GFLOP/s of several repeats (:func:`sgemm_ceiling`); and,
  for reference, ONNX Runtime's own INT8 GEMM (``MatMulInteger``, u8 x s8, the
  kernels an INT8 model runs on) and whether it has a BF16 GEMM at all
  (:func:`ort_gemm_probe`);
- the model's FLOPs per sample, counted from its ONNX graph
  (:func:`count_flops`): ``2 x M x N x K`` of every ``MatMul``/``Gemm`` and
  of their quantized forms, per row of the batch (DLRM's interaction is a
  batched ``MatMul`` and counts like the others); element-wise operators,
  lookups and quantization steps are not counted;
- the model's throughput in-process (ONNX Runtime on the file, as the local
  backend sets up its session: :mod:`loadtest.engine.baseline`) and, with a server,
  served (:func:`loadtest.engine.served.served_throughput`: gRPC or HTTP requests of
  ``B`` rows, ``C`` in flight, on the closed-loop driver, for a fixed time).

Every rate here comes from the one in-process timer (:mod:`loadtest.engine.timer`)
and the one load driver (:mod:`loadtest.engine.driver`).

Every throughput is then also a fraction of the ceiling:
``samples/s x FLOPs/sample / ceiling FLOP/s``. The FLOPs of an INT8 model
are those of the same multiplications, so its fraction says how it compares
with what FP32 arithmetic could reach at best; above 1.0 it beats the FP32
ceiling.
"""

from __future__ import annotations

import logging
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from bundle.errors import ConfigError, DataError
from bundle.onnx_session import inference_session
from bundle.records import RunRecord
from loadtest.engine.baseline import BaselineConfig, run_baseline
from loadtest.engine.payload import MAX_POOL_ROWS, PayloadPool, build_pool
from loadtest.engine.served import served_throughput
from loadtest.engine.timer import TimerConfig, time_call

logger = logging.getLogger(__name__)

#: Operators counted as matrix products, and the input index of their ``A`` and ``B``.
MATMUL_OPS: dict[str, tuple[int, int]] = {
    "MatMul": (0, 1),
    "Gemm": (0, 1),
    "FusedMatMul": (0, 1),
    "FusedGemm": (0, 1),
    "MatMulInteger": (0, 1),
    "MatMulIntegerToFloat": (0, 1),
    "DynamicQuantizeMatMul": (0, 1),
    "QLinearMatMul": (0, 3),
    "QGemm": (0, 3),
}
#: Of those, the ones that multiply 8-bit integers.
INT8_OPS = frozenset(
    {"MatMulInteger", "MatMulIntegerToFloat", "DynamicQuantizeMatMul", "QLinearMatMul", "QGemm"}
)
#: Initializers up to this many elements keep their values for shape inference (shape constants).
_SMALL_INITIALIZER = 64


def _gemm_timer(repeats: int) -> TimerConfig:
    """Timer settings of a GEMM: one warm-up call, then ``repeats`` repeats of exactly one call."""
    return TimerConfig(repeats=repeats, seconds=0.0, warmup_calls=1, min_calls=1)


@dataclass(frozen=True)
class GemmRate:
    """One GEMM throughput measurement.

    Attributes:
        what: the kernel (``numpy sgemm (openblas)``, ``onnxruntime MatMulInteger u8s8``, ...).
        size: ``N`` of the ``N x N x N`` product (0 when it could not run).
        gflops: median of the repeats, in GFLOP/s (GOP/s for integers); NaN when it could not run.
        repeats: each repeat's rate.
        note: why it could not run, or other remarks.
    """

    what: str
    size: int
    gflops: float
    repeats: tuple[float, ...] = ()
    note: str = ""


@dataclass(frozen=True)
class FlopCount:
    """Multiply-add work of one sample (one row of the batch).

    Attributes:
        per_sample: FLOPs per row (``2 x`` the multiply-adds).
        int8_per_sample: of those, the ones a quantized operator does in 8-bit integers
            (including QDQ ``MatMul``/``Gemm`` whose inputs both come from ``DequantizeLinear``).
        by_node: FLOPs per row of each counted node.
        unknown: matrix products whose shapes shape inference could not resolve (not counted).
    """

    per_sample: float
    int8_per_sample: float
    by_node: dict[str, float] = field(default_factory=dict)
    unknown: tuple[str, ...] = ()


def _blas_name() -> str:
    """The BLAS numpy links, as far as numpy tells."""
    try:
        config: Any = np.show_config(mode="dicts")  # type: ignore[call-arg,func-returns-value]
        blas = config.get("Build Dependencies", {}).get("blas", {})
        return f"{blas.get('name', 'unknown')} {blas.get('version', '')}".strip()
    except (TypeError, AttributeError):  # numpy < 1.25 has no mode="dicts"
        return "unknown BLAS"


def sgemm_ceiling(size: int = 4096, repeats: int = 7) -> GemmRate:
    """numpy float32 ``size x size`` matmul: median GFLOP/s over ``repeats`` (after one warm-up).

    Args:
        size: ``N`` (the product costs ``2 N^3`` FLOPs).
        repeats: timed products.
    """
    if size < 64 or repeats < 1:
        raise ConfigError(f"size must be >= 64 and repeats >= 1, got {size} and {repeats}")
    rng = np.random.default_rng(0)
    a = rng.standard_normal((size, size), dtype=np.float32)
    b = rng.standard_normal((size, size), dtype=np.float32)
    out = np.empty((size, size), dtype=np.float32)
    timing = time_call(lambda _: np.matmul(a, b, out=out), 2.0 * size**3 / 1e9, _gemm_timer(repeats))
    return GemmRate(f"numpy sgemm ({_blas_name()})", size, timing.median, tuple(timing.rates))


def _gemm_graph(kind: str, size: int) -> Any:
    """A one-node graph ``Y = X W`` with a constant ``size x size`` weight, as ONNX Runtime gets it."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(1)
    if kind == "int8":
        x = helper.make_tensor_value_info("x", TensorProto.UINT8, ["m", size])
        y = helper.make_tensor_value_info("y", TensorProto.INT32, ["m", size])
        weight = numpy_helper.from_array(rng.integers(-127, 128, (size, size), dtype=np.int8), "w")
        nodes = [helper.make_node("MatMulInteger", ["x", "w"], ["y"])]
    else:
        x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["m", size])
        y = helper.make_tensor_value_info("y", TensorProto.FLOAT, ["m", size])
        bits = rng.standard_normal((size, size), dtype=np.float32).view(np.uint32) >> 16
        weight = helper.make_tensor(
            "w", TensorProto.BFLOAT16, [size, size], bits.astype(np.uint16).tobytes(), raw=True
        )
        nodes = [
            helper.make_node("Cast", ["x"], ["xb"], to=TensorProto.BFLOAT16),
            helper.make_node("MatMul", ["xb", "w"], ["yb"]),
            helper.make_node("Cast", ["yb"], ["y"], to=TensorProto.FLOAT),
        ]
    graph = helper.make_graph(nodes, f"{kind}_gemm", [x], [y], [weight])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 20)], ir_version=9)
    onnx.checker.check_model(model)
    return model.SerializeToString()


def ort_gemm_probe(kind: str, size: int = 2048, repeats: int = 7, threads: int = 0) -> GemmRate:
    """ONNX Runtime's CPU GEMM for ``kind`` (``int8``: ``MatMulInteger`` u8 x s8; ``bf16``:
    ``MatMul`` on bfloat16) at ``size x size x size``: median GOP/s, or NaN with the reason
    when ONNX Runtime has no kernel for it.

    Args:
        kind: ``int8`` or ``bf16``.
        size: ``N`` of the product.
        repeats: timed runs.
        threads: intra-op threads (0: ONNX Runtime's default, one per core).
    """
    if kind not in ("int8", "bf16"):
        raise ConfigError(f"kind must be int8 or bf16, got {kind!r}")
    what = "onnxruntime MatMulInteger u8s8" if kind == "int8" else "onnxruntime MatMul bfloat16"
    try:
        session = inference_session(_gemm_graph(kind, size), intra_op_threads=threads)
    except DataError as exc:  # no kernel for it in this build: ONNX Runtime's own words, first line
        why = str(exc.__cause__ or exc).splitlines()[0][:200]
        return GemmRate(what, 0, float("nan"), note=f"not available: {why}")
    rng = np.random.default_rng(2)
    x: np.ndarray = (
        rng.integers(0, 256, (size, size), dtype=np.uint8)
        if kind == "int8"
        else rng.standard_normal((size, size), dtype=np.float32)
    )
    timing = time_call(lambda _: session.run(None, {"x": x}), 2.0 * size**3 / 1e9, _gemm_timer(repeats))
    return GemmRate(what, size, timing.median, tuple(timing.rates))


def _light_model(model_file: Path, batch: int) -> Any:
    """The graph of ``model_file`` without large weights, every input's batch dimension set to ``batch``."""
    import onnx
    from google.protobuf.message import DecodeError

    if not model_file.is_file():
        raise DataError(f"model file {model_file} does not exist")
    try:
        model = onnx.load(str(model_file), load_external_data=False)
    except (OSError, ValueError, DecodeError) as exc:
        raise DataError(f"{model_file}: not an ONNX model ({exc})") from None
    for init in model.graph.initializer:
        elements = int(np.prod(init.dims)) if init.dims else 1
        if elements > _SMALL_INITIALIZER:
            # Shapes stay in dims; values are not needed to infer shapes.
            init.ClearField("raw_data")
            init.ClearField("external_data")
            init.data_location = onnx.TensorProto.DEFAULT
    for value in model.graph.input:
        dims = value.type.tensor_type.shape.dim
        if dims:
            dims[0].ClearField("dim_param")
            dims[0].dim_value = batch
    return model


def _shape(shapes: dict[str, list[int]], name: str) -> list[int] | None:
    dims = shapes.get(name)
    if dims is None or any(d <= 0 for d in dims):
        return None
    return dims


def count_flops(model_file: Path) -> FlopCount:
    """FLOPs per sample of the matrix products in ``model_file`` (see :class:`FlopCount`).

    The batch dimension is set to 2 and ONNX shape inference (with data
    propagation, for shapes computed in the graph) resolves every product's
    shapes; the count is divided by 2.

    Raises:
        DataError: the file is missing or not an ONNX model.
    """
    import onnx

    batch = 2
    model = _light_model(model_file, batch)
    inferred = onnx.shape_inference.infer_shapes(model, data_prop=True)
    shapes: dict[str, list[int]] = {}
    for value in [*inferred.graph.value_info, *inferred.graph.input, *inferred.graph.output]:
        if value.type.HasField("tensor_type") and value.type.tensor_type.HasField("shape"):
            shapes[value.name] = [
                d.dim_value if d.HasField("dim_value") else -1 for d in value.type.tensor_type.shape.dim
            ]
    for init in inferred.graph.initializer:
        shapes[init.name] = list(init.dims)
    producers = {out: node.op_type for node in inferred.graph.node for out in node.output}
    by_node: dict[str, float] = {}
    int8 = 0.0
    unknown: list[str] = []
    for index, node in enumerate(inferred.graph.node):
        if node.op_type not in MATMUL_OPS:
            continue
        name = node.name or f"{node.op_type}_{index}"
        a_index, b_index = MATMUL_OPS[node.op_type]
        a = _shape(shapes, node.input[a_index])
        out = _shape(shapes, node.output[0])
        if a is None or out is None or not a:
            unknown.append(name)
            continue
        trans_a = any(attr.name == "transA" and attr.i for attr in node.attribute)
        k = a[0] if trans_a and len(a) == 2 else a[-1]
        flops = 2.0 * float(np.prod(out)) * k / batch
        by_node[name] = flops
        dequantized = all(producers.get(node.input[i]) == "DequantizeLinear" for i in (a_index, b_index))
        if node.op_type in INT8_OPS or dequantized:
            int8 += flops
    if unknown:
        logger.warning("%s: shapes of %s unknown; not counted", model_file, unknown)
    return FlopCount(sum(by_node.values()), int8, by_node, tuple(unknown))


def in_process_throughput(
    model_file: Path,
    pool: PayloadPool,
    batch_size: int,
    threads: int | None = None,
    repeats: int = 5,
    seconds: float = 2.0,
) -> dict[str, Any]:
    """Median samples/s of ``model_file`` under ONNX Runtime in this process (:func:`run_baseline`)."""
    result = run_baseline(BaselineConfig(model_file, (batch_size,), repeats, seconds, threads), pool)[0]
    return result.as_dict()


@dataclass(frozen=True)
class RooflineOptions:
    """What one roofline run measures.

    Args:
        model_file: the ONNX file (in-process, and the FLOP count).
        model: the served model's name (with ``url``).
        url: ``host:port`` of a running server (None: in-process only).
        protocol: ``grpc`` or ``http``.
        batch_size: rows per call ``B``.
        concurrency: requests in flight, each level measured (served).
        seconds: length of one timed repeat.
        repeats: timed repeats (medians reported).
        threads: in-process intra-op threads (None: the model's config.pbtxt, else ORT's default).
        gemm_size: ``N`` of the sgemm ceiling.
        probes: also time ONNX Runtime's INT8 GEMM and try its BF16 GEMM.
        data: Criteo TSV for the rows (None: synthetic).
    """

    model_file: Path
    model: str | None = None
    url: str | None = None
    protocol: str = "grpc"
    batch_size: int = 1024
    concurrency: tuple[int, ...] = (1, 2, 4)
    seconds: float = 3.0
    repeats: int = 5
    threads: int | None = None
    gemm_size: int = 4096
    probes: bool = True
    data: Path | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "model_file", Path(self.model_file))
        object.__setattr__(self, "concurrency", tuple(self.concurrency))
        if (self.url is None) != (self.model is None):
            raise ConfigError("--url and --model go together: the served model at that address")
        if self.batch_size < 1 or not self.concurrency or min(self.concurrency) < 1:
            raise ConfigError("batch size and concurrency must be >= 1")
        if self.repeats < 1 or self.seconds <= 0:
            raise ConfigError("repeats must be >= 1 and seconds > 0")
        if not self.model_file.is_file():
            raise ConfigError(f"--model-file {self.model_file} is not a file")


def fraction(samples_per_s: float, flops_per_sample: float, ceiling_gflops: float) -> float:
    """``samples/s x FLOPs/sample`` as a fraction of the ceiling (NaN when undefined)."""
    if not ceiling_gflops or not np.isfinite(ceiling_gflops) or not flops_per_sample:
        return float("nan")
    return samples_per_s * flops_per_sample / (ceiling_gflops * 1e9)


def run_roofline(options: RooflineOptions, command: str = "") -> dict[str, Any]:
    """Ceiling, FLOPs, in-process and served throughput of one model, in one run (JSON-ready).

    Order: the ceiling first, then in-process, then served, each while nothing
    else of this run is busy. ``command`` goes into the run's record.
    """
    record = RunRecord.begin(command)
    ceiling = sgemm_ceiling(options.gemm_size)
    logger.info("sgemm ceiling: %.1f GFLOP/s", ceiling.gflops)
    probes = [ort_gemm_probe(kind) for kind in ("int8", "bf16")] if options.probes else []
    flops = count_flops(options.model_file)
    ceiling_samples = ceiling.gflops * 1e9 / flops.per_sample if flops.per_sample else float("nan")
    pool = build_pool(1, data=options.data, batches=MAX_POOL_ROWS).rebatched(options.batch_size)
    in_process = in_process_throughput(
        options.model_file, pool, options.batch_size, options.threads, options.repeats, options.seconds
    )
    in_process["fraction_of_ceiling"] = fraction(
        in_process["samples_per_s"], flops.per_sample, ceiling.gflops
    )
    served: list[dict[str, Any]] = []
    if options.url is not None and options.model is not None:
        for level in options.concurrency:
            result = asdict(
                served_throughput(
                    options.url,
                    options.model,
                    pool,
                    level,
                    options.protocol,
                    options.seconds,
                    options.repeats,
                )
            )
            result["fraction_of_ceiling"] = fraction(
                result["samples_per_s"], flops.per_sample, ceiling.gflops
            )
            served.append(result)
    return {
        **record.finish().to_json(),
        "ceiling": asdict(ceiling),
        "probes": [asdict(p) for p in probes],
        "model_file": str(options.model_file),
        "flops": asdict(flops),
        "ceiling_samples_per_s": ceiling_samples,
        "batch_size": options.batch_size,
        "in_process": in_process,
        "served": served,
    }


def report_lines(result: dict[str, Any]) -> list[str]:
    """The run of :func:`run_roofline` as the lines ``python -m loadtest roofline`` prints."""
    ceiling = result["ceiling"]
    flops = result["flops"]
    machine = result["machine"]
    flags = ", ".join(flag for flag, on in machine.get("cpu_flags", {}).items() if on) or "none of note"
    during = result["load_during"]
    lines = [
        f"machine: {machine['cpu']}, {machine['cores']} cores ({flags}); "
        f"load average (1 min) {during['min']}-{during['max']} during the run",
        f"FP32 ceiling: {ceiling['gflops']:.1f} GFLOP/s ({ceiling['what']}, {ceiling['size']}^3, median of "
        f"{len(ceiling['repeats'])}: {min(ceiling['repeats']):.1f}-{max(ceiling['repeats']):.1f})",
    ]
    for probe in result["probes"]:
        if probe["size"]:
            lines.append(
                f"  {probe['what']}: {probe['gflops']:.0f} GOP/s ({probe['gflops'] / ceiling['gflops']:.1f}x)"
            )
        else:
            lines.append(f"  {probe['what']}: {probe['note']}")
    int8_share = flops["int8_per_sample"] / flops["per_sample"] if flops["per_sample"] else 0.0
    local = result["in_process"]
    lines += [
        f"model: {result['model_file']}: {flops['per_sample'] / 1e6:.3f} MFLOP/sample "
        f"({int8_share:.0%} in INT8 operators) -> ceiling {result['ceiling_samples_per_s']:,.0f} samples/s",
        f"in-process (ONNX Runtime, B={result['batch_size']}, threads {local['threads'] or 'default'}): "
        f"{local['samples_per_s']:,.0f} samples/s = {local['fraction_of_ceiling']:.2f} of the ceiling",
    ]
    for served in result["served"]:
        lines.append(
            f"served ({served['protocol']} {served['model']}, B={served['batch_size']}, "
            f"concurrency {served['concurrency']}): {served['samples_per_s']:,.0f} samples/s = "
            f"{served['fraction_of_ceiling']:.2f} of the ceiling (p50 {served['p50_ms']:.1f} ms)"
        )
    return lines
