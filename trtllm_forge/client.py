"""Small Triton client helpers shared by deploy, run, verify and bench.

Requests go over gRPC with `tritonclient.grpc`. Decoupled models (the ensemble whose engine step is decoupled)
only answer on a bidirectional stream, streaming or not, so every request here uses a stream with
`enable_empty_final_response=True` and ends on the response parameter `triton_final_response`.
tritonclient is imported inside the functions: the CLI must start without it.
"""

from __future__ import annotations

import contextlib
import queue
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from trtllm_forge.errors import StepError


def _wire_type(data_type: str) -> tuple[str, Any]:
    """A config data_type (TYPE_FP32) as (wire datatype, numpy dtype), by tritonclient's own table."""
    from tritonclient.utils import triton_to_np_dtype

    wire = "BYTES" if data_type == "TYPE_STRING" else data_type.removeprefix("TYPE_")
    dtype = triton_to_np_dtype(wire)
    if dtype is None:
        raise StepError("client", f"input data_type {data_type} has no numpy type in tritonclient", "a TYPE_* of Triton's model config")
    return wire, dtype


def grpc_url_of(target: Any) -> str:
    """host:port from a Deployment, a workdir (reads deploy/state.json) or a host:port string."""
    grpc_url = getattr(target, "grpc_url", None)
    if grpc_url:
        return grpc_url
    if isinstance(target, Path) or (isinstance(target, str) and Path(target, "deploy", "state.json").is_file()):
        from trtllm_forge.deploy.state import read_state

        deployment = read_state(Path(target))
        if deployment is None:
            raise StepError(
                "client", f"no deployment recorded in {Path(target) / 'deploy' / 'state.json'}", "run `trtllm-forge deploy CONFIG` first"
            )
        return deployment.grpc_url
    return str(target)


def connect(target: Any) -> Any:
    """A `tritonclient.grpc.InferenceServerClient` for a Deployment, workdir or host:port."""
    import tritonclient.grpc as grpcclient

    return grpcclient.InferenceServerClient(url=grpc_url_of(target))


@dataclass
class StreamResult:
    """Every response of one request, in arrival order, with the time each arrived."""

    responses: list[dict[str, np.ndarray]] = field(default_factory=list)
    arrival_s: list[float] = field(default_factory=list)  # seconds since the request was sent
    total_s: float = 0.0
    error: str | None = None


@dataclass
class Generation:
    """A text generation: the text, its streamed pieces and the timing."""

    text: str
    chunks: list[str]
    ttft_s: float | None  # time to the first non-empty piece
    total_s: float
    chunk_times_s: list[float]
    error: str | None = None


def _input_specs(client: Any, model: str) -> tuple[int, dict[str, dict]]:
    config = client.get_model_config(model, as_json=True)["config"]
    return int(config.get("max_batch_size", 0)), {i["name"]: i for i in config.get("input", [])}


def make_inputs(values: dict[str, Any], specs: dict[str, dict], batched: bool) -> list:
    """InferInput objects typed from the model's config; a batch dimension of 1 when the model batches."""
    import tritonclient.grpc as grpcclient

    inputs = []
    for name, value in values.items():
        if name not in specs:
            raise StepError("client", f"model has no input named {name!r}", f"its inputs: {', '.join(sorted(specs))}")
        wire, dtype = _wire_type(specs[name]["data_type"])
        if dtype is np.object_:
            items = value if isinstance(value, (list, tuple)) else [value]
            array = np.array([v.encode() if isinstance(v, str) else v for v in items], dtype=np.object_)
        else:
            array = np.atleast_1d(np.asarray(value, dtype=dtype))
        if batched:
            array = array[np.newaxis, ...]
        tensor = grpcclient.InferInput(name, list(array.shape), wire)
        tensor.set_data_from_numpy(array)
        inputs.append(tensor)
    return inputs


def stream_request(
    target: Any,
    model: str,
    inputs: dict[str, Any] | list,
    *,
    timeout_s: float = 300.0,
    raise_on_error: bool = True,
) -> StreamResult:
    """Send one request on a gRPC stream and collect responses until the final flag.

    `inputs` is either name -> value (typed and shaped from the model config) or a list of InferInput.
    """
    from tritonclient.utils import InferenceServerException

    client = connect(target)
    result = StreamResult()
    responses: queue.Queue = queue.Queue()

    def on_response(result: Any = None, error: Any = None) -> None:  # tritonclient calls callback(result=..., error=...)
        responses.put((time.perf_counter(), result, error))

    try:
        if isinstance(inputs, dict):
            max_batch, specs = _input_specs(client, model)
            inputs = make_inputs(inputs, specs, batched=max_batch > 0)
        client.start_stream(callback=on_response)
        started = time.perf_counter()
        client.async_stream_infer(model, inputs, request_id=uuid.uuid4().hex[:16], enable_empty_final_response=True)
        deadline = started + timeout_s
        while True:
            try:
                arrived, response, error = responses.get(timeout=max(0.01, deadline - time.perf_counter()))
            except queue.Empty:
                result.error = f"no final response within {timeout_s:g}s"
                break
            if error is not None:
                result.error = error.message() if isinstance(error, InferenceServerException) else str(error)
                break
            payload = response.get_response()
            final = bool(payload.parameters.get("triton_final_response") and payload.parameters["triton_final_response"].bool_param)
            outputs = {out.name: response.as_numpy(out.name) for out in payload.outputs}
            if outputs:
                result.responses.append(outputs)
                result.arrival_s.append(arrived - started)
            if final:
                break
        result.total_s = time.perf_counter() - started
    except InferenceServerException as exc:
        result.error = exc.message()
    finally:
        with contextlib.suppress(Exception):
            client.stop_stream(cancel_requests=result.error is not None)
        client.close()
    if result.error and raise_on_error:
        raise StepError(f"request to {model}", result.error, "see the server log (deploy status shows where)")
    return result


def _text_of(array: np.ndarray | None) -> str:
    """The text of the first sequence: `text_output[0]` in NVIDIA's 1-D shape (one string per request and
    beam); older [1, 1] responses read the same way."""
    if array is None or np.size(array) == 0:
        return ""
    value = np.ravel(array)[0]
    return value.decode("utf-8", errors="replace") if isinstance(value, bytes) else str(value)


def generate(
    target: Any,
    prompt: str,
    max_tokens: int = 64,
    *,
    stream: bool = False,
    model: str = "ensemble",
    timeout_s: float = 300.0,
    raise_on_error: bool = True,
    **params: Any,
) -> Generation:
    """One generate request to the ensemble (text_input, max_tokens, stream, plus any other input by name,
    e.g. temperature=0.0, end_id=2) → the text (the streamed pieces joined) and its timing."""
    values = {"text_input": prompt, "max_tokens": max_tokens, "stream": stream, **params}
    result = stream_request(target, model, values, timeout_s=timeout_s, raise_on_error=raise_on_error)
    chunks = [_text_of(r.get("text_output")) for r in result.responses]
    times = list(result.arrival_s)
    first = next((t for c, t in zip(chunks, times, strict=False) if c), None)
    return Generation("".join(chunks), chunks, first, result.total_s, times, result.error)
