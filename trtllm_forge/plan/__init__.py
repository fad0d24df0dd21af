"""plan stage: does the model fit, how many sequences run at once, and the physical limit on its speed.

For other stages (bench reports results as a percentage of the roofline):

    from trtllm_forge.plan import Workload, make_plan
    plan = make_plan(config, Workload(input_len=128, output_len=64))
    plan.decode_tokens_per_s(batch=8)            # best-case output tokens/s (None without device numbers)
    plan.percent_of_roofline(measured_tokens_per_s, batch=8)

For `tune` (ranking serving configurations): `plan.serving_model.predict_serving(plan, concurrency=16)`.
"""

from trtllm_forge.plan.planner import Plan, Workload, make_plan

__all__ = ["Plan", "Workload", "make_plan"]
