"""Requests to NVIDIA's llmapi Triton model (text_input, sampling_param_*, streaming → text_output), as smoke,
verify and our tests send them. Streamed responses carry the whole text so far (NVIDIA sends `output.text`),
so the text is the last response's, and the pieces are the differences."""

from __future__ import annotations

from typing import Any

from trtllm_forge.client import Generation, _text_of, stream_request


def llmapi_generate(
    target: Any,
    prompt: str,
    max_tokens: int,
    *,
    model: str = "tensorrt_llm",
    stream: bool = False,
    exclude_input: bool = True,
    timeout_s: float = 300.0,
    raise_on_error: bool = True,
    **params: Any,
) -> Generation:
    from trtllm_forge.deploy.kinds import Deployment, Speaks

    if isinstance(target, Deployment) and target.speaks is Speaks.OPENAI:  # the same request over OpenAI's API
        done = openai_generate(target.http_url, str(target.served_model), prompt, max_tokens, stream=stream, timeout_s=timeout_s)
        return done if exclude_input else Generation(prompt + done.text, done.chunks, done.ttft_s, done.total_s, done.chunk_times_s)
    values = {
        "text_input": prompt,
        "sampling_param_max_tokens": max_tokens,
        "streaming": stream,
        "sampling_param_exclude_input_from_output": exclude_input,
        **params,
    }
    result = stream_request(target, model, values, timeout_s=timeout_s, raise_on_error=raise_on_error)
    texts = [_text_of(r.get("text_output")) for r in result.responses if "text_output" in r]
    chunks, previous = [], ""
    for text in texts:
        chunks.append(text[len(previous) :] if text.startswith(previous) else text)
        previous = text
    times = list(result.arrival_s)
    first = next((t for c, t in zip(chunks, times, strict=False) if c), None)
    return Generation(texts[-1] if texts else "", chunks, first, result.total_s, times, result.error)


def openai_generate(url: str, model: str, prompt: str, max_tokens: int, *, stream: bool = False, timeout_s: float = 300.0) -> Generation:
    """The same request to an OpenAI-compatible server's `/v1/completions` (greedy: temperature 0), streamed as
    server-sent events or not; an error response raises StepError with the server's message."""
    import json
    import time
    import urllib.error
    import urllib.request

    from trtllm_forge.errors import StepError

    body = {"model": model, "prompt": prompt, "max_tokens": max_tokens, "temperature": 0.0, "stream": stream}
    request = urllib.request.Request(f"{url}/v1/completions", json.dumps(body).encode(), {"Content-Type": "application/json"})
    started = time.perf_counter()
    chunks: list[str] = []
    times: list[float] = []
    try:
        with urllib.request.urlopen(request, timeout=timeout_s) as response:
            if not stream:
                text = json.loads(response.read())["choices"][0]["text"]
                total = time.perf_counter() - started
                return Generation(text, [text], total if text else None, total, [total])
            for raw in response:
                line = raw.decode("utf-8", "replace").strip()
                if not line.startswith("data:") or line == "data: [DONE]":
                    continue
                event = json.loads(line[len("data:") :])
                if event.get("object") == "error":
                    raise StepError("client", f"the OpenAI server: {event.get('message')}", f"see the server log; request {body}")
                for choice in event.get("choices") or []:
                    chunks.append(choice.get("text") or "")
                    times.append(time.perf_counter() - started)
    except urllib.error.HTTPError as exc:
        detail = exc.read().decode(errors="replace")[:300]
        raise StepError("client", f"the OpenAI server answered {exc.code}: {detail}", f"POST {url}/v1/completions") from None
    first = next((t for c, t in zip(chunks, times, strict=False) if c), None)
    return Generation("".join(chunks), chunks, first, time.perf_counter() - started, times)
