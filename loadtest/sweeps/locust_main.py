"""locust's command line for users that send from native threads (the bundle's users, on plain
sockets: :mod:`loadtest.sweeps.locustfile`).

``python -m loadtest.sweeps.locust_main`` takes locust's own arguments. It
sets gRPC's I/O for a load generator, lets gevent patch everything but
threads, then runs locust, which then patches nothing
(``LOCUST_SKIP_MONKEY_PATCH``):

- gRPC's calls (the model's metadata and Triton's statistics, through tritonclient; requests
  go out on the users' own sockets) do their I/O on the calling thread (:mod:`bundle.grpc_client`),
  not on gRPC's EventEngine threads, which hand every answer over to the
  caller: with grpcio 1.85, a batch-1 call costs the client less CPU that
  way, at one call in flight and at two. gRPC reads this
  when it is imported, so it is set first; a ``GRPC_EXPERIMENTS`` already in
  the environment is kept.
- Sockets, sleeps and subprocesses stay cooperative, so locust's runners and
  its master and workers work as usual, while the users' native threads keep the real
  thread locks (the senders that share a gRPC connection take them).
"""

import os

from bundle.grpc_client import EXPERIMENTS_VARIABLE, POLLING_CLIENT

# Kept in the environment: locust's worker processes load gRPC too.
os.environ.setdefault(EXPERIMENTS_VARIABLE, POLLING_CLIENT)

from gevent import monkey

monkey.patch_all(thread=False)

import sys  # noqa: E402

os.environ["LOCUST_SKIP_MONKEY_PATCH"] = "1"

from locust.main import main  # noqa: E402

if __name__ == "__main__":
    sys.argv[0] = "locust"
    sys.exit(main())
