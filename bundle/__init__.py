"""Shared plumbing of the bundle: the error hierarchy, the CLI runner, admin-key headers and run records,
and the contract every stage shares: the served tensors (:mod:`bundle.schema`) and the Triton model
repository (:mod:`bundle.repository`)."""
