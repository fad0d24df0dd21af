"""`SamplingParams` with the field names and defaults of TensorRT-LLM's LLM API
(NVIDIA/TensorRT-LLM:tensorrt_llm/sampling_params.py); fields the CPU engine cannot honour are refused when set."""

from __future__ import annotations

from dataclasses import dataclass, fields


class UnsupportedSampling(ValueError):
    pass


@dataclass
class SamplingParams:
    end_id: int | None = None
    pad_id: int | None = None
    max_tokens: int = 32
    stop: str | list[str] | None = None
    stop_token_ids: list[int] | None = None
    include_stop_str_in_output: bool = False
    bad: str | list[str] | None = None
    bad_token_ids: list[int] | None = None
    n: int = 1
    best_of: int | None = None
    use_beam_search: bool = False
    top_k: int | None = None
    top_p: float | None = None
    seed: int | None = None
    temperature: float | None = None
    min_tokens: int | None = None
    repetition_penalty: float | None = None
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    logprobs: int | None = None
    exclude_input_from_output: bool = True
    return_perf_metrics: bool = False
    ignore_eos: bool = False
    detokenize: bool = True
    add_special_tokens: bool = True
    skip_special_tokens: bool = True

    def __post_init__(self) -> None:
        if self.pad_id is None:
            self.pad_id = self.end_id
        self.best_of = self.best_of or self.n
        if self.best_of < self.n:
            raise ValueError(f"best_of ({self.best_of}) cannot be less than n ({self.n})")
        if self.best_of > 1 or self.use_beam_search:
            raise UnsupportedSampling("the CPU stand-in returns one sequence: n, best_of must be 1 and use_beam_search false")
        if self.bad or self.bad_token_ids:
            raise UnsupportedSampling("bad / bad_token_ids are not supported by the CPU stand-in")
        if self.max_tokens < 1:
            raise ValueError(f"max_tokens must be >= 1, got {self.max_tokens}")
        if self.temperature is not None and self.temperature < 0:
            raise ValueError(f"temperature must be >= 0, got {self.temperature}")
        if self.top_p is not None and not 0.0 <= self.top_p <= 1.0:
            raise ValueError(f"top_p must be in [0, 1], got {self.top_p}")
        if self.top_k is not None and self.top_k < 0:
            raise ValueError(f"top_k must be >= 0, got {self.top_k}")

    @property
    def greedy(self) -> bool:
        """TensorRT-LLM's rule (`_greedy_decoding`): top_k None/1 and top_p None/0 decode greedily, whatever the temperature."""
        return (self.top_k is None or self.top_k == 1) and (self.top_p is None or self.top_p == 0.0)

    @property
    def stop_strings(self) -> list[str]:
        if self.stop is None:
            return []
        return [self.stop] if isinstance(self.stop, str) else [s for s in self.stop if s]

    @classmethod
    def field_names(cls) -> list[str]:
        return [f.name for f in fields(cls)]
