"""`trtllm-forge tune`: the best serving configuration under latency goals, pruned by a model, confirmed by measurement."""
