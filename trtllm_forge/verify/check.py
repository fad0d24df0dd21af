"""The serving side of `verify`: fixed prompts through the deployed models, compared with transformers.

For every prompt, three answers are collected from the running server:
- token ids straight from the engine model (`tensorrt_llm`), greedy: compared token by token with the reference;
- the ensemble's text, not streamed: must equal the reference text when the tokens agree;
- the ensemble's text, streamed: the pieces joined must equal the non-streamed text.
An answer that stops early or runs on past transformers' end of sequence is a mismatch like a different token.
Quantized engines may differ from the reference; for them the perplexity of the engine itself on a local text
is compared with the reference model's, against `verify.max_perplexity_increase`, wherever verify can load the
engine (`engine_scorers.engine_scorer`: the scorer the engine's descriptor names). Where it cannot, the report says the perplexity was not checked and why,
and the quantized engine passes on token agreement alone unless `verify.require_perplexity` is set.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from enum import StrEnum
from pathlib import Path
from typing import Any

import numpy as np

from trtllm_forge.config.schema import ForgeConfig
from trtllm_forge.deploy.kinds.protocol import Deployment, Speaks
from trtllm_forge.entrypoint import entry_model, is_llmapi
from trtllm_forge.verify.engine_scorers import Unscorable, engine_scorer
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

    @property
    def runs_past_end(self) -> bool:
        """The served answer holds all of transformers' and goes on after transformers' end of sequence."""
        return len(self.served_ids) > len(self.reference_ids) and self.served_ids[: len(self.reference_ids)] == self.reference_ids

    def to_json(self) -> dict[str, Any]:
        data = asdict(self)
        data["agreement"] = self.agreement.to_json()
        data["stream_matches"] = self.stream_matches
        data["runs_past_end"] = self.runs_past_end
        return data


class PerplexityStatus(StrEnum):
    CHECKED = "checked"  # the engine's perplexity was measured and compared with the reference's
    NOT_CHECKED = "not_checked"  # a quantized engine verify cannot score (reason says why)
    NOT_NEEDED = "not_needed"  # an unquantized engine: held to exact token agreement instead


@dataclass(frozen=True)
class PerplexityCheck:
    status: PerplexityStatus
    reason: str | None = None
    reference: Perplexity | None = None
    engine: Perplexity | None = None
    max_increase: float | None = None

    @property
    def increase(self) -> float | None:
        """Relative rise of the engine's perplexity over the reference's (0.05 = 5% higher)."""
        if self.reference is None or self.engine is None:
            return None
        return self.engine.perplexity / self.reference.perplexity - 1.0

    @property
    def within_limit(self) -> bool | None:
        increase = self.increase
        if increase is None or self.max_increase is None:
            return None
        return increase <= self.max_increase

    def to_json(self) -> dict[str, Any]:
        return {
            "status": str(self.status),
            "reason": self.reason,
            "reference": self.reference.to_json() if self.reference else None,
            "engine": self.engine.to_json() if self.engine else None,
            "increase": self.increase,
            "max_increase": self.max_increase,
        }


@dataclass
class VerifyReport:
    checks: list[PromptCheck]
    agreement: Agreement
    min_token_agreement: float
    quantized: bool
    perplexity: PerplexityCheck
    problems: list[str] = field(default_factory=list)
    reference_source: str = "transformers"  # or "cache": every reference answer came from an earlier run's
    reference_cache: str | None = None

    @property
    def passed(self) -> bool:
        return not self.problems

    @property
    def agreement_only(self) -> bool:
        """A quantized engine whose perplexity verify could not check: judged on token agreement alone."""
        return self.quantized and self.perplexity.status is PerplexityStatus.NOT_CHECKED

    def to_json(self) -> dict[str, Any]:
        return {
            "passed": self.passed,
            "problems": self.problems,
            "quantized": self.quantized,
            "agreement_only": self.agreement_only,
            "min_token_agreement": self.min_token_agreement,
            "reference": {"source": self.reference_source, "cache": self.reference_cache},
            "agreement": self.agreement.to_json(),
            "perplexity": self.perplexity.to_json(),
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


def answer_ids(ids: list[int], end_id: int) -> list[int]:
    """The tokens compared: an answer without its end id (transformers' closing EOS, an engine's end padding)."""
    return [t for t in ids if t != end_id]


def is_quantized(config: ForgeConfig) -> bool:
    return config.quantization.algorithm != "none" or config.quantization.kv_cache != "none"


def check_perplexity(config: ForgeConfig, engine_dir: Path | None, reference: Callable[[], Perplexity]) -> PerplexityCheck:
    """The quantized engine's perplexity against the reference model's (`reference()`, asked only when the engine
    is scored), where verify can load the engine."""
    if not is_quantized(config):
        return PerplexityCheck(PerplexityStatus.NOT_NEEDED, "unquantized: held to exact token agreement")
    scorer = engine_scorer(config.engine.backend)
    if isinstance(scorer, Unscorable):
        return PerplexityCheck(PerplexityStatus.NOT_CHECKED, scorer.reason)
    if engine_dir is None:
        return PerplexityCheck(
            PerplexityStatus.NOT_CHECKED, "no built engine in the workdir to load (run `trtllm-forge build-engine CONFIG`)"
        )
    return PerplexityCheck(
        PerplexityStatus.CHECKED,
        reference=reference(),
        engine=scorer(config, engine_dir),
        max_increase=config.verify.max_perplexity_increase,
    )


def perplexity_problems(check: PerplexityCheck, required: bool) -> list[str]:
    """What fails verify in a perplexity check; `required` is verify.require_perplexity."""
    if check.status is PerplexityStatus.NOT_CHECKED:
        return [f"perplexity not checked ({check.reason}) and verify.require_perplexity is true"] if required else []
    increase = check.increase
    if check.within_limit is False and increase is not None and check.max_increase is not None:
        return [f"perplexity rose {increase:.1%} over the unquantized model (verify.max_perplexity_increase {check.max_increase:.1%})"]
    return []


def build_report(config: ForgeConfig, checks: list[PromptCheck], perplexity: PerplexityCheck) -> VerifyReport:
    """The verdict on the prompts' answers and the perplexity check, against the config's thresholds."""
    threshold = config.verify.min_token_agreement
    if threshold is None:
        threshold = QUANTIZED_DEFAULT_AGREEMENT if is_quantized(config) else 1.0
    report = VerifyReport(
        checks=checks,
        agreement=mean_agreement([(c.reference_ids, c.served_ids) for c in checks]),
        min_token_agreement=threshold,
        quantized=is_quantized(config),
        perplexity=perplexity,
    )
    if report.agreement.prefix < threshold:
        report.problems.append(f"token agreement {report.agreement.prefix:.1%} is below verify.min_token_agreement {threshold:.1%}")
    for check in checks:
        if not check.stream_matches:
            report.problems.append(f"streamed text differs from the non-streamed text for {check.prompt!r}")
        if check.runs_past_end and threshold >= 1.0:  # named for an exact engine; a quantized one may well go on
            surplus = len(check.served_ids) - len(check.reference_ids)
            report.problems.append(f"the answer to {check.prompt!r} runs {surplus} tokens past transformers' end of sequence")
        if check.agreement.identical and check.served_text.strip() != check.reference_text.strip():
            report.problems.append(f"served text differs from transformers' text for {check.prompt!r} although the tokens agree")
    report.problems.extend(perplexity_problems(perplexity, config.verify.require_perplexity))
    return report


def run_checks(config: ForgeConfig, deployment: Deployment, checkpoint_dir: Path, engine_dir: Path | None) -> VerifyReport:
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
        ref_ids_cmp = answer_ids(answer.output_ids, end_id)
        if is_llmapi(config) or deployment.speaks is Speaks.OPENAI:
            # NVIDIA's llmapi model and OpenAI's API return text only: the served tokens are its text tokenized again.
            from trtllm_forge.llmapi_requests import llmapi_generate

            text = llmapi_generate(deployment, prompt, max_tokens, model=entry_model(config), stream=False)
            streamed = llmapi_generate(deployment, prompt, max_tokens, model=entry_model(config), stream=True)
            got_ids_cmp = list(reference.tokenizer.encode(text.text, add_special_tokens=False))
        else:
            got_ids = served_token_ids(deployment, names.tensorrt_llm, answer.prompt_ids, max_tokens, end_id, pad_id)
            got_ids_cmp = answer_ids(got_ids, end_id)
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

    report = build_report(config, checks, check_perplexity(config, engine_dir, reference.perplexity))
    report.reference_cache = str(reference.path) if reference.path else None
    report.reference_source = reference.source
    return report
