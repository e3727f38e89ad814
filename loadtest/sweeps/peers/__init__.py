"""Peer servers for the benchmark comparison, each runnable as its own process on a given port.

- :mod:`loadtest.sweeps.peers.pytriton_server`: PyTriton binding one ONNX Runtime session.
- :mod:`loadtest.sweeps.peers.fastapi_server`: a minimal FastAPI + uvicorn + ONNX Runtime server.
- :mod:`loadtest.sweeps.peers.locustfile`: the locust user for the FastAPI server's wire format.
- :mod:`loadtest.sweeps.peers.process`: starting such a server process and stopping it by pid.

Only the comparison (``python -m loadtest compare``) uses these; the bundle serves through Triton.
"""
