#!/usr/bin/env bash
# GPU smoke test: import -> build-engine -> render -> deploy -> verify -> bench on a small public model, then a
# pass/fail table. It needs an NVIDIA GPU and TensorRT-LLM 1.2.x, i.e. run it inside our image (docker/Dockerfile):
#
#   docker run --rm --gpus 1 -v /models:/models trtllm-forge:0.1.0-trtllm1.2.1 \
#       bash /opt/trtllm-forge/scripts/gpu_smoke.sh /models/Qwen2.5-0.5B-Instruct H100-SXM
#
# MODEL_DIR must already hold the Hugging Face checkpoint (nothing is downloaded). GPU is a name from
# trtllm_forge/data/hardware.json (default H100-SXM). Exit status: 0 when every step passed.
set -u -o pipefail

MODEL_DIR=${1:?usage: gpu_smoke.sh MODEL_DIR [GPU]}
GPU=${2:-H100-SXM}
WORK=${WORK:-$(mktemp -d /tmp/forge-gpu-smoke.XXXXXX)}
CONFIG="$WORK/gpu-smoke.yaml"

cat > "$CONFIG" <<YAML
name: gpu-smoke
model: {source: $MODEL_DIR, family: qwen2, dtype: float16}
engine: {backend: tensorrt-llm, max_batch_size: 4, max_input_len: 512, max_seq_len: 1024, max_num_tokens: 2048}
hardware: {gpu: $GPU}
triton: {http_port: 0, grpc_port: 0, metrics_port: 0}
bench:
  workloads: [{name: smoke, concurrency: [1, 4], num_requests: 16, input_len: 128, output_len: 32}]
YAML

STEPS=("import" "build-engine" "render" "deploy start" "verify" "bench" "deploy stop")
declare -A RESULT
failed=0
for step in "${STEPS[@]}"; do
    log="$WORK/${step// /-}.log"
    if [ "$failed" = 1 ] && [ "$step" != "deploy stop" ]; then
        RESULT[$step]="skipped"
        continue
    fi
    # shellcheck disable=SC2086  # "deploy start" is two words on purpose
    if trtllm-forge $step "$CONFIG" --workdir "$WORK/wd" >"$log" 2>&1; then
        RESULT[$step]="pass"
    else
        RESULT[$step]="FAIL (see $log)"
        failed=1
    fi
done

printf '\n%-14s %s\n' "step" "result"
printf '%-14s %s\n' "----" "------"
for step in "${STEPS[@]}"; do
    printf '%-14s %s\n' "$step" "${RESULT[$step]}"
done
printf '\nworkdir: %s\n' "$WORK/wd"
exit "$failed"
