"""loadtest logic that needs no server: the order of the peer comparison's steps."""

from __future__ import annotations

from pathlib import Path

import pytest

from loadtest import runs
from loadtest.sweep import StepResult, SweepConfig, Target


def _step(target: Target, config: SweepConfig) -> StepResult:
    (concurrency,) = config.concurrency
    return StepResult(
        label=target.label, model=config.models[0], protocol=target.protocol,
        batch_size=config.batch_size, concurrency=concurrency, processes=1, seconds=1.0,
        requests=1, errors=0, requests_per_s=1.0, samples_per_s=float(config.batch_size),
        p50_ms=1.0, p90_ms=1.0, p95_ms=1.0, p99_ms=1.0, mean_ms=1.0, max_ms=1.0,
    )  # fmt: skip


def test_peer_steps_are_interleaved_with_the_first_server_rotating(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    ran: list[tuple[int, int, str]] = []

    def fake_sweep(target: Target, config: SweepConfig, *args: object, **kwargs: object) -> list[StepResult]:
        step = _step(target, config)
        ran.append((step.batch_size, step.concurrency, step.label))
        return [step]

    monkeypatch.setattr(runs, "run_sweep", fake_sweep)
    targets = [
        Target("127.0.0.1:1", "grpc", "triton"),
        Target("127.0.0.1:2", "grpc", "pytriton", server_stats=False),
        Target("127.0.0.1:3", "fastapi", "fastapi", server_stats=False),
    ]
    options = runs.RunOptions(batch_sizes=(1, 1024), concurrency=(1, 2, 4), max_rows_in_flight=2048)
    steps = runs._interleaved_steps(targets, "m", options, tmp_path, tmp_path / "payload.npz")

    assert [step.label for step in steps] == [label for _, _, label in ran]
    # Every (batch, concurrency) level runs all three servers back to back before the next level.
    levels = [(b, c) for b, c, _ in ran]
    assert levels == [(1, 1)] * 3 + [(1, 2)] * 3 + [(1, 4)] * 3 + [(1024, 1)] * 3 + [(1024, 2)] * 3
    # The server that goes first rotates from level to level.
    firsts = [ran[i][2] for i in range(0, len(ran), 3)]
    assert firsts == ["triton", "pytriton", "fastapi", "triton", "pytriton"]
    assert all(sorted(label for _, _, label in ran[i : i + 3]) == ["fastapi", "pytriton", "triton"]
               for i in range(0, len(ran), 3))  # fmt: skip
