#!/usr/bin/env bash
# Issue 17 in one device call: every CUDA path, then the speed comparison, then the MNIST
# default recipe's time to accuracy. Logs and JSON go under $OUT (the device tool brings them
# back even after a time-out), so each step writes as soon as it ends. On the device:
#   PYTHONPATH=src bash bench/gpu.sh [tests|speed|mnist] ...   (default: all three)
# Not yet run on a GPU: no session so far had one lent.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-runs/gpu}
PY=${PY:-python3}
mkdir -p "$OUT"
export PYTHONPATH=${PYTHONPATH:-src}

tests() {  # the gpu-marked selection (tests/test_gpu.py), with timings of the slowest
  "$PY" -m pytest -m gpu tests -q -p no:cacheprovider --durations 10 >"$OUT/pytest_gpu.txt" 2>&1
  echo "tests: rc $? (see pytest_gpu.txt)"
}
speed() {  # vitkit vs timm vs HF on the same card, bf16 and fp32 (TF32), eager and compiled;
  # one model per call, so a time-out keeps the models already measured
  local m
  for m in ${MODELS:-B/16 Ti/16 S/16 L/16}; do
    "$PY" bench/speed.py --device cuda --models "$m" --precisions bf16,fp32 \
      --modes eager,compiled --batch 256 --rounds 5 --tf32 --no-onnx \
      --out "$OUT/gpu_speed_${m//\//}" >>"$OUT/speed.log" 2>&1
    echo "speed $m: rc $? (gpu_speed_${m//\//}.json/.md)"
  done
}
mnist() {  # the README's main job on one GPU: seconds to the default recipe's accuracy
  /usr/bin/time -v "$PY" -m vitkit train --device cuda --no-progress --out-dir "$OUT/mnist" \
    >"$OUT/mnist.log" 2>&1
  echo "mnist: rc $? (mnist.log, mnist/report.json)"
}

nvidia-smi >"$OUT/nvidia-smi.txt" 2>&1 || true
steps=("$@")
[ ${#steps[@]} -gt 0 ] || steps=(tests speed mnist)
for s in "${steps[@]}"; do
  case "$s" in
    tests) tests ;;
    speed) speed ;;
    mnist) mnist ;;
    *) echo "gpu.sh: unknown step '$s' (tests, speed, mnist)" >&2; exit 2 ;;
  esac
done
