"""Load tests of the served models: locust users for Triton's gRPC and HTTP endpoints,
concurrency sweeps, latency curves and reports, and in-process baselines for ratios.

``python -m loadtest sweep|baseline|compare|bench`` (see :mod:`loadtest.__main__`).
Nothing in this package imports TensorFlow or PyTorch.
"""
