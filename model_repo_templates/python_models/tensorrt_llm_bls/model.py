"""Triton python model `tensorrt_llm_bls`: text in, text out, by calling preprocessing and the engine model
itself (TensorRT-LLM 1.2 tensor contract of the BLS model).

Written for trtllm-forge. Runs inside the Triton python stub: imports only numpy, transformers,
triton_python_backend_utils and the stdlib (plus the helpers copied next to this file).

What it adds over the ensemble: per-request incremental detokenization (streamed text keeps its spaces
and multi-byte characters) and stop words applied to the text.

One request at a time per instance, like NVIDIA's tensorrt_llm_bls; concurrency comes from more instances
(`triton.instances.bls`, each its own stub process; by default the engine's max_batch_size when clients call the
BLS, as NVIDIA's docs/model_config.md advises for bls_instance_count). Serving several requests from threads of
one stub would put more BLS streams in one stub's map and more cleanup frees on its stub-to-parent thread (below);
the load test's gdb check has only covered one stream per stub at a time.

Who frees a decoupled BLS stream (trtllm-forge issues 12 and 16.2). `exec(decoupled=True)` returns a
ResponseIterator that the stub also keeps in its `response_iterator_map_`; the iterator holds every response
of the stream, and each response's tensors hold numpy arrays. Consuming the final response enqueues a cleanup
message; the stub's stub-to-parent thread (Stub::ServiceStubToParentRequests -> SendCleanupId) erases the map
entry there, without taking the GIL. If Python has already dropped its reference by then, that erase is the
last reference: ~ResponseIterator -> ~InferResponse -> ~PbTensor runs Py_DECREF/_Py_Dealloc on the arrays on
that thread while this stub's main thread runs Python, which corrupted the heap under streaming load
(`malloc(): unaligned fastbin chunk detected`). (Building the tensors is not the race: in the 2.51 stub
InferResponse::LoadFromSharedMemory takes the GIL around PbTensor::LoadFromSharedMemory.) So every stream is
consumed to its final response and its iterator stays referenced here until a `request.is_cancelled()` call has
come back: that query travels through the same FIFO queue and thread after the cleanup message, so when it
returns the map no longer holds the iterator and the last reference is dropped here, under the GIL. Sources:
triton-inference-server/python_backend src/pb_stub.cc (SendCleanupId, ServiceStubToParentRequests,
ProcessBLSResponseDecoupled), src/pb_response_iterator.cc, src/pb_cancel.cc, src/pb_tensor.cc (PbTensor from
shared memory builds numpy arrays), src/infer_response.cc (GIL taken around the tensor loads); the 2.51 stub
binary in nvidia-pytriton 0.7.0 was checked with gdb for the same calls.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Collection, Iterator
from typing import Any

import numpy as np
import triton_python_backend_utils as pb_utils
from forge_detokenize import IncrementalDetokenizer
from request_checks import InvalidInput, check_request, reraise, triton_error
from tokenizer_loading import as_bool, load_tokenizer, model_parameters

# BLS input -> engine model input, for inputs passed through unchanged apart from the name.
ENGINE_INPUTS = {
    "exclude_input_in_output": "exclude_input_in_output",
    "top_k": "runtime_top_k",
    "top_p": "runtime_top_p",
    "temperature": "temperature",
    "length_penalty": "len_penalty",
    "repetition_penalty": "repetition_penalty",
    "min_tokens": "min_tokens",
    "presence_penalty": "presence_penalty",
    "frequency_penalty": "frequency_penalty",
    "seed": "seed",
    "return_log_probs": "return_log_probs",
    "return_context_logits": "return_context_logits",
    "return_generation_logits": "return_generation_logits",
    "return_perf_metrics": "return_perf_metrics",
    "return_num_input_tokens": "return_num_input_tokens",
    "return_num_output_tokens": "return_num_output_tokens",
    "num_return_sequences": "num_return_sequences",
    "beam_width": "beam_width",
    "prompt_embedding_table": "prompt_embedding_table",
    "prompt_vocab_size": "prompt_vocab_size",
    "lora_task_id": "lora_task_id",
    "lora_weights": "lora_weights",
    "lora_config": "lora_config",
    "guided_decoding_guide_type": "guided_decoding_guide_type",
    "guided_decoding_guide": "guided_decoding_guide",
}
# Inputs declared with reshape [] in the BLS config arrive without their [1] dimension.
SCALAR_INPUTS = {
    "return_log_probs",
    "return_context_logits",
    "return_generation_logits",
    "num_return_sequences",
    "use_draft_logits",
    "lora_task_id",
    "return_perf_metrics",
    "return_num_input_tokens",
    "return_num_output_tokens",
}
# Engine outputs forwarded to the client as they are.
PASS_THROUGH_OUTPUTS = (
    "cum_log_probs",
    "output_log_probs",
    "context_logits",
    "generation_logits",
    "batch_index",
    "sequence_index",
    "kv_cache_alloc_new_blocks",
    "kv_cache_reused_blocks",
    "kv_cache_alloc_total_blocks",
    "arrival_time_ns",
    "first_scheduled_time_ns",
    "first_token_time_ns",
    "last_token_time_ns",
    "acceptance_rate",
    "total_accepted_draft_tokens",
    "total_draft_tokens",
    "num_input_tokens",
    "num_output_tokens",
)


def get(request: Any, name: str) -> np.ndarray | None:
    tensor = pb_utils.get_input_tensor_by_name(request, name)
    return None if tensor is None else tensor.as_numpy()


def first(array: np.ndarray | None, default: Any = None) -> Any:
    if array is None:
        return default
    flat = np.asarray(array).reshape(-1)
    return flat[0] if flat.size else default


def text_of(value: object) -> str:
    return value.decode("utf-8") if isinstance(value, bytes) else str(value)


class TritonPythonModel:
    def initialize(self, args: dict[str, str]) -> None:
        model_config = json.loads(args["model_config"])
        params = model_parameters(model_config)
        self.decoupled = pb_utils.using_decoupled_model_transaction_policy(model_config)
        self.tokenizer = load_tokenizer(params)
        self.vocab_size = len(self.tokenizer)  # once: tokenizers builds its vocabulary map for every len() (~5 ms)
        self.skip_special_tokens = as_bool(params, "skip_special_tokens", True)
        self.engine_model = params.get("tensorrt_llm_model_name", "tensorrt_llm")
        self.preprocessing_model = params.get("preprocessing_model_name", "preprocessing")
        self.engine_decoupled = as_bool(params, "tensorrt_llm_decoupled", self.decoupled)
        # Draft-target decoding (below): the draft engine model, and what a request that does not say drafts.
        self.draft_model = params.get("tensorrt_llm_draft_model_name")
        self.default_draft_tokens = int(params.get("default_num_draft_tokens", "0"))
        self.default_draft_logits = as_bool(params, "default_use_draft_logits", False)
        self.output_names = {o["name"] for o in model_config.get("output", [])}
        self.forwarded_outputs = [name for name in PASS_THROUGH_OUTPUTS if name in self.output_names]
        # Finished engine streams whose map entry may still be alive in the stub (module docstring).
        self.retired_streams: list[Any] = []

    def execute(self, requests: list[Any]) -> list[Any] | None:
        # In this thread, one after another (module docstring).
        if not self.decoupled:
            return [self._run_collecting(request) for request in requests]
        for request in requests:
            self._run_streaming(request)
        return None

    # --- one request --------------------------------------------------------------------------------

    def _run_collecting(self, request: Any) -> Any:
        """Non-decoupled: one response holding the whole text."""
        stream: dict[str, Any] = {}
        try:
            response = self._collect(request, stream)
        except Exception as exc:
            response = pb_utils.InferenceResponse(error=triton_error(pb_utils, exc, "tensorrt_llm_bls"))
        self._release_engine_stream(request, stream)
        return response

    def _run_streaming(self, request: Any) -> None:
        sender = request.get_response_sender()
        stream: dict[str, Any] = {}
        last = None
        try:
            if bool(first(get(request, "stream"), False)):
                for text, tensors in self._generate(request, True, stream):
                    if text or tensors:
                        sender.send(self._response(text, tensors))
            else:
                last = self._collect(request, stream)
        except Exception as exc:
            last = pb_utils.InferenceResponse(error=triton_error(pb_utils, exc, "tensorrt_llm_bls"))
        # Before the final flag: after it the request may be released, and the release needs the request.
        self._release_engine_stream(request, stream)
        if last is None:
            sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
        else:
            sender.send(last, flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)

    def _collect(self, request: Any, stream: dict[str, Any]) -> Any:
        pieces, last = [], {}
        for text, tensors in self._generate(request, False, stream):
            pieces.append(text)
            last = tensors
        return self._response("".join(pieces), last)

    def _release_engine_stream(self, request: Any, stream: dict[str, Any]) -> None:
        """Consume the engine stream to its end, then drop it only once the stub's map has let go of it
        (module docstring): `is_cancelled()` returns after the stub-to-parent thread handled every message
        queued before it, the stream's cleanup included."""
        iterator = stream.pop("iterator", None)
        if iterator is None:
            return
        if not stream.get("finished"):
            try:
                for _ in iterator:  # after a stop word or an error: the engine still ends the stream
                    pass
            except Exception as exc:
                pb_utils.Logger.log_warn(f"tensorrt_llm_bls: engine stream not drained: {exc}")
        self.retired_streams.append(iterator)
        del iterator
        try:
            # A cancelled request answers from its cache without the round trip: keep the streams for the next call.
            if not request.is_cancelled():
                self.retired_streams.clear()
        except Exception as exc:
            pb_utils.Logger.log_warn(f"tensorrt_llm_bls: is_cancelled failed, engine streams kept: {exc}")

    def _response(self, text: str, tensors: dict[str, np.ndarray]) -> Any:
        # 1-D, one string per request, like NVIDIA's BLS (its text_output is the postprocessing OUTPUT).
        outputs = [pb_utils.Tensor("text_output", np.array([text.encode("utf-8")], dtype=object))]
        for name, value in tensors.items():
            if name in self.output_names:
                outputs.append(pb_utils.Tensor(name, value))
        return pb_utils.InferenceResponse(output_tensors=outputs)

    def _generate(self, request: Any, streaming: bool, stream: dict[str, Any]) -> Iterator[tuple[str, dict[str, np.ndarray]]]:
        """Yield (new text, engine outputs to forward) until the engine is done or a stop word is seen."""
        text_input = get(request, "text_input")
        max_tokens = get(request, "max_tokens")
        check_request(lambda name: get(request, name), "tensorrt_llm_bls", vocab_size=self.vocab_size)
        if text_input is None or np.asarray(text_input).size == 0:
            raise ValueError("text_input is required")
        if max_tokens is None or np.asarray(max_tokens).size != 1 or int(first(max_tokens)) <= 0:
            raise ValueError("max_tokens must be one value > 0")
        if np.asarray(text_input).shape[0] != 1:
            raise ValueError("send one prompt per request (batch size 1)")
        if streaming and not self.decoupled:
            raise ValueError("streaming needs the decoupled transaction policy; re-render with triton.decoupled: true")
        exclude_input = bool(first(get(request, "exclude_input_in_output"), True))
        prompt = text_of(first(text_input))
        raw_stop_words = get(request, "stop_words")
        stop_words = [] if raw_stop_words is None else [text_of(w) for w in np.asarray(raw_stop_words).reshape(-1)]
        stop_words = [w for w in stop_words if w]

        num_draft = self._num_draft_tokens(request)
        pre = self._preprocess(request)
        steps: Iterator[tuple[list[int] | None, dict[str, np.ndarray]]]  # new ids (None: outputs only), outputs to forward
        if num_draft:
            steps = self._draft_target_steps(request, pre, num_draft, stream)
        else:
            steps = self._engine_steps(self._engine_request(request, pre, streaming), stream)
        detok = IncrementalDetokenizer(self.tokenizer, self.skip_special_tokens)
        produced = ""
        if not exclude_input and not streaming:
            produced = prompt
            yield prompt, {}
        for new_ids, forwarded in steps:
            if new_ids is None:
                if forwarded:
                    yield "", forwarded
                continue
            piece = detok.push(new_ids)
            stop_at = self._stop_position(produced + piece, stop_words, len(produced))
            if stop_at is not None:
                yield (produced + piece)[len(produced) : stop_at], forwarded
                self._cancel(stream)
                return
            produced += piece
            yield piece, forwarded
        tail = detok.flush()
        stop_at = self._stop_position(produced + tail, stop_words, len(produced))
        if stop_at is not None:
            tail = (produced + tail)[len(produced) : stop_at]
        if tail:
            yield tail, {}

    @staticmethod
    def _stop_position(text: str, stop_words: list[str], searched_until: int) -> int | None:
        """End of the first stop word in `text` that ends after `searched_until`, or None."""
        best = None
        for word in stop_words:
            start = text.find(word, max(searched_until - len(word) + 1, 0))
            if start >= 0:
                end = start + len(word)
                best = end if best is None else min(best, end)
        return best

    @staticmethod
    def _cancel(stream: dict[str, Any]) -> None:
        iterator = stream.get("iterator")
        if iterator is not None and hasattr(iterator, "cancel"):
            with contextlib.suppress(Exception):
                iterator.cancel()

    # --- calls to the other models -------------------------------------------------------------------

    def _preprocess(self, request: Any) -> dict[str, np.ndarray]:
        inputs = [
            pb_utils.Tensor("QUERY", np.asarray(get(request, "text_input"), dtype=object).reshape(1, 1)),
            pb_utils.Tensor("REQUEST_OUTPUT_LEN", np.asarray(get(request, "max_tokens"), dtype=np.int32).reshape(1, 1)),
        ]
        for source, target, dtype in (
            ("bad_words", "BAD_WORDS_DICT", object),
            ("stop_words", "STOP_WORDS_DICT", object),
            ("embedding_bias_words", "EMBEDDING_BIAS_WORDS", object),
            ("embedding_bias_weights", "EMBEDDING_BIAS_WEIGHTS", np.float32),
            ("end_id", "END_ID", np.int32),
            ("pad_id", "PAD_ID", np.int32),
            ("prompt_table_extra_id", "PROMPT_TABLE_EXTRA_ID", np.uint64),
        ):
            value = get(request, source)
            if value is not None:
                inputs.append(pb_utils.Tensor(target, np.asarray(value, dtype=dtype).reshape(1, -1)))
        response = pb_utils.InferenceRequest(
            model_name=self.preprocessing_model,
            inputs=inputs,
            requested_output_names=[
                "INPUT_ID",
                "REQUEST_INPUT_LEN",
                "REQUEST_OUTPUT_LEN",
                "BAD_WORDS_IDS",
                "STOP_WORDS_IDS",
                "EMBEDDING_BIAS",
                "OUT_END_ID",
                "OUT_PAD_ID",
            ],
        ).exec()
        if response.has_error():
            reraise(pb_utils, response.error(), self.preprocessing_model)
        return {t.name(): t.as_numpy() for t in response.output_tensors()}

    def _engine_request(self, request: Any, pre: dict[str, np.ndarray], streaming: bool) -> Any:
        return pb_utils.InferenceRequest(
            model_name=self.engine_model, inputs=self._engine_tensors(request, pre, streaming), requested_output_names=[]
        )

    def _engine_tensors(
        self,
        request: Any,
        pre: dict[str, np.ndarray],
        streaming: bool,
        input_ids: np.ndarray | None = None,
        output_len: int | None = None,
        skip: Collection[str] = (),
    ) -> list[Any]:
        """The engine model's inputs for this request: the prompt (or `input_ids`) and the request's own inputs,
        except those named in `skip`."""
        if input_ids is None:
            input_ids = self._prompt_ids(pre)
        if output_len is None:
            output_len = int(pre["REQUEST_OUTPUT_LEN"].reshape(-1)[0])
        tensors = [
            pb_utils.Tensor("input_ids", np.asarray(input_ids, dtype=np.int32).reshape(1, -1)),
            pb_utils.Tensor("input_lengths", np.array([[len(input_ids)]], dtype=np.int32)),
            pb_utils.Tensor("request_output_len", np.array([[output_len]], dtype=np.int32)),
            pb_utils.Tensor("end_id", pre["OUT_END_ID"].reshape(1, 1).astype(np.int32)),
            pb_utils.Tensor("pad_id", pre["OUT_PAD_ID"].reshape(1, 1).astype(np.int32)),
            # Detokenization here works on generated ids only; the prompt is added back as text.
            pb_utils.Tensor("exclude_input_in_output", np.array([[True]], dtype=bool)),
            pb_utils.Tensor("streaming", np.array([[streaming]], dtype=bool)),
        ]
        for name in ("BAD_WORDS_IDS", "STOP_WORDS_IDS"):
            if pre[name].shape[-1] > 0:
                tensors.append(
                    pb_utils.Tensor("bad_words_list" if name == "BAD_WORDS_IDS" else "stop_words_list", pre[name].astype(np.int32))
                )
        if pre["EMBEDDING_BIAS"].shape[-1] > 0:
            tensors.append(pb_utils.Tensor("embedding_bias", pre["EMBEDDING_BIAS"].astype(np.float32)))
        for source, target in ENGINE_INPUTS.items():
            if source == "exclude_input_in_output" or source in skip:
                continue
            value = get(request, source)
            if value is not None:
                value = np.asarray(value)
                tensors.append(pb_utils.Tensor(target, value.reshape(1, 1) if source in SCALAR_INPUTS else value))
        return tensors

    def _engine_steps(self, engine_request: Any, stream: dict[str, Any]) -> Iterator[tuple[list[int] | None, dict[str, np.ndarray]]]:
        """(new token ids or None, engine outputs to forward) for each engine response."""
        for response in self._engine_responses(engine_request, stream):
            if response.has_error():
                reraise(pb_utils, response.error(), self.engine_model)
            # One pass over the response's tensors (get_output_tensor_by_name scans them on each call).
            outputs = {tensor.name(): tensor for tensor in response.output_tensors()}
            forwarded = {name: outputs[name].as_numpy() for name in self.forwarded_outputs if name in outputs}
            yield self._new_ids(outputs), forwarded

    @staticmethod
    def _prompt_ids(pre: dict[str, np.ndarray]) -> np.ndarray:
        """The prompt's token ids from the preprocessing outputs (INPUT_ID is padded to the batch's longest)."""
        return pre["INPUT_ID"].reshape(-1)[: int(pre["REQUEST_INPUT_LEN"].reshape(-1)[0])]

    @staticmethod
    def _new_ids(outputs: dict[str, Any]) -> list[int] | None:
        """The generated ids of a response (the engine is asked to leave the input out), or None without output_ids."""
        output_ids = outputs.get("output_ids")
        if output_ids is None:
            return None
        ids = output_ids.as_numpy()
        if ids.size == 0:  # e.g. [1, 1, 0]: a response without tokens
            return []
        lengths = outputs["sequence_length"].as_numpy().reshape(-1)
        return ids.reshape(-1, ids.shape[-1])[0][: int(lengths[0])].tolist()

    # --- draft-target speculative decoding -----------------------------------------------------------

    def _num_draft_tokens(self, request: Any) -> int:
        """Tokens to draft per step: the request's num_draft_tokens, else default_num_draft_tokens (0: no drafting)."""
        value = get(request, "num_draft_tokens")
        wanted = self.default_draft_tokens if value is None or np.asarray(value).size == 0 else int(first(value))
        if wanted <= 0:
            return 0
        if not self.draft_model:
            raise InvalidInput("num_draft_tokens: this repository has no draft model (tensorrt_llm_draft_model_name is empty); send 0")
        if self.default_draft_tokens and wanted > self.default_draft_tokens:
            raise InvalidInput(f"num_draft_tokens: {wanted} is above the engine's max_draft_len; send 0 to {self.default_draft_tokens}")
        # NVIDIA's BLS refuses these with draft tokens too (lib/decode.py Request.validate; beam search: the README).
        if bool(first(get(request, "return_context_logits"), False)):
            raise InvalidInput("return_context_logits: context logits are not returned with draft-target decoding")
        if int(first(get(request, "beam_width"), 1)) > 1 or int(first(get(request, "num_return_sequences"), 1)) > 1:
            raise InvalidInput("beam_width/num_return_sequences: draft-target decoding returns one greedy or sampled sequence")
        return wanted

    def _draft_target_steps(
        self, request: Any, pre: dict[str, np.ndarray], num_draft: int, stream: dict[str, Any]
    ) -> Iterator[tuple[list[int], dict[str, np.ndarray]]]:
        """NVIDIA's draft-target loop (tensorrt_llm_bls/1/lib/decode.py `_spec_generate`): the draft model proposes
        up to `num_draft` tokens after the sequence so far, the target model checks them in one step and returns the
        ones it accepts plus one of its own; repeat until max_tokens, the end token or no new token. Each step is a
        new request with the whole sequence (KV-cache reuse makes the repeated prefix cheap) and asks both engines to
        leave the input out of the output. Yields (new ids, target outputs to forward) per step."""
        sequence = self._prompt_ids(pre).astype(np.int32)
        budget = int(pre["REQUEST_OUTPUT_LEN"].reshape(-1)[0])
        use_logits = self._use_draft_logits(request)
        min_tokens = int(first(get(request, "min_tokens"), 0))
        per_sequence = ("return_context_logits", "return_generation_logits", "num_return_sequences", "beam_width", "min_tokens")
        while budget > 0:
            drafted, logits = np.zeros(0, dtype=np.int32), None
            wanted = min(num_draft, budget - 1)
            if wanted > 0:
                drafted, logits = self._draft(request, pre, sequence, wanted, use_logits, per_sequence)
            tensors = self._engine_tensors(request, pre, False, sequence, len(drafted) + 1, skip=per_sequence)
            if min_tokens > 0:  # the request's min_tokens counts from its first generated token, not from this step's
                tensors.append(pb_utils.Tensor("min_tokens", np.array([[min(min_tokens, len(drafted) + 1)]], dtype=np.int32)))
            if len(drafted):
                tensors.append(pb_utils.Tensor("draft_input_ids", drafted.reshape(1, -1)))
                if logits is not None:
                    tensors.append(pb_utils.Tensor("draft_logits", logits[-len(drafted) :][np.newaxis]))
            engine_request = pb_utils.InferenceRequest(model_name=self.engine_model, inputs=tensors, requested_output_names=[])
            new_ids, forwarded = None, {}
            for ids, outputs in self._engine_steps(engine_request, stream):
                new_ids = ids if ids is not None else new_ids
                forwarded.update(outputs)
            self._retire_engine_stream(stream)
            if not new_ids:
                return  # the target ended (end token) before producing anything new
            yield new_ids, forwarded
            sequence = np.concatenate([sequence, np.asarray(new_ids, dtype=np.int32)])
            budget -= len(new_ids)
            min_tokens -= len(new_ids)
            if len(drafted) and new_ids == drafted.tolist():
                return  # every draft token and no token of its own: the target stopped at the end token

    def _draft(
        self, request: Any, pre: dict[str, np.ndarray], sequence: np.ndarray, wanted: int, use_logits: bool, skip: Collection[str]
    ) -> tuple[np.ndarray, np.ndarray | None]:
        """`wanted` tokens from the draft model after `sequence` (min_tokens keeps it from ending early, as in
        NVIDIA's loop), and their logits when the target should accept by logits."""
        tensors = self._engine_tensors(request, pre, False, sequence, wanted, skip=skip)
        tensors.append(pb_utils.Tensor("min_tokens", np.array([[wanted]], dtype=np.int32)))
        tensors.append(pb_utils.Tensor("return_generation_logits", np.array([[use_logits]], dtype=bool)))
        names = ["output_ids", "sequence_length"] + (["generation_logits"] if use_logits else [])
        # The draft model is not decoupled (render/draft.py, as NVIDIA fills it): one response.
        response = pb_utils.InferenceRequest(model_name=self.draft_model, inputs=tensors, requested_output_names=names).exec()
        if response.has_error():
            reraise(pb_utils, response.error(), self.draft_model)
        outputs = {tensor.name(): tensor for tensor in response.output_tensors()}
        drafted = np.asarray(self._new_ids(outputs) or [], dtype=np.int32)
        logits = None
        if use_logits and "generation_logits" in outputs:
            values = outputs["generation_logits"].as_numpy()  # [1, beam, tokens, vocab]
            logits = values.reshape(-1, values.shape[-2], values.shape[-1])[0]
        return drafted, logits

    def _use_draft_logits(self, request: Any) -> bool:
        value = get(request, "use_draft_logits")
        return self.default_draft_logits if value is None or np.asarray(value).size == 0 else bool(first(value))

    def _retire_engine_stream(self, stream: dict[str, Any]) -> None:
        """A finished step's engine stream joins the ones kept until the stub has let go of them (module docstring)."""
        iterator = stream.pop("iterator", None)
        stream.pop("finished", None)
        if iterator is not None:
            self.retired_streams.append(iterator)

    def _engine_responses(self, engine_request: Any, stream: dict[str, Any]) -> Iterator[Any]:
        """The engine's responses; a decoupled stream's iterator is left in `stream` for _release_engine_stream."""
        if self.engine_decoupled:
            stream["iterator"] = engine_request.exec(decoupled=True)
            for response in stream["iterator"]:
                if response is None:
                    continue
                yield response
            stream["finished"] = True
        else:
            yield engine_request.exec()
