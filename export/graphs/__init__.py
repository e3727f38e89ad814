"""ONNX graphs and their precisions: writing, FP16, INT8, id safety, and the parity checks.

``onnx_io`` writes a graph (external data past 2 GB), ``fp16`` and ``quantize`` make the
reduced-precision variants, ``ids`` makes a graph safe for any int64 id, and ``parity``
runs graphs on ONNX Runtime and compares their answers.
"""
