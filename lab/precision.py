"""Served samples/s of each precision at batch 1024, as fractions of the FP32 ceiling of the same run.

One run, in this order:

1. the FP32 ceiling: numpy sgemm (all cores), and ONNX Runtime's INT8 and BF16 GEMM probes;
2. per family, every precision variant loaded in the local tritonserver and
   driven with requests of ``B`` rows at each concurrency, the variants taking
   turns round by round (a burst of background load hits them alike);
3. per family, the same files in-process, in turns;
4. the sgemm ceiling again (its repeats from both ends make the ceiling).

Each variant's AUC delta and max abs difference against FP32 come from its
``export_report.json`` (the export's accuracy gate). Served numbers come from
the closed-loop driver (:func:`loadtest.engine.served.served_throughput`), in-process
ones and the ceiling from the in-process timer (:mod:`loadtest.engine.timer`).
``python -m lab precision`` writes ``precision.json`` and ``precision.md``;
``benchmarks/cpu/run.sh`` reproduces the committed ones.
"""

from __future__ import annotations

import logging
import math
import shutil
import statistics
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from bundle.errors import ConfigError
from bundle.records import RunRecord
from bundle.repository import (
    CONFIG_NAME,
    MODEL_FILE,
    ORT_SPINNING_KEY,
    config_bags,
    read_config,
    read_report,
    version_dir,
    write_config,
)
from bundle.snippets import name_for, section_end, section_start
from loadtest.engine.baseline import BaselineConfig, InProcessModel, measure_interleaved
from loadtest.engine.payload import MAX_POOL_ROWS, Hotness, PayloadPool, build_pool
from loadtest.engine.served import served_throughput
from loadtest.engine.timer import TimerConfig
from loadtest.engine.writer import table, write_json, write_markdown
from loadtest.roofline import count_flops, fraction, ort_gemm_probe, sgemm_ceiling

logger = logging.getLogger(__name__)

FAMILIES = ("dlrm", "wide_deep")
#: (precision label, model name suffix), in report order.
VARIANTS = (
    ("FP32", "_onnx"),
    ("FP16", "_onnx_fp16"),
    ("INT8 static", "_onnx_int8"),
    ("INT8 dynamic", "_onnx_int8_dynamic"),
)
#: The model name suffix of the INT8 variant exported with ``--int8-method dynamic``.
DYNAMIC_SUFFIX = "_onnx_int8_dynamic"


@dataclass(frozen=True)
class PrecisionOptions:
    """What the precision run measures.

    Args:
        repository: a cpu-profile repository with ``<family>_onnx`` (and its variants).
        out: folder for ``precision.json`` and ``precision.md``.
        dynamic_repository: a repository exported with ``--int8-method dynamic``; its
            ``<family>_onnx_int8`` joins ``repository`` as ``<family>_onnx_int8_dynamic``.
        data: Criteo TSV for the request rows (None: synthetic).
        batch_size: rows per request.
        concurrency: requests in flight, each level measured.
        rounds: turns over the variants (medians reported).
        seconds: one served window / in-process repeat.
        gemm_size: ``N`` of the sgemm ceiling.
    """

    repository: Path
    out: Path
    dynamic_repository: Path | None = None
    data: Path | None = None
    batch_size: int = 1024
    concurrency: tuple[int, ...] = (1, 2, 4)
    rounds: int = 5
    seconds: float = 2.0
    gemm_size: int = 4096

    def __post_init__(self) -> None:
        if self.rounds < 1 or self.seconds <= 0 or self.batch_size < 1 or not self.concurrency:
            raise ConfigError("rounds, batch size and concurrency must be >= 1, seconds > 0")
        if (
            not (self.repository / f"{FAMILIES[0]}_onnx").is_dir()
            and not (self.repository / f"{FAMILIES[1]}_onnx").is_dir()
        ):
            raise ConfigError(f"{self.repository} holds neither dlrm_onnx nor wide_deep_onnx")


def add_dynamic_variants(repository: Path, dynamic_repository: Path) -> list[str]:
    """Copy each ``<family>_onnx_int8`` of ``dynamic_repository`` into ``repository`` as
    ``<family>_onnx_int8_dynamic`` (config renamed, export report kept)."""
    added = []
    for family in FAMILIES:
        source = dynamic_repository / f"{family}_onnx_int8"
        if not (source / CONFIG_NAME).is_file():
            continue
        name = f"{family}{DYNAMIC_SUFFIX}"
        target = repository / name
        if target.exists():
            shutil.rmtree(target)
        shutil.copytree(source, target)
        config = read_config(target / CONFIG_NAME)
        config.name = name
        write_config(target, config)
        added.append(name)
    return added


def _served_round(
    server: Any, names: list[str], pool: PayloadPool, options: PrecisionOptions, results: dict[str, Any]
) -> None:
    for name in names:
        for level in options.concurrency:
            result = served_throughput(
                server.grpc_url, name, pool, level, "grpc", options.seconds, repeats=1, warmup_s=0.5
            )
            entry = results.setdefault(name, {}).setdefault(str(level), {"repeats": [], "p50_ms": []})
            entry["repeats"].append(result.samples_per_s)
            entry["p50_ms"].append(result.p50_ms)


def _best_served(by_level: dict[str, Any]) -> dict[str, Any]:
    """The concurrency with the highest median samples/s, and every level's median."""
    medians = {level: statistics.median(entry["repeats"]) for level, entry in by_level.items()}
    best = max(medians, key=lambda level: medians[level])
    return {
        "samples_per_s": medians[best],
        "concurrency": int(best),
        "repeats": by_level[best]["repeats"],
        "p50_ms": statistics.median(by_level[best]["p50_ms"]),
        "by_concurrency": medians,
    }


def _gate(repository: Path, name: str) -> dict[str, Any]:
    """The accuracy check of ``name`` from its export report (FP32: against the framework)."""
    report = read_report(repository, name)
    if not report:
        return {}
    parity = report.get("parity", {})
    return {
        "checked_against": report.get("checked_against"),
        "rows": parity.get("rows"),
        "auc_delta": parity.get("auc_delta"),
        "max_abs_diff": parity.get("max_abs_diff"),
        "auc_tolerance": report.get("auc_tolerance"),
        "max_abs_diff_between_batch_sizes": report.get("max_abs_diff_between_batch_sizes"),
        "quantization": report.get("quantization"),
    }


HEADER = [
    "precision (model)",
    "served samples/s",
    "x FP32 ceiling",
    "x INT8 GEMM",
    "conc.",
    "in-process samples/s",
    "x ceiling",
    "served / in-process",
    "AUC delta vs FP32",
    "max abs diff",
    "row moves with batch",
]
#: A row's answer "does not depend on the batch" when it moves less than this between batch sizes.
DETERMINISTIC_ATOL = 1e-6


def _passes(row: dict[str, Any]) -> bool:
    gate = row["gate"]
    if row["precision"] == "FP32":
        return True
    delta, tolerance = gate.get("auc_delta"), gate.get("auc_tolerance") or 1e-3
    return delta is not None and abs(delta) <= tolerance


def _verdict(rows: list[dict[str, Any]]) -> list[str]:
    """Which variant is fastest served among those that pass the gate, overall and among those whose
    answer for a row does not depend on the rows batched with it."""

    def line(what: str, row: dict[str, Any]) -> str:
        return (
            f"- {what}: {row['precision']} (`{row['model']}`), {row['served']['samples_per_s']:,.0f} "
            f"samples/s = **{row['served_fraction_of_ceiling']:.2f}x** the FP32 ceiling"
        )

    passing = [r for r in rows if _passes(r)]
    if not passing:
        return ["- no variant passes the accuracy gate"]
    fastest = max(passing, key=lambda r: r["served"]["samples_per_s"])
    steady = [
        r for r in passing if (r["gate"].get("max_abs_diff_between_batch_sizes") or 0.0) <= DETERMINISTIC_ATOL
    ]
    lines = [line("fastest served variant that passes the gate", fastest)]
    if steady:
        lines.append(
            line(
                "fastest that passes and gives a row the same answer in any batch",
                max(steady, key=lambda r: r["served"]["samples_per_s"]),
            )
        )
    return lines


def _in_process(
    options: PrecisionOptions, families: dict[str, list[tuple[str, str]]], pools: dict[str, PayloadPool]
) -> dict[str, Any]:
    """Every variant's in-process samples/s, the variants of a family taking turns."""
    timer = TimerConfig(repeats=options.rounds, seconds=options.seconds)
    results: dict[str, Any] = {}
    for family, variants in families.items():
        pool = pools[family]
        models = {
            name: InProcessModel(
                BaselineConfig(version_dir(options.repository, name) / MODEL_FILE, (pool.batch_size,))
            )
            for _, name in variants
        }
        for name, result in measure_interleaved(models, pool, timer).items():
            results[name] = result.as_dict()
    return results


def run_precision(options: PrecisionOptions, command: str) -> dict[str, Any]:
    """Measure every variant of every family in ``options.repository`` (see the module doc)."""
    from server import LocalServer, ServerConfig

    record = RunRecord.begin(command)
    if options.dynamic_repository is not None:
        add_dynamic_variants(options.repository, options.dynamic_repository)
    ceiling_start = sgemm_ceiling(options.gemm_size, repeats=9)
    probes = [ort_gemm_probe("int8"), ort_gemm_probe("bf16")]
    pool = build_pool(1, data=options.data, batches=MAX_POOL_ROWS).rebatched(options.batch_size)
    families: dict[str, list[tuple[str, str]]] = {}
    for family in FAMILIES:
        present = [
            (label, f"{family}{suffix}")
            for label, suffix in VARIANTS
            if (version_dir(options.repository, f"{family}{suffix}") / MODEL_FILE).is_file()
        ]
        if present:
            families[family] = present
    # A multi-hot model takes each row's bags (its config's hotness, or bags of any size): one
    # pool per family.
    pools = {
        family: pool.multi_hot(_hotness(options.repository / f"{family}_onnx" / CONFIG_NAME))
        for family in families
    }
    served: dict[str, Any] = {}
    config = ServerConfig.with_free_ports(
        options.repository, model_control_mode="explicit", log_file=Path("logs/benchmarks-cpu-precision.log")
    )
    with LocalServer(config) as server:
        for family, variants in families.items():
            names = [name for _, name in variants]
            for name in names:
                server.load_model(name, timeout=600)
            for round_index in range(options.rounds):
                logger.info("%s served, round %d/%d", family, round_index + 1, options.rounds)
                _served_round(server, names, pools[family], options, served)
            for name in names:
                server.unload_model(name)
    in_process = _in_process(options, families, pools)
    ceiling_end = sgemm_ceiling(options.gemm_size, repeats=9)
    ceiling = statistics.median([*ceiling_start.repeats, *ceiling_end.repeats])
    rows: list[dict[str, Any]] = []
    for family, variants in families.items():
        flops = count_flops(version_dir(options.repository, f"{family}_onnx") / MODEL_FILE)
        for label, name in variants:
            best = _best_served(served[name])
            local = in_process[name]
            rows.append(
                {
                    "family": family,
                    "precision": label,
                    "model": name,
                    "flops_per_sample": flops.per_sample,
                    "ceiling_samples_per_s": ceiling * 1e9 / flops.per_sample,
                    "served": best,
                    "served_fraction_of_ceiling": fraction(best["samples_per_s"], flops.per_sample, ceiling),
                    "in_process": local,
                    "in_process_fraction_of_ceiling": fraction(
                        local["samples_per_s"], flops.per_sample, ceiling
                    ),
                    "served_over_in_process": best["samples_per_s"] / local["samples_per_s"],
                    "gate": _gate(options.repository, name),
                    "serving": _serving(options.repository, name),
                }
            )
    return {
        **record.finish().to_json(),
        "options": {k: str(v) if isinstance(v, Path) else v for k, v in asdict(options).items()},
        "ceiling_gflops": ceiling,
        "ceiling_start": asdict(ceiling_start),
        "ceiling_end": asdict(ceiling_end),
        "probes": [asdict(p) for p in probes],
        "results": rows,
    }


def _serving(repository: Path, name: str) -> str:
    config = read_config(repository / name / CONFIG_NAME)
    parameters = config.parameters
    threads = (
        parameters["intra_op_thread_count"].string_value
        if "intra_op_thread_count" in parameters
        else "default"
    )
    spinning = {"0": "off", "1": "on"}.get(
        parameters[ORT_SPINNING_KEY].string_value if ORT_SPINNING_KEY in parameters else "", "default (on)"
    )
    group = config.instance_group[0]
    return (
        f"{group.count} instance(s), intra-op threads {threads}, intra-op spinning {spinning}, "
        f"queue delay {config.dynamic_batching.max_queue_delay_microseconds} us, "
        f"preferred {list(config.dynamic_batching.preferred_batch_size) or 'none'}"
    )


def _fmt(value: float | None, spec: str) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "-"
    return format(value, spec)


#: The report's named sections (:mod:`bundle.snippets`), which the documentation includes:
#: everything below the title; the GEMM ceilings; each family's table and verdicts (the section
#: is named after the family, ``dlrm``, ``wide_deep``); the notes under the tables.
SECTION_RESULTS = "results"
SECTION_CEILINGS = "ceilings"
SECTION_NOTES = "notes"


def write_precision(result: dict[str, Any], out: Path) -> dict[str, Path]:
    """Write ``precision.json`` and ``precision.md`` into ``out``."""
    lines = [
        "# CPU serving by precision, against the GEMM ceilings measured in the same run",
        "",
        section_start(SECTION_RESULTS),
        *RunRecord.from_json(result).lines(),
        "",
        section_start(SECTION_CEILINGS),
        f"FP32 ceiling: numpy sgemm {result['ceiling_start']['size']}^3 on all cores "
        f"({result['ceiling_start']['what']}), median of the 18 products at the start and the end "
        f"of the run: **{result['ceiling_gflops']:.1f} GFLOP/s** "
        f"(start {result['ceiling_start']['gflops']:.1f}, end {result['ceiling_end']['gflops']:.1f}).",
        "",
    ]
    for probe in result["probes"]:
        if probe["size"]:
            lines.append(
                f"- {probe['what']} ({probe['size']}^3): {probe['gflops']:.0f} GOP/s "
                f"({probe['gflops'] / result['ceiling_gflops']:.1f}x the sgemm ceiling)"
            )
        else:
            lines.append(f"- {probe['what']}: {probe['note']}")
    lines += [section_end(SECTION_CEILINGS), ""]
    options = result["options"]
    for family in FAMILIES:
        rows = [r for r in result["results"] if r["family"] == family]
        if not rows:
            continue
        first = rows[0]
        lines += [
            f"## {family}",
            "",
            section_start(name_for(family)),
            f"{first['flops_per_sample'] / 1e6:.2f} MFLOP per sample (matrix products of the graph), so the "
            f"FP32 ceiling is **{first['ceiling_samples_per_s']:,.0f} samples/s**. Served: gRPC, "
            f"{options['batch_size']} rows per request, the best of concurrency "
            f"{', '.join(map(str, options['concurrency']))}; serving: {first['serving']}.",
            "",
        ]
        cells = []
        int8 = next((p for p in result["probes"] if "MatMulInteger" in p["what"] and p["size"]), None)
        for r in rows:
            gate = r["gate"]
            # The served rate's arithmetic (every matrix product counted) over ONNX Runtime's INT8 GEMM rate.
            of_int8 = (
                r["served"]["samples_per_s"] * r["flops_per_sample"] / (int8["gflops"] * 1e9)
                if int8
                else None
            )
            cells.append(
                [
                    f"{r['precision']} (`{r['model']}`)",
                    f"{r['served']['samples_per_s']:,.0f}",
                    f"**{r['served_fraction_of_ceiling']:.2f}**",
                    _fmt(of_int8, ".2f"),
                    str(r["served"]["concurrency"]),
                    f"{r['in_process']['samples_per_s']:,.0f}",
                    f"{r['in_process_fraction_of_ceiling']:.2f}",
                    f"{r['served_over_in_process']:.2f}",
                    _fmt(gate.get("auc_delta"), "+.1e") if r["precision"] != "FP32" else "0 (reference)",
                    _fmt(gate.get("max_abs_diff"), ".2g") if r["precision"] != "FP32" else "-",
                    _fmt(gate.get("max_abs_diff_between_batch_sizes"), ".2g"),
                ]
            )
        cells.append(["BF16", "-", "-", "-", "-", "-", "-", "-", "-", "-", "-"])
        lines += table(HEADER, cells)
        lines += ["", *_verdict(rows), section_end(name_for(family)), ""]
    lines += [
        section_start(SECTION_NOTES),
        "- AUC delta and max abs diff: the export's accuracy gate against the FP32 ONNX on the labeled "
        f"check rows (INT8: the worst over batch sizes 1, 64 and 4096{_tolerances(result)}). "
        "*row moves with batch*: the largest change of one row's probability between those batch sizes "
        "(dynamic INT8 takes its activation scales from the whole batch).",
        _bf16_note(result),
        "- x INT8 GEMM: the served samples/s times the graph's FLOPs per sample (every matrix product, "
        "whatever precision it runs in) over ONNX Runtime's INT8 GEMM rate above: how near the model "
        "comes to the rate of the INT8 kernels measured in the same run, as if all of it ran on them.",
        "- Served and in-process numbers are medians over the rounds; each round gives every variant one "
        f"{options['seconds']:g} s window per concurrency.",
        section_end(SECTION_NOTES),
        section_end(SECTION_RESULTS),
    ]
    return {
        "json": write_json(out / "precision.json", result),
        "markdown": write_markdown(out / "precision.md", lines),
    }


def _tolerances(result: dict[str, Any]) -> str:
    """The AUC gates the variants' export reports record, as ``; gate |AUC delta| <= ...``."""
    found = sorted({r["gate"]["auc_tolerance"] for r in result["results"] if r["gate"].get("auc_tolerance")})
    spelled = " or ".join(f"{t:.0e}".replace("e-0", "e-") for t in found)
    return f"; gate |AUC delta| <= {spelled}" if found else ""


#: The CPU flags a BF16 kernel could use (as a run record names them) and how the report spells them.
BF16_FLAGS = {"avx512_bf16": "AVX512-BF16", "amx_bf16": "AMX-BF16"}


def _bf16_note(result: dict[str, Any]) -> str:
    """Why the report has no BF16 row, from what the run recorded: its bfloat16 GEMM probe and the
    CPU flags of its machine record (a CPU feature is named only where the record shows it)."""
    probe = next((p for p in result["probes"] if "bfloat16" in p["what"]), None)
    if probe is None:
        why = "the run did not probe ONNX Runtime's bfloat16 GEMM."
    elif probe["size"]:
        why = (
            f"the bundle exports no BF16 graph (the bfloat16 MatMul probe above ran at "
            f"{probe['gflops']:.0f} GOP/s)."
        )
    elif "NOT_IMPLEMENTED" in probe["note"]:
        why = (
            "the bfloat16 MatMul probe above found no kernel in ONNX Runtime's CPU execution provider "
            "(NOT_IMPLEMENTED), so a BF16 graph cannot load."
        )
    else:
        why = "the bfloat16 MatMul probe above failed, so a BF16 graph was not tried."
    flags = result.get("machine", {}).get("cpu_flags") or {}
    has = [name for flag, name in BF16_FLAGS.items() if flags.get(flag)]
    lacks = [name for flag, name in BF16_FLAGS.items() if flag in flags and not flags[flag]]
    if not flags:
        cpu = "The run's record names no CPU flags."
    elif has:
        cpu = f"The run's CPU has {' and '.join(has)}" + (f", not {' or '.join(lacks)}." if lacks else ".")
    else:
        cpu = f"The run's CPU has neither {' nor '.join(BF16_FLAGS.values())}."
    return f"- BF16: not run: {why} {cpu}"


def _hotness(config_path: Path) -> Hotness:
    """The ids per table the model of ``config_path`` takes (None without a config: one each)."""
    if not config_path.is_file():
        return None
    return config_bags(read_config(config_path))
