#!/usr/bin/env bash
# The CPU miniature of docs/paper.md: the five paper-finding studies, 3 seeds each, at sizes a
# 2-core machine finishes in a few hours. Each command reuses the runs it finds under its
# --out-dir, so this script resumes where it was stopped and can be run a study at a time:
#   bench/paper_cpu.sh [data-scale|selfsup|resolution|compute|inside|selfsup-budget|
#                       data-scale-budget|data-scale-shapes|data-scale-shapes-budget|
#                       data-scale-shapes-control] ...
# Two studies at a time, one thread each, is the fastest use of 2 cores (small models).
set -euo pipefail
cd "$(dirname "$0")/.."
VITKIT=${VITKIT:-.venv/bin/vitkit}
OUT=${OUT:-runs}
export OMP_WAIT_POLICY=${OMP_WAIT_POLICY:-PASSIVE}
COMMON=(--seeds 3 --threads 1 --no-progress)

# Three models of similar cost at 28 px: ViT (7x7 patches, 16 tokens), BiT ResNet-v2, hybrid.
DS_RESNET="bit_r26x1[layers=1,1,1,width_factor=0.125,root=small,label=BiT-ResNet]"
DS_HYBRID="r_vit_ti16[patch_size=1,resnet_layers=1,resnet_width_factor=0.125,width=64,depth=2,\
num_heads=4,mlp_dim=128,label=Hybrid]"
DS_MODELS="Ti/7[width=64,depth=4,num_heads=4,mlp_dim=128,label=ViT],$DS_RESNET,$DS_HYBRID"
RES_MODELS="Ti/7[width=32,depth=2,num_heads=2,mlp_dim=64,label=w32-d2],\
Ti/7[width=64,depth=4,num_heads=4,mlp_dim=128,label=w64-d4],\
Ti/7[width=64,depth=6,num_heads=4,mlp_dim=128,label=w64-d6],\
Ti/7[width=96,depth=6,num_heads=4,mlp_dim=192,label=w96-d6]"
COMPUTE_MODELS="Ti/7[width=32,depth=2,num_heads=2,mlp_dim=64,label=ViT-w32d2],\
Ti/7[width=64,depth=4,num_heads=4,mlp_dim=128,label=ViT-w64d4],\
Ti/7[width=128,depth=6,num_heads=4,mlp_dim=256,label=ViT-w128d6],\
bit_r26x1[layers=1,1,1,width_factor=0.0625,root=small,label=BiT-R111x0.0625],\
bit_r26x1[layers=1,1,1,width_factor=0.125,root=small,label=BiT-R111x0.125],\
bit_r26x1[layers=2,2,2,width_factor=0.25,root=small,label=BiT-R222x0.25],\
r_vit_ti16[patch_size=1,resnet_layers=1,resnet_width_factor=0.0625,width=32,depth=2,\
num_heads=2,mlp_dim=64,label=Hybrid-w32d2],\
r_vit_ti16[patch_size=1,resnet_layers=1,resnet_width_factor=0.125,width=64,depth=4,\
num_heads=4,mlp_dim=128,label=Hybrid-w64d4],\
r_vit_ti16[patch_size=1,resnet_layers=2,resnet_width_factor=0.25,width=128,depth=6,\
num_heads=4,mlp_dim=256,label=Hybrid-w128d6]"

data_scale() {
  "$VITKIT" study data-scale --data mnist --val-size 1000 --sizes 600,6000,59000 --epochs 6 \
    --min-steps 1000 --warmup-steps 100 --early-stop 3 --models "$DS_MODELS" "${COMMON[@]}" \
    --out-dir "$OUT/paper-data-scale-mnist"
}
# The harder, scalable set: shapes-hard at 32 px (12 relational classes), three orders of
# magnitude on the CPU; the same models but the ViT's 8x8 patches (16 tokens at 32 px).
# SIZES picks a part, so two processes can share the 2 cores (their runs do not overlap); the
# full command then reuses both parts' runs and writes the combined summary.
SHAPES_VIT="Ti/8[width=64,depth=4,num_heads=4,mlp_dim=128,label=ViT]"
SHAPES_MODELS="$SHAPES_VIT,$DS_RESNET,$DS_HYBRID"
data_scale_shapes() {
  "$VITKIT" study data-scale --data shapes-hard --val-size 2000 \
    --sizes "${SIZES:-1000,10000,100000}" --epochs 10 --min-steps 1500 --warmup-steps 100 --early-stop 3 --models "$SHAPES_MODELS" \
    "${COMMON[@]}" --out-dir "$OUT/paper-data-scale-shapes-hard"
}
# FACTOR (default 2) times the budget, seed 0: 10,000 images at FACTOR times the minimum steps
# (2x: 3,003 instead of 1,521) and 100,000 at FACTOR times the epochs (2x: 20). SIZES picks a
# size and MODELS the models ("vit", "resnet", "hybrid"; default all), so two processes can
# share the cores; SEEDS=N runs seeds 0..N-1 (default 1: seed 0).
data_scale_shapes_budget() {
  local models="" m factor=${FACTOR:-2}
  case "$factor" in
    2 | 4) ;;
    *) echo "paper_cpu.sh: FACTOR: '$factor' is not 2 or 4" >&2; exit 2 ;;
  esac
  for m in ${MODELS:-vit resnet hybrid}; do
    case "$m" in
      vit) models+=",$SHAPES_VIT" ;;
      resnet) models+=",$DS_RESNET" ;;
      hybrid) models+=",$DS_HYBRID" ;;
      *) echo "paper_cpu.sh: MODELS: unknown model '$m' (vit, resnet, hybrid)" >&2; exit 2 ;;
    esac
  done
  "$VITKIT" study data-scale --data shapes-hard --val-size 2000 --sizes "${SIZES:-10000,100000}" \
    --epochs $((10 * factor)) --min-steps $((1500 * factor)) --warmup-steps 100 --early-stop 3 \
    --models "${models#,}" --seeds "${SEEDS:-1}" --threads 1 --no-progress \
    --out-dir "$OUT/paper-data-scale-shapes-hard-${factor}x"
}
# A control for the largest size: a BiT ResNet with the ViT's parameter count (x0.25: 127k
# parameters, 4x the FLOPs of the FLOP-matched one), seed 0, the 1x budget. Does the ResNet
# fall behind at 100,000 images for lack of capacity?
data_scale_shapes_control() {
  "$VITKIT" study data-scale --data shapes-hard --val-size 2000 --sizes 100000 --epochs 10 \
    --min-steps 1500 --warmup-steps 100 --early-stop 3 --seeds 1 --threads 1 --no-progress \
    --models "bit_r26x1[layers=1,1,1,width_factor=0.25,root=small,label=BiT-ResNet-x0.25]" \
    --out-dir "$OUT/paper-data-scale-shapes-hard-control"
}
selfsup() {
  "$VITKIT" study selfsup --min-steps 1000 --epochs 4 --pretrain-epochs 5 \
    --models "Ti/7[width=64,depth=4,num_heads=4,mlp_dim=128,label=ViT-w64d4p7]" \
    "${COMMON[@]}" --out-dir "$OUT/paper-selfsup"
}
resolution() {
  "$VITKIT" study resolution --pretrain-epochs 3 --models "$RES_MODELS" "${COMMON[@]}" \
    --out-dir "$OUT/paper-resolution"
}
compute() {
  "$VITKIT" study compute --data mnist --train-size 30000 --epochs 2 --warmup-steps 50 \
    --models "$COMPUTE_MODELS" "${COMMON[@]}" --out-dir "$OUT/paper-compute"
}
# The budget checks: do the findings move when the budget doubles (or quadruples)? The MPP
# pre-training runs are copied from the selfsup study, so only the fine-tunes train.
selfsup_budget() {
  local factor
  for factor in 2 4; do
    local out="$OUT/paper-selfsup-${factor}x" fractions=0.01,0.1
    [ "$factor" = 4 ] && fractions=0.01
    if [ ! -d "$out/runs/mpp/pretrain" ] && [ -d "$OUT/paper-selfsup/runs/mpp/pretrain" ]; then
      mkdir -p "$out/runs/mpp" && cp -r "$OUT/paper-selfsup/runs/mpp/pretrain" "$out/runs/mpp/"
    fi
    "$VITKIT" study selfsup --min-steps $((1000 * factor)) --epochs 8 --pretrain-epochs 5 \
      --starts mpp --fractions "$fractions" \
      --models "Ti/7[width=64,depth=4,num_heads=4,mlp_dim=128,label=ViT-w64d4p7]" \
      "${COMMON[@]}" --out-dir "$out"
  done
}
data_scale_budget() {  # the largest size at twice the epochs, seed 0
  "$VITKIT" study data-scale --data mnist --val-size 1000 --sizes 59000 --epochs 12 \
    --min-steps 1000 --warmup-steps 100 --early-stop 3 --models "$DS_MODELS" --seeds 1 \
    --threads 1 --no-progress --out-dir "$OUT/paper-data-scale-mnist-2x"
}
inside() {
  "$VITKIT" study inside --epochs 25 --early-stop 4 --precision fp32 \
    --models 'Ti/8[width=64,depth=6,num_heads=4,mlp_dim=128,label=ViT-w64-d6-p8]' \
    --seeds 3 --threads 2 --no-progress --out-dir "$OUT/study-inside-cpu"
}

studies=("$@")
[ ${#studies[@]} -gt 0 ] ||
  studies=(data-scale selfsup resolution compute inside selfsup-budget data-scale-budget
    data-scale-shapes data-scale-shapes-budget data-scale-shapes-control)
for s in "${studies[@]}"; do
  case "$s" in
    data-scale) data_scale ;;
    selfsup) selfsup ;;
    resolution) resolution ;;
    compute) compute ;;
    inside) inside ;;
    selfsup-budget) selfsup_budget ;;
    data-scale-budget) data_scale_budget ;;
    data-scale-shapes) data_scale_shapes ;;
    data-scale-shapes-budget) data_scale_shapes_budget ;;
    data-scale-shapes-control) data_scale_shapes_control ;;
    *)
      echo "paper_cpu.sh: unknown study '$s' (data-scale, selfsup, resolution, compute," \
        "inside, selfsup-budget, data-scale-budget, data-scale-shapes," \
        "data-scale-shapes-budget, data-scale-shapes-control)" >&2
      exit 2
      ;;
  esac
done
