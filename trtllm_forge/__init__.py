"""trtllm-forge: one YAML file from an LLM checkpoint to a served, measured endpoint."""

import os

__version__ = "0.1.0"

# grpcio 1.80 and later (we run 1.85) restart their epoll poller in a forked child when fork support is on; Python's
# subprocess then closes that fd before exec and the child aborts (grpc/grpc#43055; seen here: an optimum-cli export
# exited with SIGABRT after "Epoll1Poller ... epoll_wait error: Bad file descriptor" once the bench's gRPC channels
# had run in the same process). Our children always exec, so gRPC's fork support is never needed. Set before any
# grpc import: the package is imported first by the CLI, the scripts and the tests' conftest.
os.environ.setdefault("GRPC_ENABLE_FORK_SUPPORT", "false")
