"""perf_analyzer's raw profile export → our per-request records → our summary (one point per experiment).

The export (`--profile-export-file`; PA's `src/profile_data_exporter.cc`) holds, per experiment
(`{mode, value}`), every request's send timestamp, the receive timestamp of each response and each response's
outputs. The metrics are then ours (`metrics.summarize`) on PA's timestamps: the same definitions GenAI-Perf
applies to this file, except that a response carrying no token is not a timing point (see bench/exports.py).

Tokens per response, best source first: `output_ids` (the tensorrt_llm model), `num_output_tokens` (requested
with return_num_output_tokens; a running total is turned into per-response counts), the client tokenizer on
the response text, else one per non-empty response (`output_tokens_source` says which). PA exports Triton's
flag-only final response with stale outputs: a last response after the requested length is taken as that flag.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from trtllm_forge.bench.metrics import summarize
from trtllm_forge.bench.records import RequestRecord
from trtllm_forge.bench.runner import LoadSpec, RunResult
from trtllm_forge.bench.target import cumulative_to_deltas
from trtllm_forge.bench.tools.protocol import ExportProblem, ImportedPoint


def points_from_profile_export(data: dict[str, Any], path: Path, tokenizer: Any = None) -> list[ImportedPoint]:
    points = []
    for index, experiment in enumerate(data["experiments"]):
        spec = experiment.get("experiment") or {}
        requests = experiment.get("requests") or []
        if not requests:
            continue
        mode = "rate" if spec.get("mode") == "request_rate" else "concurrency"
        value = spec.get("value", 0)
        load = LoadSpec(
            mode, int(value) if mode == "concurrency" else float(value), arrival="as sent by perf_analyzer", num_requests=len(requests)
        )
        try:
            records = [_record(f"{index}-{k}", request, data.get("service_kind", ""), tokenizer) for k, request in enumerate(requests)]
        except (KeyError, TypeError, ValueError) as exc:
            raise ExportProblem(f"experiment {index}: a request lacks perf_analyzer's fields ({type(exc).__name__}: {exc})") from None
        stamps = [r.sent_ns for r in records] + [t for r in records for t in r.recv_ns]
        result = RunResult(load, records, min(stamps), max(stamps), min(stamps), 0.0)
        context = {
            "target": {
                "kind": f"perf_analyzer {data.get('service_kind', '?')}",
                "endpoint": data.get("endpoint") or None,
                "output_tokens_source": _sources(records),
            },
            "versions": {"perf_analyzer": data.get("version")},
        }
        summary = summarize(result, None, context)
        summary.update(
            source="perf_analyzer",
            imported_from=str(path),
            window_boundaries=experiment.get("window_boundaries"),
            timing_rule="perf_analyzer timestamps; responses without tokens are counted, never timing points",
        )
        points.append(ImportedPoint(summary, records))
    if not points:
        raise ExportProblem("has no experiment with requests")
    return points


def _sources(records: list[RequestRecord]) -> str:
    kinds = sorted({r.output_tokens_source for r in records})
    return kinds[0] if len(kinds) == 1 else ",".join(kinds)


def _first(value: Any) -> Any:
    while isinstance(value, list):
        if not value:
            return None
        value = value[0]
    return value


def _flat_len(value: Any) -> int:
    if isinstance(value, list):
        return sum(_flat_len(v) for v in value)
    return 0 if value is None else 1


def _record(request_id: str, request: dict[str, Any], service_kind: str, tokenizer: Any) -> RequestRecord:
    inputs = request.get("request_inputs") or {}
    payload = _payload(inputs)
    prompt = _prompt(inputs, payload)
    input_tokens, input_source = _input_tokens(inputs, prompt, tokenizer)
    requested = _requested_output(inputs, payload)
    record = RequestRecord(
        request_id, "measure", int(request["timestamp"]), input_tokens, input_source, requested or 0, sent_ns=int(request["timestamp"])
    )
    stamps = request.get("response_timestamps") or []
    outputs = request.get("response_outputs") or [{} for _ in stamps]
    source = "responses"
    for k, (stamp, output) in enumerate(zip(stamps, outputs, strict=False)):
        tokens, source_k = _response_tokens(output or {}, tokenizer)
        source = source_k if tokens else source
        record.add_response(int(stamp), tokens, final=k == len(stamps) - 1)
    record.output_tokens_source = source
    if source == "server_count":
        cumulative_to_deltas(record)
    _drop_stale_final(record, requested, service_kind)
    if not stamps:
        record.error_kind, record.error_message = "no_response", "perf_analyzer recorded no response for this request"
    if not requested:
        record.requested_output_tokens = record.output_tokens
    return record


def _drop_stale_final(record: RequestRecord, requested: int | None, service_kind: str) -> None:
    """PA 2.51 exports Triton's flag-only final response with stale output values (e.g. `output_ids: 0`). When
    the responses before it already carry the requested length, that last response is the flag: no token."""
    if service_kind not in ("triton", "triton_c_api") or not requested or len(record.tokens) < 2:
        return
    if record.tokens[-1] > 0 and sum(record.tokens[:-1]) >= requested:
        record.tokens[-1] = 0
        record.empty[-1] = True


def _payload(inputs: dict) -> dict:
    """The JSON body of an OpenAI / Hugging Face request (PA keeps it as a string under `payload`)."""
    raw = inputs.get("payload")
    if isinstance(raw, str):
        try:
            body = json.loads(raw)
            return body if isinstance(body, dict) else {}
        except json.JSONDecodeError:
            return {}
    return raw if isinstance(raw, dict) else {}


def _prompt(inputs: dict, payload: dict) -> str | None:
    text = _first(inputs.get("text_input"))
    if text is not None:
        return str(text)
    if isinstance(payload.get("prompt"), (str, list)):
        return str(_first(payload["prompt"]))
    if isinstance(payload.get("inputs"), str):
        return payload["inputs"]
    messages = payload.get("messages")
    if isinstance(messages, list) and messages:
        content = messages[-1].get("content") if isinstance(messages[-1], dict) else None
        if isinstance(content, list):
            content = " ".join(part.get("text", "") for part in content if isinstance(part, dict))
        return content if isinstance(content, str) else None
    return None


def _input_tokens(inputs: dict[str, Any], prompt: str | None, tokenizer: Any) -> tuple[int, str]:
    if inputs.get("input_lengths") is not None:
        return int(_first(inputs["input_lengths"])), "request_inputs"
    if inputs.get("input_ids") is not None:
        return _flat_len(inputs["input_ids"]), "request_inputs"
    if prompt is not None and tokenizer is not None:
        return len(tokenizer.encode(prompt, add_special_tokens=False)), "client_tokenizer"
    return 0, "unknown"


def _requested_output(inputs: dict, payload: dict) -> int | None:
    for value in (
        inputs.get("max_tokens"),
        inputs.get("request_output_len"),
        payload.get("max_tokens"),
        payload.get("max_completion_tokens"),
        (payload.get("parameters") or {}).get("max_new_tokens"),
    ):
        value = _first(value)
        if value is not None:
            return int(value)
    return None


def _response_tokens(output: dict[str, Any], tokenizer: Any) -> tuple[int, str]:
    """(tokens in one response, where the count came from)."""
    if "output_ids" in output:
        return _flat_len(output["output_ids"]), "server_ids"
    if "text_output" in output:
        text = _first(output["text_output"]) or ""
        if not text:
            return 0, "responses"  # PA's null final response: outputs present but empty
        count = _first(output.get("num_output_tokens"))
        if isinstance(count, int) and count > 0:
            return count, "server_count"
        return _text_tokens(text, tokenizer)
    if "response" in output:
        return _text_tokens(_http_text(str(output["response"])), tokenizer)
    return 0, "responses"


def _text_tokens(text: str, tokenizer: Any) -> tuple[int, str]:
    if not text:
        return 0, "responses"
    if tokenizer is not None:
        return len(tokenizer.encode(text, add_special_tokens=False)), "client_tokenizer"
    return 1, "responses"


def _http_text(raw: str) -> str:
    """The generated text in one HTTP response body as PA recorded it: SSE events (OpenAI streaming; several
    may arrive in one read), an OpenAI JSON body, or Hugging Face's `[{"generated_text": ...}]`."""
    bodies = []
    if raw.lstrip().startswith("data:"):
        for line in raw.splitlines():
            line = line.strip()
            if line.startswith("data:") and line[5:].strip() != "[DONE]":
                bodies.append(line[5:].strip())
    else:
        bodies.append(raw)
    text = []
    for body in bodies:
        try:
            data = json.loads(body)
        except json.JSONDecodeError:
            continue
        if isinstance(data, list):
            text += [str(item.get("generated_text", "")) for item in data if isinstance(item, dict)]
            continue
        if not isinstance(data, dict):
            continue
        if "generated_text" in data:
            text.append(str(data["generated_text"]))
        for choice in data.get("choices") or []:
            piece = (choice.get("delta") or {}).get("content") or (choice.get("message") or {}).get("content") or choice.get("text")
            if isinstance(piece, str):
                text.append(piece)
    return "".join(text)
