"""The soak benchmark: ``python -m benchmarks.soak`` (see :mod:`benchmarks.soak.soak`)."""
