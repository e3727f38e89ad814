"""Peer servers for the benchmark comparison, each runnable as its own process on a given port.

- :mod:`loadtest.peers.pytriton_server`: PyTriton binding one ONNX Runtime session.
- :mod:`loadtest.peers.fastapi_server`: a minimal FastAPI + uvicorn + ONNX Runtime server.
- :mod:`loadtest.peers.locustfile`: the locust user for the FastAPI server's wire format.
- :mod:`loadtest.peers.process`: starting such a server process and stopping it by pid.

Only the benchmarks use these; the bundle serves through Triton.
"""
