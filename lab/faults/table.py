"""``python -m lab faults``: every fault of the fault table, tried on tiny models made for it.

The workspace (a folder of its own, removed at the end unless kept) holds what the
faults need, each made through the bundle's own CLIs, as a user makes it:

- two tiny DLRMs of the same shape, trained from two seeds (their answers differ);
- ``plain``: the first exported in the graph, FP32 + FP16 + INT8 + TorchScript (FP16);
- ``hot_cold``: the first exported hot/cold (a row store, an embedding stage, ensembles
  with FP16 and INT8 variants).

Then, in order: a stub SIGKILL under load of a plain model and of a hot/cold dense step, a
tritonserver SIGKILL under load (:mod:`lab.faults.crashes`); tritonserver SIGKILLed, and sent
SIGSEGV while the compiled raw-row stage serves, under ``python -m server serve``, which
restarts it (:mod:`lab.faults.server_crashes`); each damaged file
(:mod:`lab.faults.damaged`); the second checkpoint's export into ``plain`` and a rollout
of a new hot set into ``hot_cold``, each killed at six points, and the export out of space
(:mod:`lab.faults.writes`). :func:`write_table` writes ``result.json`` and ``result.md``.
"""

from __future__ import annotations

import logging
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from bundle.errors import BundleError, ConfigError
from bundle.records import RunRecord, machine_summary
from bundle.schema import NUM_CATEGORICAL
from bundle.snippets import section
from criteo.synth import SynthConfig, write_tsv
from criteo.tsv import read_batch
from lab.faults import FaultResult
from loadtest.engine.writer import table, write_json, write_markdown

log = logging.getLogger(__name__)

#: 26 tables of different sizes, 60 .. 635 rows: small, and not the bundle's own layout.
TABLE_SIZES = ",".join(str(60 + 23 * t) for t in range(NUM_CATEGORICAL))
HOT_BUDGET = "8K"
PLAIN_MODELS = ("dlrm_onnx", "dlrm_onnx_fp16", "dlrm_onnx_int8", "dlrm_torch")
ENSEMBLES = ("dlrm_onnx", "dlrm_onnx_fp16", "dlrm_onnx_int8")


class FaultsFailed(BundleError):
    """A fault's outcome missed its target (a wrong answer, a lost model, no recovery in time)."""


@dataclass(frozen=True)
class Workspace:
    """The files the faults run on (see the module docstring)."""

    root: Path
    rows: Path
    first: Path
    second: Path
    plain: Path
    hot_cold: Path
    fresh: Path


def _module(*args: str) -> None:
    command = [sys.executable, "-m", *args]
    done = subprocess.run(command, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise BundleError(f"{' '.join(command)} failed ({done.returncode}): {done.stderr.strip()[-1500:]}")


def export_args(checkpoint: Path, rows: Path) -> list[str]:
    """``python -m export dlrm`` of ``checkpoint``, checked quickly on ``rows`` (tiny, barely trained
    models: the INT8 gate is opened, it checks serving here, not accuracy)."""
    return ["export", "dlrm", "--checkpoint", str(checkpoint), "--check-data", str(rows), "--check-rows",
            "1024", "--int8-auc-tolerance", "1.0"]  # fmt: skip


def make_workspace(root: Path) -> Workspace:
    """Data, two checkpoints and the two repositories, through the bundle's CLIs."""
    rows = root / "rows.tsv"
    write_tsv(SynthConfig(rows=6_000, seed=11), rows)
    checkpoints = {}
    for name, seed in (("first", "1"), ("second", "2")):
        checkpoints[name] = root / name
        _module("models", "train", "dlrm", "--data", str(rows), "--preset", "tiny", "--table-sizes",
                TABLE_SIZES, "--seed", seed, "--out", str(checkpoints[name]))  # fmt: skip
    plain, hot_cold = root / "plain" / "model_repository", root / "hot_cold" / "model_repository"
    _module(*export_args(checkpoints["first"], rows), "--repository", str(plain), "--torch")
    _module(
        *export_args(checkpoints["first"], rows), "--repository", str(hot_cold), "--hot-budget", HOT_BUDGET
    )
    fresh = root / "fresh.tsv"
    write_tsv(SynthConfig(rows=3_000, seed=29, exponent=0.8), fresh)
    return Workspace(root, rows, checkpoints["first"], checkpoints["second"], plain, hot_cold, fresh)


#: The faults of the table, in its order: the name ``--fault`` takes, and what it tries.
FAULTS: dict[str, str] = {
    "stub-kill": "stub SIGKILL (plain)",
    "step-stub-kill": "stub SIGKILL (hot/cold dense step)",
    "server-kill": "tritonserver SIGKILL",
    "server-crash": "tritonserver crash under python -m server serve",
    "stage-crash": "compiled stage crash under python -m server serve",
    "damaged-files": "damaged files",
    "export-killed": "export killed",
    "rollout-killed": "rollout killed",
    "disk-full": "disk full",
}


def run_faults(work: Path | None = None, keep: bool = False, only: Sequence[str] = ()) -> list[FaultResult]:
    """Every fault of the table (or those ``only`` names), in the order of the module docstring.

    Args:
        work: where the workspace goes (a temporary folder by default).
        keep: keep the workspace (its server logs) afterwards.
        only: names of :data:`FAULTS` to try (empty: all of them).

    Raises:
        ConfigError: ``only`` names a fault the table does not have.
    """
    from lab.faults import crashes, damaged, server_crashes, writes

    unknown = [name for name in only if name not in FAULTS]
    if unknown:
        raise ConfigError(f"unknown fault {', '.join(unknown)}; choose among {', '.join(FAULTS)}")
    root = Path(tempfile.mkdtemp(prefix="faults-", dir=work))
    try:
        space = make_workspace(root)
        logs = root / "logs"
        logs.mkdir()
        steps: dict[str, Callable[[], Sequence[FaultResult]]] = {
            "stub-kill": lambda: [crashes.stub_killed(space.plain, "dlrm_onnx", log_dir=logs)],
            "step-stub-kill": lambda: [
                crashes.step_stub_killed(space.hot_cold, "dlrm_onnx", "dlrm_dense", log_dir=logs)
            ],
            "server-kill": lambda: [crashes.server_killed(space.plain, "dlrm_onnx", log_dir=logs)],
            "server-crash": lambda: [server_crashes.server_crash(space.plain, root, log_dir=logs)],
            "stage-crash": lambda: [server_crashes.stage_crash(space.plain, root, log_dir=logs)],
            "damaged-files": lambda: _damaged(space, damaged),
            "export-killed": lambda: writes.interrupted_writes(
                _export_faults(space, writes), writes.EXPORT_POINTS
            ),
            "rollout-killed": lambda: _rollout_faults(space, writes),
            "disk-full": lambda: [writes.disk_full(_export_faults(space, writes))],
        }
        results: list[FaultResult] = []
        for name, step in steps.items():
            if only and name not in only:
                continue
            log.info("faults: %s", FAULTS[name])
            results.extend(step())
        return results
    finally:
        if keep:
            log.info("faults: the workspace stays in %s", root)
        else:
            shutil.rmtree(root, ignore_errors=True)


def _damaged(space: Workspace, damaged: Any) -> list[FaultResult]:
    """Each damage on the repository that has its kind of file (the row store's in ``hot_cold``)."""
    results = []
    for damage in damaged.DAMAGES:
        repository = space.hot_cold if damage.find(space.hot_cold) is not None else space.plain
        result = damaged.run_damage(repository, damage, work_dir=space.root)
        if result is not None:
            results.append(result)
    return results


def _export_faults(space: Workspace, writes: Any) -> Any:
    command = writes.python_module(*export_args(space.second, space.rows), "--repository", writes.REPOSITORY)
    command = (*command, "--torch")
    return writes.WriteFaults(space.plain, command, PLAIN_MODELS, read_batch(space.rows, 64), "export")


def _rollout_faults(space: Workspace, writes: Any) -> list[FaultResult]:
    """A rollout killed at the points before it needs a server, then at the loads of a live one."""
    from server.security import generate_admin_key

    rollout = ["export", "rollout-hot-set", "--repository", writes.REPOSITORY, "--family", "dlrm",
               "--profile-data", str(space.fresh), "--check-data", str(space.rows),
               "--check-rows", "512"]  # fmt: skip
    rows = read_batch(space.rows, 64)
    files_only = writes.WriteFaults(
        space.hot_cold, writes.python_module(*rollout), ENSEMBLES, rows, "rollout"
    )
    results: list[FaultResult] = writes.interrupted_writes(files_only, writes.ROLLOUT_POINTS[:4])
    results += writes.interrupted_live(
        space.hot_cold, rollout, ENSEMBLES, rows, writes.ROLLOUT_POINTS[4:], generate_admin_key()
    )
    return results


@dataclass(frozen=True)
class FaultTable:
    """The results with the run's record."""

    results: list[FaultResult]
    record: RunRecord

    def as_dict(self) -> dict[str, Any]:
        return {"record": self.record.to_json(), "faults": [asdict(r) for r in self.results]}


#: The report's named section (:mod:`bundle.snippets`) that the documentation includes: all of it
#: below the title.
SECTION_RESULTS = "results"


def markdown(faults: FaultTable) -> list[str]:
    record = faults.record
    rows = [
        [
            r.fault,
            r.seen.replace("|", "\\|"),
            str(r.requests),
            str(r.failed),
            str(r.wrong),
            "-" if r.recovery_s is None else f"{r.recovery_s:.1f}",
            "yes" if r.ok else "**no**",
        ]
        for r in faults.results
    ]
    wrong = sum(r.wrong for r in faults.results)
    missed = [r.fault for r in faults.results if not r.ok]
    return [
        "# Fault table: what breaks, what the user sees, and how the bundle recovers",
        "",
        *section(
            SECTION_RESULTS,
            [
                f"Command: `{record.command}` (`bash benchmarks/faults/run.sh`); {record.started}.",
                f"Machine: {machine_summary(record.machine)}; CPU only, the local tritonserver "
                "(Triton 2.51).",
                "",
                f"{len(faults.results)} faults, {wrong} wrong answers; "
                + ("every outcome met its target." if not missed else f"missed: {'; '.join(missed)}."),
                "",
                "- *requests*: sent while the fault was measured (under load: the load's requests; "
                "a kill: the models asked after the server started on the repository);",
                "- *failed*: requests that failed after the clients' retries; *wrong*: answers that matched "
                "no allowed answer (target 0);",
                "- *recovery*: seconds from the fault until every model answered correctly again "
                "(a write: the server's start on the repository, the interrupted write finished or "
                "discarded);",
                "- `COPY`: the temporary copy of the repository that the fault was tried on.",
                "",
                *table(
                    [
                        "fault",
                        "what the user sees",
                        "requests",
                        "failed",
                        "wrong",
                        "recovery (s)",
                        "target met",
                    ],
                    rows,
                    align="llrrrrl",
                ),
            ],
        ),
    ]


def write_table(faults: FaultTable, out: Path) -> dict[str, Path]:
    """``result.json`` and ``result.md`` in ``out``."""
    return {
        "json": write_json(out / "result.json", faults.as_dict()),
        "markdown": write_markdown(out / "result.md", markdown(faults)),
    }


def measure(
    command: str, out: Path, work: Path | None = None, keep: bool = False, only: Sequence[str] = ()
) -> FaultTable:
    """Run every fault (or those ``only`` names), write the table, and raise :class:`FaultsFailed`
    if a target was missed."""
    record = RunRecord.begin(command)
    with record:
        results = run_faults(work, keep, only)
    faults = FaultTable(results, record)
    write_table(faults, out)
    missed = [r for r in results if not r.ok]
    if missed:
        raise FaultsFailed(
            f"{len(missed)} of {len(results)} faults missed their target (see {out / 'result.md'}): "
            + "; ".join(f"{r.fault}: {r.seen}" for r in missed)
        )
    return faults
