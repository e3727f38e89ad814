"""The no-Docker local server: the nvidia-pytriton wheel's tritonserver.

``LocalServer`` starts the real tritonserver on a model repository, with
Python-based ``onnxruntime`` and ``pytorch`` backends (``backends/*/model.py``)
so configs written for the NGC container's C++ backends serve unchanged.
``python -m server serve --repository DIR`` is the command-line front end. A model
whose backend process dies is reloaded or takes the server out of service
(:mod:`server.dead_models`).
"""

from server.config import ModelControlMode, ServerConfig
from server.dead_models import DeadModelAction
from server.installation import TritonInstallation
from server.launcher import LocalServer
from server.ports import free_ports, port_in_use
from server.probes import ModelStatus
from server.security import ADMIN_HEADER, ADMIN_KEY_ENV, GRPC_ADMIN_HEADER, admin_headers, read_admin_key

__all__ = [
    "ADMIN_HEADER",
    "ADMIN_KEY_ENV",
    "GRPC_ADMIN_HEADER",
    "DeadModelAction",
    "LocalServer",
    "ModelControlMode",
    "ModelStatus",
    "ServerConfig",
    "TritonInstallation",
    "admin_headers",
    "free_ports",
    "port_in_use",
    "read_admin_key",
]
