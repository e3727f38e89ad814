"""The bundle's small exception tree.

Every stage raises one of these for a condition a user can act on; the CLI
turns it into exit code 1 and one line (a traceback only with ``--verbose``).
"""

from __future__ import annotations


class BundleError(Exception):
    """Base of every error the bundle reports to a user."""


class DataError(BundleError):
    """Malformed input data, e.g. a Criteo TSV row with the wrong field count."""


class ConfigError(BundleError):
    """An invalid option or configuration value."""


class ExportError(BundleError):
    """A conversion failed or an exported model did not match its framework."""


class ServerError(BundleError):
    """The local tritonserver could not start, or a model failed to load."""


class ClientError(BundleError):
    """A request to the server failed (server down, model unknown, bad input)."""


class StorageError(BundleError):
    """Object storage (S3) refused or could not be reached: no bucket, no credentials, no endpoint."""


class DiskFullError(BundleError):
    """A write ran out of space (or into the process's file-size limit); what it wrote into is as it was."""
