"""The local ``onnxruntime`` backend; tritonserver loads its ``model.py`` by path."""
