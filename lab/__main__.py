"""``python -m lab``: the commands that reproduce the committed benchmarks (see :mod:`lab.commands`)."""

from __future__ import annotations

from bundle.grpc_client import use_polling_client

# Before anything imports gRPC: it reads its experiments when it is imported.
use_polling_client()

from bundle.cli import new_app, run
from lab import commands

app = new_app(
    "The bundle's lab: each command reproduces a committed result under benchmarks/ (the run.sh beside "
    "it says how). To load-test your own model, use `python -m loadtest`."
)

app.command()(commands.soak)
app.command("client-cost")(commands.client_cost)
app.command()(commands.precision)
app.command("serving-defaults")(commands.serving_defaults)
app.command()(commands.gpu)
app.command("gpu-vs-cpu")(commands.gpu_vs_cpu)
app.command()(commands.kernels)
app.command("cold-reads")(commands.cold_reads)
app.command("cold-tier")(commands.cold_tier)
app.command("stage-speed")(commands.stage_speed)
app.command("ranking-speed")(commands.ranking_speed)
app.command("model-analyzer")(commands.model_analyzer)
app.command("raw-rows")(commands.raw_rows)
app.command("open-loop")(commands.open_loop)
app.command()(commands.faults)


if __name__ == "__main__":
    run(app)
