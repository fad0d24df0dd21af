"""trtllm-forge: one YAML file from an LLM checkpoint to a served, measured endpoint."""

import os

__version__ = "0.1.0"

# grpcio 1.80 and later (we run 1.85) restart their epoll poller in a forked child when fork support is on; Python's
# subprocess then closes that fd before exec and the child aborts (grpc/grpc#43055; seen here: an optimum-cli export
# exited with SIGABRT after "Epoll1Poller ... epoll_wait error: Bad file descriptor" once the bench's gRPC channels
# had run in the same process). Our children always exec, so gRPC's fork support is never needed. Set before any
# grpc import: the package is imported first by the CLI, the scripts and the tests' conftest.
# third_party_env() leaves our default out of the environment of every process we start (Triton, whose gRPC server
# must run as the user set it up; perf_analyzer, GenAI-Perf, AIPerf; build steps).
GRPC_DEFAULTS = {"GRPC_ENABLE_FORK_SUPPORT": "false"}
# The names defaulted here, for a child that inherits this whole environment (a pytest-xdist worker of a session whose
# conftest imported us, a user's script): it must not take our values for the user's.
DEFAULTED_MARKER = "TRTLLM_FORGE_GRPC_DEFAULTED"
_INHERITED = {name for name in os.environ.get(DEFAULTED_MARKER, "").split(",") if os.environ.get(name) == GRPC_DEFAULTS.get(name)}
_DEFAULTED = tuple(name for name in GRPC_DEFAULTS if name not in os.environ or name in _INHERITED)
for _name in _DEFAULTED:
    os.environ[_name] = GRPC_DEFAULTS[_name]
if _DEFAULTED:
    os.environ[DEFAULTED_MARKER] = ",".join(_DEFAULTED)
else:
    os.environ.pop(DEFAULTED_MARKER, None)


def third_party_env(base: dict[str, str] | None = None) -> dict[str, str]:
    """`base` (default: this process's environment) without the grpc settings this package defaulted above, for the
    processes we start: they run in the environment the user gave us."""
    env = dict(os.environ if base is None else base)
    for name in _DEFAULTED:
        if env.get(name) == GRPC_DEFAULTS[name]:
            del env[name]
    env.pop(DEFAULTED_MARKER, None)
    return env
