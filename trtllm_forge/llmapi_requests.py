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
    first = next((t for c, t in zip(chunks, times) if c), None)
    return Generation(texts[-1] if texts else "", chunks, first, result.total_s, times, result.error)
