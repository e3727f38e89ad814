"""Every measurement of the bundle, on one engine; subpackages by concern.

- :mod:`loadtest.engine`: the one engine every measurement shares: the closed-loop driver
  (:mod:`loadtest.engine.driver`) and served throughput on it (:mod:`loadtest.engine.served`),
  the in-process timer (:mod:`loadtest.engine.timer`) and the ONNX Runtime baseline on it
  (:mod:`loadtest.engine.baseline`), the request payloads, one latency histogram and tally
  (:mod:`loadtest.engine.latency`), one report writer (:mod:`loadtest.engine.writer`; the run
  record is :mod:`bundle.records`);
- :mod:`loadtest.sweeps`: locust users and step-by-step sweeps, the user-facing tool
  (:mod:`loadtest.sweeps.sweep`), whole runs and their reports, and the peer servers a
  comparison runs against (:mod:`loadtest.sweeps.peers`);
- :mod:`loadtest.tune`: the search for the fastest serving configuration within a p99 budget;
- :mod:`loadtest.benchmarks`: the commands behind the committed results: the roofline, the CPU
  benchmarks, the client-side cost per request, the soak and checked load, the GPU run and its
  kernels; :mod:`loadtest.faults`: the fault table;
- the demo (:mod:`loadtest.demo`): loadtest is the top stage, so the whole path runs from here.

``python -m loadtest --help`` lists the commands (:mod:`loadtest.__main__`, and
:mod:`loadtest.commands` for the benchmarks, the tuner and the demo). Nothing in this package
imports TensorFlow or PyTorch (the demo runs those stages as their own processes).
"""
