"""trtllm-forge: one YAML file from an LLM checkpoint to a served, measured endpoint."""

import os

__version__ = "0.1.0"

# grpcio 1.80 and later (we run 1.85) restart their epoll poller in a forked child when fork support is on; Python's
# subprocess then closes that fd before exec and the child aborts (grpc/grpc#43055; seen here: an optimum-cli export
# exited with SIGABRT after "Epoll1Poller ... epoll_wait error: Bad file descriptor" once the bench's gRPC channels
# had run in the same process). Our children always exec, so gRPC's fork support is never needed. Set before any
# grpc import: the package is imported first by the CLI, the scripts and the tests' conftest.
#
# grpc's event-engine client (on by default in grpcio 1.85) reads the sockets on threads of its own and hands each
# completion to the thread waiting on the call's queue: two thread wake-ups before the bench can stamp a response.
# With that experiment off, the waiting thread polls the socket itself (one wake-up, as perf_analyzer's client does):
# the bench's TTFT error against the server's stamps came out lower at concurrency 1, 4 and 16 in interleaved runs
# (scripts/bench_grpc_poller.py, results/bench_fidelity/grpc_poller.json).
GRPC_DEFAULTS = {"GRPC_ENABLE_FORK_SUPPORT": "false", "GRPC_EXPERIMENTS": "-event_engine_client"}
_DEFAULTED = tuple(name for name in GRPC_DEFAULTS if name not in os.environ)
for _name in _DEFAULTED:
    os.environ[_name] = GRPC_DEFAULTS[_name]


def third_party_env(base: dict[str, str] | None = None) -> dict[str, str]:
    """`base` (default: this process's environment) without the grpc settings this package defaulted above, for the
    tools we run (perf_analyzer, GenAI-Perf, AIPerf): they run in the environment the user gave us."""
    env = dict(os.environ if base is None else base)
    for name in _DEFAULTED:
        if env.get(name) == GRPC_DEFAULTS[name]:
            del env[name]
    return env
