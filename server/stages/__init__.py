"""Python-backend Triton models that the bundle's ensembles need, one folder per stage.

Unlike ``server/backends`` (one ``model.py`` serving every model of a backend
name), a stage's files are copied by ``export`` into each model's version
folder, so the model serves unchanged in the local server and the NGC image.
These files run inside tritonserver's python stub and import only numpy and the
standard library (and ``triton_python_backend_utils``, which exists only there).

Beside them, a stage may also exist compiled, as a Triton C++ backend: its C++ sits in the
stage's folder (``raw_rows/parse.cc``, ``raw_rows/backend.cc``), the C API declarations and
helpers every compiled stage shares in ``common/``, and ``CMakeLists.txt`` here builds them all
(``make stages``).
"""
