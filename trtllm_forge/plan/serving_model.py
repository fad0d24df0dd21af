"""A serving steady state from the roofline's step cost: what `concurrency` clients get from an engine.

Closed loop: `concurrency` clients each keep one request in flight (prompt `workload.input_len` tokens, answer
`workload.output_len` tokens) and send the next as soon as one ends. Each serving instance (one engine, one model
replica, one Dynamo worker) gets an even share of the clients and runs in-flight batching: every step decodes one
token of each running sequence and, within `max_num_tokens` tokens per step, prefills the chunks of the prompts
of newly admitted ones. A sequence holds a slot from admission to its last token; at most
batch = min(clients, max_batch_size, sequences the KV cache holds at the workload, max_num_tokens) run at once,
the rest wait in the queue.

Over one slot lifetime of L steps the batch's B slots prefill B prompts and decode B x (OSL - 1) tokens (the
prompt's last step samples the first token):
  L = max(ceil(ISL / max_num_tokens) + OSL - 1, B x (ISL + OSL - 1) / max_num_tokens)   (the token budget binds)
  d = B x (OSL - 1) / L                      decode tokens in every step
  chunk = max_num_tokens - d                 prefill tokens a step has room for
  n_p = min(L, B x ceil(ISL / chunk))        steps carrying prefill (arrivals spread out: one prompt's chunk
                                             per step unless every step already carries one)
The prefill-bearing steps carry d decode tokens and B x ISL / n_p prompt tokens (compute-bound for long
prompts); the others only d decode tokens (memory-bound). Their times come from the roofline's `ModelCost.step`
(per stage max(bytes / bandwidth, FLOPs / peak), plus communication), so the lifetime takes
T = n_p x t_mixed + (L - n_p) x t_decode and
  requests/s = B / T, output tokens/s = B x OSL / T, TPOT = T / L (the mean step a running sequence waits),
  TTFT = queueing (clients - B) / requests/s (Little's law in a closed loop) + half a step in flight on arrival
         + its own prefill: max(ceil(ISL / chunk), L - OSL + 1) steps with prefill (the second term: the token
         budget makes prompts wait for room).
That is the default, `arrivals="spread"`: lengths vary, so requests end, and their clients' next requests arrive,
at different steps. With `arrivals="waves"` (fixed lengths and clients that start together, as a bench forcing
the output length runs) the batch stays in step: its B prompts are prefilled together in ceil(B x ISL /
max_num_tokens) steps, then OSL - 1 decode-only steps follow; TTFT is the median prompt's share of the prefill
steps (plus queueing), TPOT the rest of the wave over OSL - 1 tokens.
Both are means over the steady state; the bound is physical (no kernel, scheduler or server overhead), so
measured numbers are slower, and not by one constant factor: the model ranks configurations for pruning, and
measurement confirms. Not modelled: speculative decoding's draft tokens, beams, KV-cache reuse, and a
disaggregated prefill/decode split (its decode workers are treated as aggregated ones).

Instances: on GPUs each instance (a Dynamo worker) has its own GPUs. On a CPU host the instances share the
host: each gets 1/instances of the measured bandwidth and matrix throughput (the host profile measures the whole
machine with every core), so more instances only help where a limit (max_batch_size) caps one instance's batch,
and each pays for reading its own copy of the weights every step.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING

from trtllm_forge.plan.planner import Plan
from trtllm_forge.plan.roofline import Machine, StepTime

if TYPE_CHECKING:
    from trtllm_forge.config.schema import ForgeConfig

LIMITS = ("concurrency", "max_batch_size", "kv_cache", "max_num_tokens")
ARRIVALS = ("spread", "waves")


@dataclass(frozen=True)
class ServingPrediction:
    concurrency: int  # requests in flight the client keeps (all instances together)
    batch: int  # sequences decoding at once in steady state, per instance
    limited_by: str  # which of LIMITS sets `batch` (the first of them on a tie)
    ttft_ms: float  # queueing for a slot + half a step in flight + the prompt's own prefill steps
    tpot_ms: float  # the mean step time with the prefills of arriving requests mixed in
    output_tokens_per_s: float  # per serving instance (one engine / one model replica / one Dynamo worker)
    requests_per_s: float  # per serving instance


@dataclass(frozen=True)
class SteadyState:
    """One slot lifetime of the batch: its steps, the two kinds of step and their times."""

    batch: int
    arrivals: str  # one of ARRIVALS
    lifetime_steps: float  # L
    prefill_steps: float  # n_p: steps that carry prompt tokens
    own_prefill_steps: float  # steps one prompt waits for its own prefill
    mixed: StepTime  # a step with prompt chunks (and, spread, decode tokens)
    decode: StepTime  # a step with decode tokens only

    @property
    def lifetime_s(self) -> float:
        return self.prefill_steps * self.mixed.seconds + (self.lifetime_steps - self.prefill_steps) * self.decode.seconds

    @property
    def mean_step_s(self) -> float:
        return self.lifetime_s / self.lifetime_steps

    @property
    def first_token_s(self) -> float:
        """From admission to the first token (spread: an arrival also waits for the step in flight)."""
        own = self.own_prefill_steps * self.mixed.seconds
        return own if self.arrivals == "waves" else own + self.mean_step_s / 2

    @property
    def tpot_s(self) -> float:
        """Spread: the mean step. Waves: the rest of the wave over the tokens after the first."""
        if self.arrivals != "waves":
            return self.mean_step_s
        after_first = self.lifetime_steps - self.prefill_steps  # OSL - 1 decode steps
        if after_first <= 0:
            return self.decode.seconds
        return (self.lifetime_s - self.own_prefill_steps * self.mixed.seconds) / after_first


def batch_limits(plan: Plan, clients: int) -> dict[str, int]:
    """Each limit on the sequences one instance runs at once, in LIMITS order."""
    engine = plan.config.engine
    return {
        "concurrency": clients,
        "max_batch_size": engine.max_batch_size,
        "kv_cache": plan.max_concurrent_sequences,
        "max_num_tokens": engine.resolved_max_num_tokens,  # every running sequence decodes one token per step
    }


def engine_batch_limit(plan: Plan) -> tuple[int, str]:
    """The most sequences one instance runs at once whatever the load, and the limit that sets it."""
    limits = batch_limits(plan, clients=0)
    name = min(LIMITS[1:], key=lambda limit: limits[limit])
    return limits[name], name


def steady_state(plan: Plan, machine: Machine, batch: int, arrivals: str = "spread") -> SteadyState:
    """The closed loop's steady state at `batch` running sequences (the module docstring's formulas)."""
    if arrivals == "waves":
        return wave_state(plan, machine, batch)
    isl, osl = max(1, plan.workload.input_len), max(1, plan.workload.output_len)
    budget = plan.config.engine.resolved_max_num_tokens
    context = plan.workload.mean_context
    lifetime = max(math.ceil(isl / budget) + osl - 1, batch * (isl + osl - 1) / budget)
    decode_tokens = batch * (osl - 1) / lifetime
    chunk = max(1.0, budget - decode_tokens)
    chunks_per_prompt = math.ceil(isl / chunk)
    prefill_steps = min(lifetime, batch * chunks_per_prompt)
    finished = batch / prefill_steps  # prompts finishing their prefill (and sampling a token) per mixed step
    prompt_tokens = batch * isl / prefill_steps
    prompt_pairs = finished * isl * (isl + 1) / 2  # causal attention over the whole prompt
    prompt_rereads = finished * isl * (chunks_per_prompt - 1) / 2  # each chunk reads the earlier chunks' KV
    mixed = plan.cost.step(
        machine,
        decode_tokens + prompt_tokens,
        decode_tokens + finished,
        decode_tokens * context + prompt_pairs,
        decode_tokens * context + prompt_tokens + prompt_rereads,
    )
    decode = plan.cost.step(machine, decode_tokens, decode_tokens, decode_tokens * context, decode_tokens * context)
    own = max(chunks_per_prompt, lifetime - (osl - 1))
    return SteadyState(batch, "spread", lifetime, prefill_steps, own, mixed, decode)


def wave_state(plan: Plan, machine: Machine, batch: int) -> SteadyState:
    """Waves: the batch's prompts prefilled together in ceil(B x ISL / max_num_tokens) steps, then OSL - 1 decode
    steps of the whole batch; the median prompt's first token comes after ceil(ceil(B / 2) x ISL / max_num_tokens)
    of the prefill steps."""
    isl, osl = max(1, plan.workload.input_len), max(1, plan.workload.output_len)
    budget = plan.config.engine.resolved_max_num_tokens
    context = plan.workload.mean_context
    prefill_steps = math.ceil(batch * isl / budget)
    chunks_per_prompt = math.ceil(isl / budget)
    finished = batch / prefill_steps  # prompts sampling their first token per prefill step
    prompt_tokens = batch * isl / prefill_steps
    prefill = plan.cost.step(
        machine,
        prompt_tokens,
        finished,
        finished * isl * (isl + 1) / 2,
        prompt_tokens + finished * isl * (chunks_per_prompt - 1) / 2,
    )
    decode = plan.cost.step(machine, batch, batch, batch * context, batch * context)
    median = math.ceil(math.ceil(batch / 2) * isl / budget)
    return SteadyState(batch, "waves", prefill_steps + osl - 1, prefill_steps, median, prefill, decode)


def predict_serving(plan: Plan, *, concurrency: int, instances: int = 1, arrivals: str = "spread") -> ServingPrediction | None:
    """The closed-loop steady state of `concurrency` clients over `instances` instances (None without the
    machine's numbers). No I/O: cheap enough to call for every point of a search space.

    `arrivals`: "spread" (lengths vary, so requests end and arrive at different steps: the default) or "waves"
    (every request has the same lengths and the clients start together, as a bench that forces the output length
    does: the batch stays in step, prefills its prompts together and then only decodes)."""
    if concurrency < 1 or instances < 1:
        raise ValueError(f"concurrency ({concurrency}) and instances ({instances}) must be at least 1")
    if arrivals not in ARRIVALS:
        raise ValueError(f"arrivals must be one of {', '.join(ARRIVALS)}, not {arrivals!r}")
    if plan.machine is None:
        return None
    machine = plan.machine if plan.device.is_gpu else plan.machine.shared(instances)
    clients = math.ceil(concurrency / instances)
    limits = batch_limits(plan, clients)
    limited_by = min(LIMITS, key=lambda name: limits[name])
    batch = limits[limited_by]
    if batch < 1:  # the KV cache holds no sequence of this workload
        return ServingPrediction(concurrency, 0, limited_by, math.inf, math.inf, 0.0, 0.0)
    state = steady_state(plan, machine, batch, arrivals)
    requests_per_s = batch / state.lifetime_s
    queueing_s = (clients - batch) / requests_per_s
    return ServingPrediction(
        concurrency=concurrency,
        batch=batch,
        limited_by=limited_by,
        ttft_ms=(queueing_s + state.first_token_s) * 1e3,
        tpot_ms=state.tpot_s * 1e3,
        output_tokens_per_s=requests_per_s * max(1, plan.workload.output_len),
        requests_per_s=requests_per_s,
    )


def config_instances(plan: Plan) -> tuple[int, str]:
    """The engines the config serves with at once, and what they are: its server kind says (server_kinds.py
    `engine_instances`: Triton's engine model instances on a CPU engine, Dynamo's workers), else one engine."""
    from trtllm_forge.server_kinds import entry_for, resolve

    reference = entry_for(plan.config.deploy.server).engine_instances
    count, what = resolve(reference)(plan.config, plan.device.is_gpu) if reference else (1, "one engine")
    return int(count), str(what)


def triton_engine_instances(config: ForgeConfig, on_gpu: bool) -> tuple[int, str]:
    """Triton: the CPU engine model's instances each run an engine; on a GPU the instances share one engine."""
    if not on_gpu and config.triton.instances.tensorrt_llm > 1:
        return config.triton.instances.tensorrt_llm, "triton.instances.tensorrt_llm"
    return 1, "one engine"


def concurrency_sweep(plan: Plan, instances: int = 1) -> list[int]:
    """1, 2, 4, ... up to twice what the instances' max_batch_size admits (and that value itself)."""
    top = 2 * plan.config.engine.max_batch_size * instances
    return sorted({1 << i for i in range(top.bit_length()) if 1 << i <= top} | {top})
