"""The one measurement engine: every number of the bundle is taken and written with these pieces.

- :mod:`~loadtest.engine.driver`: the closed-loop load driver (workers that each send a request,
  wait for its answer, send the next), and on it :mod:`~loadtest.engine.served`, the served
  throughput of one model at one concurrency;
- :mod:`~loadtest.engine.timer`: the in-process timer, and on it :mod:`~loadtest.engine.baseline`,
  the ONNX Runtime baseline that served numbers are divided by, with its sessions set up as the
  local Triton backend sets up its own (:mod:`~loadtest.engine.session`);
- :mod:`~loadtest.engine.payload`: the pool of pre-built request batches every load sends;
- :mod:`~loadtest.engine.latency`: the one latency histogram and the tally of a measurement
  window, kept by the driver and by every locust process alike;
- :mod:`~loadtest.engine.writer`: the report writer (markdown tables, strict JSON, PNG charts).

It imports nothing else of :mod:`loadtest` and never locust: the sweeps, the benchmarks and the
tuner are built on it.
"""
