"""The server's inference statistics (Triton's statistics extension), parsed.

Both protocols return the same fields; gRPC's JSON writes the 64-bit counters
as strings and leaves zero counters out, which :meth:`ModelStats.from_json`
smooths over.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass
from typing import Any

#: Phases of a request inside the server, in the order it passes them.
PHASES: tuple[str, ...] = ("queue", "compute_input", "compute_infer", "compute_output")


def _duration(stats: Mapping[str, Any], key: str) -> tuple[int, int]:
    entry = stats.get(key) or {}
    return int(entry.get("count", 0)), int(entry.get("ns", 0))


@dataclass(frozen=True)
class ModelStats:
    """Cumulative counters of one model version since the server started.

    Attributes:
        name: model name.
        version: model version.
        inference_count: rows inferred (a batch of B counts B).
        execution_count: model executions (one per dynamic batch).
        success_count: successful requests.
        success_ns: their total time inside the server (arrival to response).
        fail_count: failed requests (server-side; client-side rejections never arrive).
        queue_ns, compute_input_ns, compute_infer_ns, compute_output_ns: total
            time of successful requests in each phase.
    """

    name: str
    version: str
    inference_count: int
    execution_count: int
    success_count: int
    success_ns: int
    fail_count: int
    queue_ns: int
    compute_input_ns: int
    compute_infer_ns: int
    compute_output_ns: int

    @classmethod
    def from_json(cls, entry: Mapping[str, Any]) -> ModelStats:
        """One element of ``model_stats`` in either protocol's JSON form."""
        inference = entry.get("inference_stats") or {}
        success_count, success_ns = _duration(inference, "success")
        fail_count, _ = _duration(inference, "fail")
        phases = {f"{phase}_ns": _duration(inference, phase)[1] for phase in PHASES}
        return cls(
            name=str(entry.get("name", "")),
            version=str(entry.get("version", "")),
            inference_count=int(entry.get("inference_count", 0)),
            execution_count=int(entry.get("execution_count", 0)),
            success_count=success_count,
            success_ns=success_ns,
            fail_count=fail_count,
            **phases,
        )

    def mean_ms(self, phase: str = "success") -> float:
        """Mean time per successful request of ``success`` or one of :data:`PHASES`, in ms."""
        total = self.success_ns if phase == "success" else int(getattr(self, f"{phase}_ns"))
        return total / self.success_count / 1e6 if self.success_count else 0.0

    def as_dict(self) -> dict[str, Any]:
        """JSON-ready fields."""
        return asdict(self)


def parse_statistics(document: Mapping[str, Any]) -> list[ModelStats]:
    """Every model version in a ``get_inference_statistics`` answer."""
    return [ModelStats.from_json(entry) for entry in document.get("model_stats", [])]
