"""Roofline: the physical lower bound on step time, hence the best-case TPOT, TTFT and tokens/s.

A step cannot be faster than the bytes it must move over memory bandwidth, nor than its FLOPs over the tensor
throughput of the precision the GEMMs run in: time = max(bytes / bandwidth, FLOPs / throughput) per pipeline
stage, plus the communication, which does not overlap: the TP all-reduces over the GPU link (two per layer, ring
algorithm: a per-call latency, 2(tp-1) hops of link latency and 2(tp-1)/tp of the activations over the link
bandwidth, after NCCL's cost model) and the PP stage hand-offs (one call, one hop and the activations each); ring
steps and hand-offs between nodes take the network's hop latency and bandwidth. Link latencies and their
sources: data/hardware.json `links`.

Decode moves the weights once per step (MoE: only the experts the batch touches) and reads every sequence's KV;
prefill moves the weights once and writes the prompt's KV. PP stages of one step run one after another.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

from trtllm_forge.hardware import Device, link_table
from trtllm_forge.model_shape import ModelShape
from trtllm_forge.plan.weights import Mapping, RankWeights

FP8_COMPUTE = {"fp8", "w4a8_awq"}


@dataclass(frozen=True)
class Machine:
    bandwidth: float  # bytes/s of device memory
    peak_flops: float  # FLOP/s of the GEMM precision
    link_bandwidth: float  # bytes/s per direction between TP ranks
    compute_precision: str
    link_call_latency_s: float = 0.0  # once per collective call
    link_hop_latency_s: float = 0.0  # per ring step inside a node
    net_hop_latency_s: float = 0.0  # per ring step between nodes
    net_bandwidth: float = 0.0  # bytes/s per direction between nodes, per GPU

    @classmethod
    def for_device(cls, device: Device, algorithm: str, dtype: str) -> Machine | None:
        """None when the device's numbers are unknown (an unmeasured cpu)."""
        if not device.bandwidth_gb_s:
            return None
        if not device.is_gpu:
            flops, precision = device.fp32_tflops, "fp32"
        elif algorithm in FP8_COMPUTE and device.fp8_tflops:
            flops, precision = device.fp8_tflops, "fp8"
        elif algorithm == "nvfp4" and device.fp4_tflops:
            flops, precision = device.fp4_tflops, "fp4"
        elif algorithm == "int8_sq" and device.int8_tops:
            flops, precision = device.int8_tops, "int8"
        elif dtype == "float32" and device.fp32_tflops:
            flops, precision = device.fp32_tflops, "fp32"
        else:
            # weight-only INT4/INT8 dequantize into fp16/bf16 GEMMs
            flops, precision = device.fp16_tflops, "fp16"
        if not flops:
            return None
        if not device.is_gpu:
            return cls(device.bandwidth_gb_s * 1e9, flops * 1e12, 0.0, precision)  # one host: no link between ranks
        links = link_table()
        link, net = links[device.link_kind], links["network"]
        link_bytes = device.nvlink_gb_s / 2 * 1e9 if device.nvlink_gb_s else (link.bandwidth_gb_s or 0.0) * 1e9
        return cls(
            device.bandwidth_gb_s * 1e9,
            flops * 1e12,
            link_bytes,
            precision,
            link.call_latency_us * 1e-6,
            link.hop_latency_us * 1e-6,
            net.hop_latency_us * 1e-6,
            (net.bandwidth_gb_s or 0.0) * 1e9,
        )

    def shared(self, ways: int) -> Machine:
        """This machine split evenly `ways` ways (engine instances on one host share its bandwidth and cores)."""
        return replace(self, bandwidth=self.bandwidth / ways, peak_flops=self.peak_flops / ways)


@dataclass(frozen=True)
class StepTime:
    memory_s: float
    compute_s: float
    comm_s: float
    seconds: float
    comm_latency_s: float = 0.0  # the part of comm_s that is per-call and per-hop latency, not bytes

    @property
    def compute_bound(self) -> bool:
        return self.compute_s > self.memory_s


@dataclass(frozen=True)
class ModelCost:
    """FLOPs and bytes of one step on each pipeline stage's GPU."""

    shape: ModelShape
    mapping: Mapping
    ranks: list[RankWeights]
    kv_bytes_per_token: list[int]  # per stage
    act_bytes: int
    dtype_bytes: int
    gpus_per_node: int = 0  # 0: every GPU in one node

    def _nodes_crossed(self) -> tuple[int, int]:
        """(nodes one TP group spans, PP hand-offs that cross nodes); TP ranks fill a node before PP stages do."""
        tp, pp = self.mapping.tp, self.mapping.pp
        per_node = self.gpus_per_node or tp * pp
        if tp >= per_node:
            return math.ceil(tp / per_node), pp - 1
        stages_per_node = per_node // tp
        return 1, math.ceil(pp / stages_per_node) - 1

    def _params_per_token(self, rank: RankWeights) -> float:
        """Projection parameters one token multiplies on this GPU (MoE: its expected share of top-k experts)."""
        s, m = self.shape, self.mapping
        h, hd = s.hidden_size, s.head_dim
        q = s.num_attention_heads * hd // m.tp
        kv = m.local_kv_heads(s.num_key_value_heads) * hd
        attention = 2 * h * q + 2 * h * kv
        if s.is_moe:
            mlp = s.num_experts_per_tok / m.moe_ep * 3 * h * (s.intermediate_size // m.moe_tp)
        else:
            mlp = 3 * h * (s.intermediate_size // m.tp)
        return rank.layers * (attention + mlp)

    def _weights_read(self, rank: RankWeights, tokens: float) -> float:
        s = self.shape
        experts = 0.0
        if s.is_moe and rank.local_experts:
            # experts the batch touches per layer (uniform routing); ranks run in lockstep, so with expert
            # parallelism the step waits for the rank that holds the most of them: at least an even share
            distinct = s.num_local_experts * (1 - (1 - s.num_experts_per_tok / s.num_local_experts) ** tokens)
            ep = self.mapping.moe_ep
            busiest = distinct if ep == 1 else min(rank.local_experts, math.ceil(distinct / ep - 1e-9))
            experts = rank.layers * busiest * rank.expert_bytes_each
        if rank.head_is_embedding:
            embedding = rank.embedding  # the whole table is read as lm_head
        else:
            embedding = min(tokens, s.vocab_size) * s.hidden_size * self.dtype_bytes if rank.embedding else 0.0
        return rank.projections + rank.other + rank.lm_head + embedding + experts

    def _flops(self, rank: RankWeights, tokens: float, logits_rows: float, attention_pairs: float) -> float:
        s, m = self.shape, self.mapping
        heads = s.num_attention_heads // m.tp
        lm_head = (rank.embedding if rank.head_is_embedding else rank.lm_head) / self.dtype_bytes
        # QK^T and AV each take 2 FLOPs per (query, key) pair per head dimension
        attention = 4 * rank.layers * heads * s.head_dim * attention_pairs
        return 2 * tokens * self._params_per_token(rank) + 2 * logits_rows * lm_head + attention

    def _comm(self, machine: Machine, tokens: float) -> tuple[float, float]:
        """(seconds of communication in one step, the latency part of it)."""
        tp, pp = self.mapping.tp, self.mapping.pp
        size = tokens * self.shape.hidden_size * self.act_bytes
        tp_nodes, crossing = self._nodes_crossed()
        latency = transfer = 0.0
        if tp > 1:
            all_reduces = 2 * self.shape.num_hidden_layers  # after attention and after the MLP
            net_hops = 2 * (tp_nodes - 1)  # NCCL: the ring's steps between nodes
            hops = (2 * (tp - 1) - net_hops) * machine.link_hop_latency_s + net_hops * machine.net_hop_latency_s
            slowest = machine.link_bandwidth if tp_nodes == 1 else min(machine.link_bandwidth, machine.net_bandwidth)
            latency += all_reduces * (machine.link_call_latency_s + hops)
            transfer += all_reduces * 2 * (tp - 1) / tp * size / slowest
        if pp > 1:
            inside = pp - 1 - crossing
            latency += (pp - 1) * machine.link_call_latency_s + inside * machine.link_hop_latency_s + crossing * machine.net_hop_latency_s
            transfer += inside * size / machine.link_bandwidth + (crossing * size / machine.net_bandwidth if crossing else 0.0)
        return latency + transfer, latency

    def step(self, machine: Machine, tokens: float, logits_rows: float, pairs: float, kv_tokens: float) -> StepTime:
        """One step of `tokens` tokens (decode and prefill mixed), `logits_rows` of them sampled, `pairs` attention
        (query, key) pairs, `kv_tokens` tokens of KV read or written."""
        memory = compute = total = 0.0
        for rank, kv_per_token in zip(self.ranks, self.kv_bytes_per_token, strict=False):
            m = (self._weights_read(rank, tokens) + kv_tokens * kv_per_token) / machine.bandwidth
            c = self._flops(rank, tokens, logits_rows, pairs) / machine.peak_flops
            memory, compute, total = memory + m, compute + c, total + max(m, c)
        comm, latency = self._comm(machine, tokens)
        return StepTime(memory, compute, comm, total + comm, latency)

    def decode(self, machine: Machine, batch: int, context: float) -> StepTime:
        """One decode step of `batch` sequences whose KV holds `context` tokens each."""
        return self.step(machine, batch, batch, batch * context, batch * context)

    def prefill(self, machine: Machine, batch: int, prompt_len: int) -> StepTime:
        """Prefill of `batch` prompts of `prompt_len` tokens at once (causal attention, KV written)."""
        tokens = batch * prompt_len
        return self.step(machine, tokens, batch, batch * prompt_len * (prompt_len + 1) / 2, tokens)

    def compute_bound_batch(self, machine: Machine, context: float, limit: int = 1 << 16) -> int | None:
        """The smallest batch whose decode step is compute-bound, or None below `limit`."""
        if not self.decode(machine, limit, context).compute_bound:
            return None
        lo, hi = 1, limit
        while lo < hi:
            mid = (lo + hi) // 2
            if self.decode(machine, mid, context).compute_bound:
                hi = mid
            else:
                lo = mid + 1
        return lo
