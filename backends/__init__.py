"""Everything tritonserver loads of the bundle: one folder per backend, named as a model's config
names it (``backend: "<name>"``).

- ``raw_rows/`` and ``embedding/``: the compiled stages, Triton C++ backends
  (``libtriton_<name>.so``) that the ensembles' raw-row and hot/cold embedding steps run on; the C
  API declarations and helpers they share sit in ``common/``, and ``CMakeLists.txt`` here is the one
  CMake project that builds them (``make stages`` into ``build/stages``; the serving image builds
  the same sources, this folder its build context).
- ``onnxruntime/`` and ``pytorch/``: the local server's Python-based backends (``model.py``), which
  stand in for the NGC image's C++ ones outside it; ``batched_model.py`` beside them is what they
  share, copied into each backend's folder with it.

Nothing here imports the bundle: the Python files run inside tritonserver's python stub, the C++ is
built inside the NGC image too, where the bundle is not installed. ``server`` starts tritonserver
with these folders in its backend directory (:class:`server.installation.TritonInstallation`).
"""
