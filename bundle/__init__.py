"""Shared plumbing of the bundle: the error hierarchy, the CLI runner, admin-key headers and run records,
the one ONNX Runtime session factory (:mod:`bundle.onnx_session`), matplotlib set-up (:mod:`bundle.plots`),
gRPC's client set-up for load generators (:mod:`bundle.grpc_client`), files pinned by hash from
package registries (:mod:`bundle.downloads`),
and the contract every stage shares: the served tensors (:mod:`bundle.schema`) and the Triton model
repository (:mod:`bundle.repository`)."""
