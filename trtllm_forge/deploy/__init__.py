"""deploy stage: a local Triton server (start, status, stop) and docker/kubernetes renderings."""

from trtllm_forge.deploy.server import server_status, serving, start_server, stop_server
from trtllm_forge.deploy.state import Deployment, read_state, state_path

__all__ = ["Deployment", "read_state", "server_status", "serving", "start_server", "state_path", "stop_server"]
