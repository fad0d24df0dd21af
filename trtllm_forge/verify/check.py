"""The serving side of `verify`: fixed prompts through the deployed models, compared with transformers.

For every prompt, three answers are collected from the running server:
- token ids straight from the engine model (`tensorrt_llm`), greedy: compared token by token with the reference;
- the ensemble's text, not streamed: must equal the reference text when the tokens agree;
- the ensemble's text, streamed: the pieces joined must equal the non-streamed text.
Quantized engines may differ from the reference; for them the perplexity of the engine itself on a local text
is compared with the reference model's, against `verify.max_perplexity_increase`.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from trtllm_forge.config.schema import ForgeConfig
from trtllm_forge.entrypoint import entry_model, is_llmapi
from trtllm_forge.verify.reference import Agreement, Perplexity, compare_tokens, mean_agreement
from trtllm_forge.verify.reference_cache import CachedReference

QUANTIZED_DEFAULT_AGREEMENT = 0.5


@dataclass
class PromptCheck:
    prompt: str
    reference_text: str
    served_text: str
    streamed_text: str
    reference_ids: list[int]
    served_ids: list[int]
    agreement: Agreement

    @property
    def stream_matches(self) -> bool:
        return self.streamed_text == self.served_text

    def to_json(self) -> dict:
        data = asdict(self)
        data["agreement"] = self.agreement.to_json()
        data["stream_matches"] = self.stream_matches
        return data


@dataclass
class VerifyReport:
    checks: list[PromptCheck]
    agreement: Agreement
    min_token_agreement: float
    quantized: bool
    reference_perplexity: Perplexity | None = None
    engine_perplexity: Perplexity | None = None
    max_perplexity_increase: float | None = None
    problems: list[str] = field(default_factory=list)
    reference_source: str = "transformers"  # or "cache": every reference answer came from an earlier run's
    reference_cache: str | None = None

    @property
    def perplexity_increase(self) -> float | None:
        if not (self.reference_perplexity and self.engine_perplexity):
            return None
        return self.engine_perplexity.perplexity / self.reference_perplexity.perplexity - 1.0

    @property
    def passed(self) -> bool:
        return not self.problems

    def to_json(self) -> dict:
        return {
            "passed": self.passed,
            "problems": self.problems,
            "quantized": self.quantized,
            "min_token_agreement": self.min_token_agreement,
            "reference": {"source": self.reference_source, "cache": self.reference_cache},
            "agreement": self.agreement.to_json(),
            "perplexity": {
                "reference": self.reference_perplexity.to_json() if self.reference_perplexity else None,
                "engine": self.engine_perplexity.to_json() if self.engine_perplexity else None,
                "increase": self.perplexity_increase,
                "max_increase": self.max_perplexity_increase,
            },
            "prompts": [c.to_json() for c in self.checks],
        }


def _flatten_ids(responses: list[dict[str, np.ndarray]]) -> list[int]:
    """Generated ids from the engine model's responses (streamed pieces or one final answer)."""
    ids: list[int] = []
    for response in responses:
        out = response.get("output_ids")
        if out is None or out.size == 0:
            continue
        beam0 = np.asarray(out).reshape(-1, out.shape[-1])[0] if out.ndim > 1 else np.asarray(out)
        length = response.get("sequence_length")
        count = int(np.ravel(length)[0]) if length is not None and np.size(length) else len(beam0)
        ids.extend(int(t) for t in beam0[:count])
    return ids


def served_token_ids(target: Any, model: str, prompt_ids: list[int], max_tokens: int, end_id: int, pad_id: int) -> list[int]:
    from trtllm_forge.client import stream_request

    values = {
        "input_ids": np.asarray(prompt_ids, dtype=np.int32),
        "input_lengths": [len(prompt_ids)],
        "request_output_len": [max_tokens],
        "end_id": [end_id],
        "pad_id": [pad_id],
        "streaming": [False],
    }
    result = stream_request(target, model, values)
    return _flatten_ids(result.responses)


def is_quantized(config: ForgeConfig) -> bool:
    return config.quantization.algorithm != "none" or config.quantization.kv_cache != "none"


def engine_perplexity(config: ForgeConfig, engine_dir: Path, text: str | None = None) -> Perplexity | None:
    """Perplexity of the built engine itself; only the OpenVINO engine can be loaded on this machine."""
    if config.engine.backend != "openvino":
        return None
    from trtllm_forge.verify.openvino_engine import OpenVINOEngineModel

    return OpenVINOEngineModel(engine_dir, config.engine.cpu_inference_precision).perplexity(text)


def run_checks(config: ForgeConfig, deployment: Any, checkpoint_dir: Path, engine_dir: Path | None) -> VerifyReport:
    from trtllm_forge.client import generate

    names = config.triton.model_names
    entry = names.ensemble if config.triton.entrypoint == "ensemble" else names.bls
    tokenizer_dir = config.resolve_path(config.model.tokenizer).resolve() if config.model.tokenizer else None
    reference = CachedReference(
        checkpoint_dir, tokenizer_dir, trust_remote_code=config.model.trust_remote_code, enabled=config.verify.reference_cache
    )
    end_id, pad_id = reference.special_ids()
    max_tokens = config.verify.max_tokens

    checks = []
    for prompt in config.verify.prompts:
        answer = reference.greedy(prompt, max_tokens)
        ref_ids_cmp = [t for t in answer.output_ids if t != end_id]
        if is_llmapi(config):
            # NVIDIA's llmapi model returns text only: the served tokens are its text tokenized again.
            from trtllm_forge.llmapi_requests import llmapi_generate

            text = llmapi_generate(deployment, prompt, max_tokens, model=entry_model(config), stream=False)
            streamed = llmapi_generate(deployment, prompt, max_tokens, model=entry_model(config), stream=True)
            got_ids_cmp = list(reference.tokenizer.encode(text.text, add_special_tokens=False))
        else:
            got_ids = served_token_ids(deployment, names.tensorrt_llm, answer.prompt_ids, max_tokens, end_id, pad_id)
            got_ids_cmp = [t for t in got_ids if t != end_id]
            text = generate(deployment, prompt, max_tokens, model=entry, stream=False, end_id=end_id, pad_id=pad_id)
            streamed = generate(deployment, prompt, max_tokens, model=entry, stream=True, end_id=end_id, pad_id=pad_id)
        checks.append(
            PromptCheck(
                prompt=prompt,
                reference_text=answer.text,
                served_text=text.text,
                streamed_text=streamed.text,
                reference_ids=ref_ids_cmp,
                served_ids=got_ids_cmp,
                agreement=compare_tokens(ref_ids_cmp, got_ids_cmp),
            )
        )

    quantized = is_quantized(config)
    threshold = config.verify.min_token_agreement
    if threshold is None:
        threshold = QUANTIZED_DEFAULT_AGREEMENT if quantized else 1.0
    report = VerifyReport(
        checks=checks,
        agreement=mean_agreement([(c.reference_ids, c.served_ids) for c in checks]),
        min_token_agreement=threshold,
        quantized=quantized,
        reference_cache=str(reference.path) if reference.path else None,
    )
    if report.agreement.prefix < threshold:
        report.problems.append(f"token agreement {report.agreement.prefix:.1%} is below verify.min_token_agreement {threshold:.1%}")
    for check in checks:
        if not check.stream_matches:
            report.problems.append(f"streamed text differs from the non-streamed text for {check.prompt!r}")
        if check.agreement.identical and check.served_text.strip() != check.reference_text.strip():
            report.problems.append(f"served text differs from transformers' text for {check.prompt!r} although the tokens agree")
    if quantized and engine_dir is not None:
        report.engine_perplexity = engine_perplexity(config, engine_dir)
        if report.engine_perplexity is not None:
            report.reference_perplexity = reference.perplexity()
            report.max_perplexity_increase = config.verify.max_perplexity_increase
            increase = report.perplexity_increase
            if increase is not None and increase > config.verify.max_perplexity_increase:
                report.problems.append(
                    f"perplexity rose {increase:.1%} over the unquantized model "
                    f"(verify.max_perplexity_increase {config.verify.max_perplexity_increase:.1%})"
                )
    report.reference_source = reference.source
    return report
