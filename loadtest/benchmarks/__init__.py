"""The benchmark commands of ``python -m loadtest``: the code behind the committed results
(``benchmarks/`` holds those results and the scripts that ran these commands, no code).

- :mod:`~loadtest.benchmarks.roofline`: how close a model runs to this machine's compute ceiling;
- :mod:`~loadtest.benchmarks.precision`: served samples/s of FP32, FP16 and INT8 against it;
- :mod:`~loadtest.benchmarks.serving_defaults`: which serving settings the cpu profile defaults to;
- :mod:`~loadtest.benchmarks.client_cost`: the client-side cost per request of each transport;
- :mod:`~loadtest.benchmarks.soak`: the soak, and the checked load the fault tests drive;
- :mod:`~loadtest.benchmarks.gpu`: served and in-process samples/s of every variant on a GPU;
- :mod:`~loadtest.benchmarks.kernels`: each CUDA kernel's share of one model call.

All of them measure with the one engine (:mod:`loadtest.engine`).
"""
