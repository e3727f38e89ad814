"""The embedding stage of hot/cold models: the Triton C++ backend ``embedding`` (``backend.cc`` and
the files beside it), built by ``make stages``; its definition in Python, run in process, is
:mod:`server.stages.embedding.hot_cold_lookup`."""
