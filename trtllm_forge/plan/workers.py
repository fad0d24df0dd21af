"""NVIDIA Dynamo's workers as `plan` accounts for them (deploy.dynamo): how many workers of each role, GPUs per
worker, the KV cache each holds and what the whole graph needs. The renderings (deploy/dynamo_graph.py) read the
counts from here, so the plan and the manifest cannot disagree."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from trtllm_forge.config import ForgeConfig

if TYPE_CHECKING:
    from trtllm_forge.plan.planner import Plan


@dataclass(frozen=True)
class WorkerCounts:
    """Replicas per role: aggregated workers prefill and decode; disaggregated, prefill workers hand each prompt's KV
    cache to a decode worker."""

    aggregated: int  # 0 when disaggregated
    prefill: int  # 0 when aggregated
    decode: int  # 0 when aggregated

    @property
    def total(self) -> int:
        return self.aggregated + self.prefill + self.decode

    @property
    def decoding(self) -> int:
        """The workers that hold sequences while they generate."""
        return self.aggregated or self.decode


def worker_counts(config: ForgeConfig) -> WorkerCounts:
    dynamo = config.deploy.dynamo
    if dynamo.disaggregated:
        return WorkerCounts(0, dynamo.prefill_workers, dynamo.decode_workers)
    return WorkerCounts(dynamo.workers, 0, 0)


def gpus_per_worker(config: ForgeConfig) -> int:
    """Each dynamo.trtllm worker is one LLM() over tp x pp GPUs (moe_ep splits the tensor-parallel GPUs, it adds none)."""
    return config.deploy.dynamo.gpus_per_worker or config.parallel.world_size


def dynamo_workers(plan: Plan) -> dict[str, Any]:
    """plan.json's `dynamo`: the worker split, GPUs, and the KV cache per worker and in all (every worker holds the
    plan's KV pool: the same model, GPUs and settings)."""
    config = plan.config
    counts = worker_counts(config)
    gpus = gpus_per_worker(config)
    # Each pipeline stage's tp GPUs hold the pool's tokens for that stage's layers.
    kv_bytes_per_token = plan.mapping.tp * sum(r.kv_bytes_per_token for r in plan.memory)
    return {
        "mode": "disaggregated" if config.deploy.dynamo.disaggregated else "aggregated",
        "router_mode": config.deploy.dynamo.router_mode,
        "workers": {"aggregated": counts.aggregated, "prefill": counts.prefill, "decode": counts.decode},
        "gpus_per_worker": gpus,
        "gpus": gpus * counts.total,
        "kv_tokens_per_worker": plan.kv.max_tokens,
        "kv_bytes_per_worker": plan.kv.max_tokens * kv_bytes_per_token,
        "concurrent_sequences_per_worker": plan.max_concurrent_sequences,
        # Decoding workers hold the running sequences; prefill workers only hold prompts until they are sent.
        "concurrent_sequences": plan.max_concurrent_sequences * counts.decoding,
    }


def describe_workers(workers: dict[str, Any]) -> str:
    """The `dynamo` block as one line of the plan report."""
    split = workers["workers"]
    roles = (
        f"{split['prefill']} prefill + {split['decode']} decode workers"
        if workers["mode"] == "disaggregated"
        else f"{split['aggregated']} aggregated workers"
    )
    return (
        f"Dynamo: {roles} x {workers['gpus_per_worker']} GPUs = {workers['gpus']} GPUs; each worker holds "
        f"{workers['kv_tokens_per_worker']:,} KV tokens ({workers['kv_bytes_per_worker'] / 1024**3:,.2f} GiB), room for "
        f"{workers['concurrent_sequences_per_worker']} sequences; {workers['concurrent_sequences']} on the decoding workers "
        f"(router {workers['router_mode']})"
    )


def dynamo_engine_instances(config: ForgeConfig, on_gpu: bool) -> tuple[int, str]:
    """Dynamo: the aggregated workers, or the decode workers of a disaggregated graph (the serving model treats them
    as aggregated ones)."""
    counts = worker_counts(config)
    if counts.aggregated:
        return counts.aggregated, "deploy.dynamo.workers"
    return counts.decode, "deploy.dynamo.decode_workers (disaggregated: modelled as aggregated workers)"
