"""Shared plumbing of the bundle: the error hierarchy and the CLI runner."""
