"""The raw-row stage: the Triton C++ backend ``raw_rows`` (``backend.cc``, ``parse.cc``), built by
``make stages``; the rules it applies are :mod:`criteo.rows`."""
