"""Measured throughput next to the physical limit `plan` computes for the same model, hardware and workload."""

from __future__ import annotations

from rich.table import Table

from trtllm_forge.config.schema import ForgeConfig


def roofline_rows(config: ForgeConfig, documents: list[dict]) -> list[dict]:
    """One row per closed-loop sweep point: measured output tokens/s and its share of the roofline limit
    at a batch size equal to the achieved concurrency (rounded, at least 1)."""
    from trtllm_forge.bench.options import mean_lengths
    from trtllm_forge.plan.planner import Workload, make_plan

    rows = []
    for workload, document in zip(config.bench.workloads, documents, strict=False):
        plan = make_plan(config, Workload(*mean_lengths(workload)))
        for point in document.get("points") or [document]:
            metrics = point.get("metrics", {})
            measured = (metrics.get("output_token_throughput_per_s") or {}).get("avg")
            achieved = (metrics.get("achieved_concurrency") or {}).get("avg")
            if measured is None or (point.get("load") or {}).get("mode") != "concurrency":
                continue
            batch = max(1, round(achieved or point["load"]["value"]))
            rows.append(
                {
                    "workload": workload.name,
                    "concurrency": point["load"]["value"],
                    "batch": batch,
                    "output_tokens_per_s": measured,
                    "roofline_tokens_per_s": plan.decode_tokens_per_s(batch),
                    "percent_of_roofline": plan.percent_of_roofline(measured, batch),
                    "hardware": plan.device.name if getattr(plan, "device", None) else config.hardware.gpu,
                }
            )
    return rows


def roofline_table(rows: list[dict]) -> Table:
    table = Table(title="throughput against the physical limit (trtllm-forge plan's decode roofline)", title_justify="left")
    for column in ("workload", "concurrency", "measured tok/s", "limit tok/s", "% of limit"):
        table.add_column(column, justify="left" if column == "workload" else "right")
    for row in rows:
        limit = row["roofline_tokens_per_s"]
        percent = row["percent_of_roofline"]
        table.add_row(
            row["workload"],
            str(row["concurrency"]),
            f"{row['output_tokens_per_s']:.1f}",
            f"{limit:.1f}" if limit else "-",
            f"{percent:.0f}%" if percent is not None else "-",
        )
    return table
