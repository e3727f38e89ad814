"""Serving engines built from a checked export: TensorRT plans and TorchScript.

``trt_build`` builds and checks ``<family>_trt`` plans (``python -m export tensorrt``) with
``trt_engine``'s TensorRT and CUDA bindings; ``torchscript`` writes ``<family>_torch``.
"""
