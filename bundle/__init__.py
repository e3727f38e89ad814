"""Shared plumbing of the bundle: the error hierarchy, the CLI runner, admin-key headers and run records."""
