"""Every measurement of the bundle, on one engine.

- load: locust users and step-by-step sweeps (:mod:`loadtest.sweep`, the user-facing tool), and one
  closed-loop driver for in-process load (:mod:`loadtest.driver`): served throughput
  (:mod:`loadtest.served`), the soak and checked load (:mod:`loadtest.soak`), the client-side cost
  per request (:mod:`loadtest.client_cost`);
- one in-process timer (:mod:`loadtest.timer`): the ONNX Runtime baseline (:mod:`loadtest.baseline`),
  the roofline's ceiling (:mod:`loadtest.roofline`), the CPU benchmarks (:mod:`loadtest.precision`,
  :mod:`loadtest.serving_defaults`);
- one latency histogram and tally (:mod:`loadtest.latency`), one run record
  (:mod:`bundle.records`), one report writer (:mod:`loadtest.writer`; sweeps: :mod:`loadtest.report`);
- the demo (:mod:`loadtest.demo`): loadtest is the top stage, so the whole path runs from here.

``python -m loadtest --help`` lists the commands. Nothing in this package imports TensorFlow or
PyTorch (the demo runs those stages as their own processes).
"""
