"""Sweeps, the user-facing load test: ``python -m loadtest sweep``, ``compare`` and ``report``.

- :mod:`~loadtest.sweeps.locustfile`: the locust users that send inference requests to Triton
  over gRPC or HTTP; :mod:`~loadtest.sweeps.recorder`: what every locust process records and
  the options it reads (the peers' locustfile uses it too);
- :mod:`~loadtest.sweeps.steps`: a sweep's targets and settings, one step's result (every engine
  fills the same), a streamed run's cursor;
- :mod:`~loadtest.sweeps.sweep`: one locust subprocess per step, its results read back from the
  step's folder (named in :mod:`~loadtest.sweeps.stepfiles`); this side never imports locust;
- :mod:`~loadtest.sweeps.engines`: the other engines, perf_analyzer (the reference,
  :mod:`~loadtest.sweeps.perf_analyzer`, fetched by :mod:`~loadtest.sweeps.perf_analyzer_install`)
  and the closed-loop driver;
- :mod:`~loadtest.sweeps.runs`: whole runs (servers up, in-process baselines, sweeps), the
  comparison with the peer servers included;
- :mod:`~loadtest.sweeps.peers`: those peer servers (PyTriton, FastAPI), their locust user and
  their processes; they record through :mod:`~loadtest.sweeps.recorder` and run only in a
  comparison, so they live beside the sweep that starts them.
- :mod:`~loadtest.sweeps.report`: a run's CSV, JSON, PNG curves and markdown report.
"""
