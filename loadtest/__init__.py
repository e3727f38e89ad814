"""What a user load-tests a served model with, on one engine; subpackages by concern.

- :mod:`loadtest.engine`: the one engine every measurement shares: the closed-loop driver
  (:mod:`loadtest.engine.driver`) and served throughput on it (:mod:`loadtest.engine.served`),
  the in-process timer (:mod:`loadtest.engine.timer`) and the ONNX Runtime baseline on it
  (:mod:`loadtest.engine.baseline`), the request payloads, one latency histogram and tally
  (:mod:`loadtest.engine.latency`), one report writer (:mod:`loadtest.engine.writer`; the run
  record is :mod:`bundle.records`);
- :mod:`loadtest.sweeps`: locust users and step-by-step sweeps, the user-facing tool
  (:mod:`loadtest.sweeps.sweep`), perf_analyzer as an engine and its set-up, whole runs and
  their reports, and the peer servers a comparison runs against (:mod:`loadtest.sweeps.peers`);
- :mod:`loadtest.tune`: the search for the fastest serving configuration within a p99 budget;
- :mod:`loadtest.roofline`: how close a model runs to this machine's compute ceiling, the
  ceiling a sweep reports against.

``python -m loadtest --help`` lists the commands (:mod:`loadtest.__main__`). The commands
that reproduce the committed benchmarks live in :mod:`lab`, which measures with this
package's engine. Nothing in this package imports TensorFlow or PyTorch.
"""
