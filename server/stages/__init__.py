"""The compiled stages the bundle's ensembles need: Triton C++ backends, one folder per stage.

Each stage is a backend tritonserver loads by the name a model's config gives (``raw_rows``,
``embedding``): its C++ sits in the stage's folder (``raw_rows/parse.cc``, ``raw_rows/backend.cc``;
``embedding/lookup.cc``, ``embedding/store.cc``, ...), the C API declarations and helpers every
stage shares in ``common/``, and ``CMakeLists.txt`` here builds them all (``make stages``; the
serving image builds the same sources). The one Python module, the embedding stage's definition
(:mod:`server.stages.embedding.hot_cold_lookup`), runs in process only: the export writes and
checks the stage's files by it, and the tests hold the compiled stage to it.
"""
