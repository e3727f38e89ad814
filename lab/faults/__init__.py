"""The fault table: each fault tried against the real local tritonserver, and what was measured.

Every fault runner returns one :class:`FaultResult` per fault (or per kill point): what
the user saw, the requests that failed, the wrong answers (the target is 0), and the
time until the models answered correctly again. ``python -m lab faults`` runs them
and writes ``result.json`` and ``result.md`` (the committed table under
``benchmarks/faults/``).

Runners by concern:

- :mod:`lab.faults.crashes`: a python-backend stub (plain model, hot/cold dense step) and
  tritonserver itself killed with SIGKILL under checked load;
- :mod:`lab.faults.server_crashes`: tritonserver crashing under ``python -m server serve``,
  which restarts it: killed with SIGKILL, and sent SIGSEGV while the compiled raw-row stage
  (which runs inside it) serves;
- :mod:`lab.faults.damaged`: damaged files in a repository (row store, model files,
  config.pbtxt);
- :mod:`lab.faults.writes`: an export and a rollout killed at several points, and a
  write that runs out of disk space.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class FaultResult:
    """What one fault did, as measured.

    Attributes:
        fault: what was done, e.g. ``stub SIGKILL under load (dlrm_onnx)``.
        seen: what the user saw, in one line (the error line, or the statuses returned).
        requests: requests sent while the fault was measured (0 where no load ran).
        failed: requests that failed after the clients' retries.
        wrong: answers that matched no allowed answer (must be 0).
        recovery_s: seconds from the fault until every model answered correctly again
            (None where the fault needs no recovery, e.g. a refused file).
        ok: whether the outcome met the fault's target (no wrong answer, the rest serving,
            recovery within its bound).
    """

    fault: str
    seen: str
    requests: int
    failed: int
    wrong: int
    recovery_s: float | None
    ok: bool
