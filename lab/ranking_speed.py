"""Ranking requests against flat ones, served side by side (``python -m lab ranking-speed``).

One local tritonserver serves a DLRM's INT8 model and its ranking variant
(``export --user-features``). Each step is one number of candidates per user and one
concurrency: users drawn from a synthetic file of ranking requests (``criteo synth
--user-features``) go to the ranking model as one request per user, and the same
candidates go to the flat model as the tiled rows, one request of ``C`` rows per user.
Both are sent by the closed-loop driver over gRPC on its own socket senders (the
requests serialised before the run, each answer checked to hold ``C`` scores), the two
kinds back to back in every round, the first one rotating. Per kind: candidates/s, p50
and p99 per user request, the bytes of the serialised request per candidate, and the
load generator's CPU per candidate. The report's verdicts are the bar a ranking request
has to clear: at most :data:`MAX_BYTES_RATIO` of the flat bytes per candidate at
:data:`BYTES_AT` candidates, and at least the flat candidates/s at every size.
"""

from __future__ import annotations

import statistics
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bundle.errors import BundleError, ConfigError
from bundle.records import RunRecord
from bundle.schema import CATEGORICAL_INPUT, DENSE_INPUT, FeatureSplit, ranking_model_name
from bundle.snippets import section_end, section_start
from criteo.tsv import read_batch
from loadtest.engine.driver import Driver
from loadtest.engine.served import raw_connection
from loadtest.engine.wire import serialised_request
from loadtest.engine.writer import Panel, Series, plot, table, write_json, write_markdown

#: The flat model both kinds are measured on, and the model family's preset.
MODEL = "dlrm_onnx_int8"
PRESET = "small"
#: Half of the features the user's: 6 of the 13 dense, 13 of the 26 tables.
USER_FEATURES = "I1-I6,C1-C13"
#: The bytes bar: the ranking request's bytes per candidate over the flat one's, at this size.
MAX_BYTES_RATIO = 0.55
BYTES_AT = 128
#: Kinds of request, in the report's order.
KINDS = ("flat", "ranking")


@dataclass(frozen=True)
class RankingSpeedOptions:
    """One run.

    Args:
        candidates: candidates per user, one step each.
        concurrency: requests in flight, one step each.
        seconds: measured per kind, step and round.
        rounds: rounds per step (the kinds back to back in each).
        warmup_s: each kind's warm-up before its window.
        users: distinct user requests per step (cycled).
        user_features: the split (:class:`bundle.schema.FeatureSplit`).
        work: where the model, its repository and the data go.
        log_file: tritonserver's log.
    """

    candidates: tuple[int, ...] = (16, 128, 1024)
    concurrency: tuple[int, ...] = (1, 4)
    seconds: float = 5.0
    rounds: int = 3
    warmup_s: float = 1.0
    users: int = 64
    user_features: str = USER_FEATURES
    work: Path = Path("artifacts/ranking")
    log_file: Path = Path("logs/ranking-speed-tritonserver.log")

    def __post_init__(self) -> None:
        if (
            not self.candidates
            or min(self.candidates) < 1
            or not self.concurrency
            or min(self.concurrency) < 1
        ):
            raise ConfigError("candidates and concurrency need one or more values >= 1")
        if self.seconds <= 0 or self.rounds < 1 or self.warmup_s < 0 or self.users < 1:
            raise ConfigError("seconds must be > 0, rounds and users >= 1, warmup_s >= 0")
        FeatureSplit.parse(self.user_features)


def _run(*args: str) -> None:
    done = subprocess.run([sys.executable, "-m", *args], capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise BundleError(f"python -m {' '.join(args)} failed:\n{done.stderr[-3000:]}")


def _export(options: RankingSpeedOptions) -> Path:
    """The repository of :data:`MODEL` and its ranking variant (made once under ``work``)."""
    work = options.work
    repository = work / "model_repository"
    ranking = repository / ranking_model_name(MODEL)
    if (ranking / "config.pbtxt").is_file() and (repository / MODEL / "config.pbtxt").is_file():
        return repository
    calibration = work / "calibration.tsv"
    _run("criteo", "synth", "--rows", "4000", "--out", str(calibration), "--seed", "2")
    _run("models", "random-dlrm", "--preset", PRESET, "--out", str(work / "dlrm"))
    _run("export", "dlrm", "--checkpoint", str(work / "dlrm"), "--repository", str(repository), "--no-fp16",
         "--int8", "--no-raw-rows", "--check-data", str(calibration), "--check-rows", "1024",
         "--calibration-data", str(calibration), "--user-features", options.user_features)  # fmt: skip
    return repository


def _requests(
    options: RankingSpeedOptions, split: FeatureSplit, candidates: int
) -> tuple[list[bytes], list[bytes]]:
    """Serialised requests of ``options.users`` users of ``candidates`` each: ranking, and flat (tiled)."""
    data = options.work / f"users-{candidates}.tsv"
    rows = options.users * candidates
    if not data.is_file():
        _run("criteo", "synth", "--rows", str(rows), "--out", str(data), "--seed", str(candidates),
             "--user-features", options.user_features, "--candidates", str(candidates),
             "--users", str(10 * options.users))  # fmt: skip
    batch = read_batch(data, rows)
    ranking, flat = [], []
    for start in range(0, rows, candidates):
        request = split.split(
            batch.dense[start : start + candidates], batch.categorical[start : start + candidates]
        )
        ranking.append(serialised_request(ranking_model_name(MODEL), request))
        dense, ids = split.tile(request)
        flat.append(serialised_request(MODEL, {DENSE_INPUT: dense, CATEGORICAL_INPUT: ids}))
    return ranking, flat


def _window(
    url: str,
    model: str,
    messages: list[bytes],
    candidates: int,
    concurrency: int,
    options: RankingSpeedOptions,
) -> dict[str, float]:
    def message(worker: int, sequence: int) -> bytes:
        return messages[(worker + sequence * concurrency) % len(messages)]

    connect = raw_connection(url, "grpc", model, 0, 60.0, candidates, message)
    with Driver(connect, concurrency) as driver:
        driver.wait(options.warmup_s)
        window = driver.measure(options.seconds)
    if window.errors or not window.rows:
        raise BundleError(
            f"{model}: {window.errors} failed requests of {window.requests}: {dict(window.error_kinds)}"
        )
    client = window.client
    return {
        "candidates_per_s": window.samples_per_s,
        "users_per_s": window.samples_per_s / candidates,
        "p50_ms": window.histogram.percentile(50),
        "p99_ms": window.histogram.percentile(99),
        "client_cpu_us_per_candidate": (client.cpu_s * 1e6 / window.rows)
        if client is not None
        else float("nan"),
    }


def run_ranking_speed(
    options: RankingSpeedOptions, command: str, advance: Callable[[], None] = lambda: None
) -> dict[str, Any]:
    """Every step's kinds side by side (see the module); the JSON-ready result."""
    from server.config import ModelControlMode, ServerConfig
    from server.launcher import LocalServer

    split = FeatureSplit.parse(options.user_features)
    record = RunRecord.begin(command)
    repository = _export(options)
    pools = {candidates: _requests(options, split, candidates) for candidates in options.candidates}
    steps: list[dict[str, Any]] = []
    config = ServerConfig.with_free_ports(
        repository,
        log_file=options.log_file,
        model_control_mode=ModelControlMode.EXPLICIT,
        load_models=(MODEL, ranking_model_name(MODEL)),
    )
    with LocalServer(config) as server:
        for candidates in options.candidates:
            ranking, flat = pools[candidates]
            messages = {"flat": (MODEL, flat), "ranking": (ranking_model_name(MODEL), ranking)}
            for concurrency in options.concurrency:
                rounds: dict[str, list[dict[str, float]]] = {kind: [] for kind in KINDS}
                for turn in range(options.rounds):
                    order = KINDS if turn % 2 == 0 else tuple(reversed(KINDS))
                    for kind in order:
                        model, sent = messages[kind]
                        rounds[kind].append(
                            _window(server.grpc_url, model, sent, candidates, concurrency, options)
                        )
                    advance()
                for kind in KINDS:
                    model, sent = messages[kind]
                    mine = rounds[kind]
                    steps.append(
                        {
                            "kind": kind,
                            "model": model,
                            "candidates": candidates,
                            "concurrency": concurrency,
                            "bytes_per_candidate": statistics.mean(len(m) for m in sent) / candidates,
                            **{key: statistics.median(r[key] for r in mine) for key in mine[0]},
                            "rounds_candidates_per_s": [r["candidates_per_s"] for r in mine],
                        }
                    )
    return {
        **record.finish().to_json(),
        "model": MODEL,
        "preset": PRESET,
        "user_features": split.text,
        "user_dense": len(split.user_dense),
        "user_tables": len(split.user_categorical),
        "seconds": options.seconds,
        "rounds": options.rounds,
        "users": options.users,
        "steps": steps,
    }


def _pairs(document: dict[str, Any]) -> list[tuple[dict[str, Any], dict[str, Any]]]:
    by_key = {(s["kind"], s["candidates"], s["concurrency"]): s for s in document["steps"]}
    return [
        (by_key[("flat", c, k)], by_key[("ranking", c, k)])
        for (kind, c, k) in by_key
        if kind == "flat" and ("ranking", c, k) in by_key
    ]


def verdicts(document: dict[str, Any]) -> dict[str, bool]:
    """The bars: bytes at :data:`BYTES_AT` candidates, and candidates/s at every step."""
    pairs = _pairs(document)
    bytes_ok = all(
        r["bytes_per_candidate"] <= MAX_BYTES_RATIO * f["bytes_per_candidate"]
        for f, r in pairs
        if f["candidates"] == BYTES_AT
    )
    speed_ok = all(r["candidates_per_s"] >= f["candidates_per_s"] for f, r in pairs)
    return {
        "bytes": bytes_ok and any(f["candidates"] == BYTES_AT for f, _ in pairs),
        "candidates_per_s": speed_ok,
    }


def report_lines(document: dict[str, Any]) -> list[str]:
    """The markdown report."""
    lines = [
        "# Ranking requests against flat ones: one user and its candidates a request",
        "",
        *RunRecord.from_json(document).lines(),
        "",
        f"One local tritonserver serving `{document['model']}` (an untrained `{document['preset']}` DLRM, "
        f"INT8, the cpu profile) and `{ranking_model_name(document['model'])}`, its ranking variant, "
        f"with the user's features `{document['user_features']}` ({document['user_dense']} of 13 dense, "
        f"{document['user_tables']} of 26 tables). Per step, {document['users']} users of a synthetic "
        "file of ranking requests, cycled: the ranking model gets one request a user, the flat model the "
        "same candidates as the tiled rows, one request of C rows a user. The closed-loop driver sends "
        "both over gRPC on its socket senders (requests serialised before the run), the kinds back to back "
        f"in each of {document['rounds']} rounds of {document['seconds']:g} s; medians of the rounds. "
        "*bytes / candidate*: the serialised ModelInferRequest over C; *client CPU*: the load generator's "
        "process over the window, per candidate.",
        "",
        section_start("ranking"),
    ]
    header = [
        "candidates", "concurrency", "kind", "candidates/s", "users/s", "p50 ms", "p99 ms",
        "bytes / candidate", "client CPU us / candidate", "ranking / flat candidates/s",
        "ranking / flat bytes",
    ]  # fmt: skip
    rows = []
    for flat, ranking in _pairs(document):
        for step in (flat, ranking):
            mine = step is ranking
            rows.append(
                [
                    str(step["candidates"]), str(step["concurrency"]), step["kind"], step["candidates_per_s"],
                    step["users_per_s"], step["p50_ms"], step["p99_ms"], step["bytes_per_candidate"],
                    step["client_cpu_us_per_candidate"],
                    f"{ranking['candidates_per_s'] / flat['candidates_per_s']:.2f}x" if mine else "",
                    f"{ranking['bytes_per_candidate'] / flat['bytes_per_candidate']:.3f}" if mine else "",
                ]
            )  # fmt: skip
    lines += table(header, rows, align="rrlrrrrrrrr")
    found = verdicts(document)
    lines += [
        "",
        f"- Bytes per candidate at {BYTES_AT} candidates at most {MAX_BYTES_RATIO} of flat's: "
        f"{'yes' if found['bytes'] else 'NO'}.",
        f"- Candidates/s at least flat's at every step: {'yes' if found['candidates_per_s'] else 'NO'}.",
        section_end("ranking"),
        "",
    ]
    return lines


def write_ranking_speed(document: dict[str, Any], out: Path) -> dict[str, Path]:
    """``ranking_speed.json``, ``ranking_speed.md`` and ``ranking_speed.png`` in ``out``."""
    panels = []
    sizes = sorted({s["candidates"] for s in document["steps"]})
    for concurrency in sorted({s["concurrency"] for s in document["steps"]}):
        series = []
        for kind in KINDS:
            mine = sorted(
                (s for s in document["steps"] if s["kind"] == kind and s["concurrency"] == concurrency),
                key=lambda s: s["candidates"],
            )
            series.append(
                Series(f"{kind} requests", [float(s["candidates"]) for s in mine],
                       [s["candidates_per_s"] for s in mine], color_key=kind)
            )  # fmt: skip
        panels.append(
            Panel(
                title=f"concurrency {concurrency}: candidates/s served",
                xlabel="candidates per user",
                ylabel="candidates/s (median of rounds)",
                series=series,
                xlog2=True,
                ylog=True,
                xticks=[float(s) for s in sizes],
            )
        )
    first = min(s["concurrency"] for s in document["steps"])
    panels.append(
        Panel(
            title="bytes sent per candidate",
            xlabel="candidates per user",
            ylabel="serialised request bytes / candidate",
            series=[
                Series(
                    f"{kind} requests",
                    [
                        float(s["candidates"])
                        for s in document["steps"]
                        if s["kind"] == kind and s["concurrency"] == first
                    ],
                    [
                        s["bytes_per_candidate"]
                        for s in document["steps"]
                        if s["kind"] == kind and s["concurrency"] == first
                    ],
                    color_key=kind,
                )
                for kind in KINDS
            ],
            xlog2=True,
            xticks=[float(s) for s in sizes],
        )
    )
    return {
        "json": write_json(out / "ranking_speed.json", document),
        "markdown": write_markdown(out / "ranking_speed.md", report_lines(document)),
        "png": plot(
            out / "ranking_speed.png", "Ranking requests against flat ones (DLRM INT8, gRPC)", panels
        ),
    }


def candidate_sizes(text: str) -> tuple[int, ...]:
    """``16,128,1024`` as sizes."""
    try:
        return tuple(int(part) for part in text.split(","))
    except ValueError:
        raise ConfigError(f"--candidates must be comma-separated integers, got {text!r}") from None
