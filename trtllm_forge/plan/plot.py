"""The roofline plot: output tokens/s against batch size, with the memory and the compute bound."""

from __future__ import annotations

from pathlib import Path

from trtllm_forge.plan.planner import Plan


def plot_roofline(plan: Plan, path: Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    top = max(plan.config.engine.max_batch_size, plan.max_concurrent_sequences, 2)
    batches = sorted({round(top ** (i / 63)) for i in range(64)} | {1, top})
    points = [p for b in batches if (p := plan.point(b)) is not None]
    memory = [b / (p.decode.memory_s + p.decode.comm_s) for b, p in zip(batches, points, strict=False)]
    compute = [b / (p.decode.compute_s + p.decode.comm_s) for b, p in zip(batches, points, strict=False)]
    best = [p.tokens_per_s for p in points]

    fig, ax = plt.subplots(figsize=(8, 5), dpi=100)
    ax.plot(batches, best, "-", linewidth=5, alpha=0.35, color="tab:green", label="roofline (the lower of both)")
    ax.plot(batches, memory, "--", color="tab:blue", label="memory bound (weights + KV reads / bandwidth)")
    ax.plot(batches, compute, ":", color="tab:orange", label="compute bound (FLOPs / peak)")
    for limit, label in (
        (plan.max_concurrent_sequences, f"KV capacity: {plan.max_concurrent_sequences} sequences"),
        (plan.config.engine.max_batch_size, f"max_batch_size {plan.config.engine.max_batch_size}"),
    ):
        if 0 < limit <= top:
            ax.axvline(limit, color="grey", linewidth=1)
            ax.annotate(label, (limit, min(best)), rotation=90, va="bottom", ha="right", fontsize=8)
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel("batch size (sequences decoding at once)")
    ax.set_ylabel("output tokens/s")
    w = plan.workload
    weights = plan.algorithm if plan.algorithm != "none" else plan.dtype
    ax.set_title(
        f"{plan.config.name}: {weights} on {plan.mapping.tp * plan.mapping.pp} x {plan.device.name}, {w.input_len}+{w.output_len} tokens",
        fontsize=10,
    )
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.stem + ".tmp.png")
    fig.savefig(tmp)
    plt.close(fig)
    tmp.replace(path)
    return path
