"""tritonclient wrappers (HTTP and gRPC) and a CLI to infer through the server."""
