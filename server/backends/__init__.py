"""Python-based Triton backends for the local server, one folder per backend name.

``<name>/model.py`` is copied to ``<backend-dir>/<name>/model.py``, which makes
tritonserver serve every model whose config says ``backend: "<name>"`` with it
(``onnxruntime``; ``pytorch``, which ``platform: "pytorch_libtorch"`` maps to).
The modules here beside the folders (``batched_model.py``) are copied into each
backend's folder. These files run inside tritonserver's python stub, not in the
bundle's process.
"""
