"""``triton-recsys <stage> ...`` (the console script) and ``python -m triton_recsys <stage> ...``.

Each subcommand is a stage's own CLI, run as ``python -m <stage>`` would run it: the
stage is looked up by name and run as its ``__main__`` module, so ``triton-recsys
--help`` starts without importing any stage (nor TensorFlow or PyTorch), and each
stage's options and help stay declared once, in the stage.

``triton-recsys demo`` is the console script's own command (:mod:`triton_recsys.demo`): the
whole path on this machine, every stage in turn, which ``make demo`` runs.
"""

from __future__ import annotations

import runpy
import sys
from collections.abc import Sequence

PROG = "triton-recsys"

#: The stages, in the order data flows through them, with what each does.
STAGES: dict[str, str] = {
    "criteo": "data: synthetic Criteo logs, TSV checks, access-skew profiles",
    "models": "train the reference DLRM and Wide & Deep (tiny to full size)",
    "export": "a trained model -> ONNX / TorchScript / TensorRT, checked, into a Triton model repository",
    "server": "the local tritonserver (no Docker) on a model repository",
    "clients": "requests and accuracy (AUC, logloss) through the server",
    "loadtest": "load tests: sweeps and latency curves, baselines, peer comparison, tuning",
    "lab": "the commands that reproduce the committed benchmarks (benchmarks/)",
}

#: Commands of the console script itself, above the stages.
COMMANDS: dict[str, str] = {
    "demo": "the whole path on this machine: data, training, export, serving, a load test",
}


def usage() -> str:
    """The console script's help text."""
    width = max(map(len, [*STAGES, *COMMANDS]))
    lines = [
        f"Usage: {PROG} STAGE [OPTIONS] COMMAND [ARGS]...",
        f"       {PROG} demo [OPTIONS]",
        "",
        "Recommender inference on NVIDIA Triton: each stage's commands, as `python -m STAGE` runs them.",
        f"`{PROG} STAGE --help` lists a stage's commands.",
        "",
        "Commands:",
        *(f"  {name:<{width}}  {text}" for name, text in COMMANDS.items()),
        "",
        "Stages:",
        *(f"  {name:<{width}}  {text}" for name, text in STAGES.items()),
    ]
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    """Run the stage named by the first argument with the rest of the arguments."""
    args = list(sys.argv[1:] if argv is None else argv)
    if not args or args[0] in ("-h", "--help"):
        print(usage())
        return 0
    stage, rest = args[0], args[1:]
    if stage == "demo":
        from bundle.cli import run
        from triton_recsys.demo import app

        sys.argv = [f"{PROG} demo", *rest]
        run(app)
        return 0
    if stage not in STAGES:
        names = ", ".join([*COMMANDS, *STAGES])
        print(f"error: unknown stage or command {stage!r}; choose one of {names}", file=sys.stderr)
        return 2
    sys.argv = [f"{PROG} {stage}", *rest]
    runpy.run_module(stage, run_name="__main__", alter_sys=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
