"""CPU serving benchmarks: precision variants against the compute ceiling, and serving defaults.

``python -m benchmarks.cpu precision`` and ``python -m benchmarks.cpu serving``
write the committed results in this folder (``precision.{json,md}``,
``serving_defaults.{json,md}``); ``run.sh`` reproduces both from scratch.
"""
