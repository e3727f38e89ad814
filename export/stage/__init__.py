"""The embedding stage's definition in Python, beside the export that writes the files it reads.

:mod:`export.stage.hot_cold_lookup` holds the row-store and hot-set formats, the stage's config
parameters and the reference lookup (placement of ids hot or cold, the cold reads); the export
writes and checks a hot/cold model's files by it, and the tests hold the compiled stage
(``backends/embedding``, the C++ Triton backend tritonserver loads) to it, bit for bit.
:mod:`export.stage.uring` is its ``io_uring`` reader. Both import only numpy and the standard
library, and nothing of the bundle.
"""
