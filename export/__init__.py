"""Trained model -> ONNX (FP32, FP16) -> Triton model repository, with parity checks."""
