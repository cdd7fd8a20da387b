"""The studies' default models and full-size commands, which ``vitkit study``'s parser shows:
plain strings in a module that imports nothing, so that building the command line (``vitkit
--help``, ``predict --from OUT.pt2``) loads neither vitkit's models nor its checkpoints.
:mod:`vitkit.studies.data_scale` and :mod:`vitkit.studies.compute` use them."""

from __future__ import annotations

# ----- data-scale -----

DATA_SCALE_COMMANDS = (
    "vitkit study data-scale --data mnist --val-size 1000 --seeds 3 --epochs 30 --min-steps 4000 "
    "--warmup-steps 200 --early-stop 10 --device cuda --out-dir runs/data-scale-mnist",
    "vitkit study data-scale --data shapes-hard --val-size 5000 --seeds 3 --epochs 10 "
    "--min-steps 4000 --warmup-steps 200 --early-stop 5 --device cuda "
    "--out-dir runs/data-scale-shapes-hard",
)

# Three models of similar size and cost at 28-32 px (49-64 tokens): a ViT with 4x4 patches, a
# BiT ResNet-v2 with stages (1, 1, 1) at width x0.25 and the small 3x3 root, and a hybrid whose
# one-stage ResNet (4x downsampling) feeds 1x1 patches to the same ViT.
DATA_SCALE_MODELS = (
    "Ti/4[width=64,depth=6,num_heads=4,mlp_dim=128,label=ViT],"
    "bit_r26x1[layers=1,1,1,width_factor=0.25,root=small,label=BiT-ResNet],"
    "r_vit_ti16[patch_size=1,resnet_layers=1,resnet_width_factor=0.25,width=64,depth=6,"
    "num_heads=4,mlp_dim=128,label=Hybrid]"
)

# ----- compute -----

# Four sizes per family at 28-32 px, each family spanning ~10x in forward FLOPs; the same
# token count (64 at 32 px) for the ViTs and the hybrids.
COMPUTE_MODELS = (
    "Ti/4[width=32,depth=2,num_heads=2,mlp_dim=64,label=ViT-w32d2],"
    "Ti/4[width=64,depth=4,num_heads=4,mlp_dim=128,label=ViT-w64d4],"
    "Ti/4[width=96,depth=6,num_heads=4,mlp_dim=192,label=ViT-w96d6],"
    "Ti/4[width=128,depth=8,num_heads=4,mlp_dim=256,label=ViT-w128d8],"
    "bit_r26x1[layers=1,1,1,width_factor=0.125,root=small,label=BiT-R111x0.125],"
    "bit_r26x1[layers=1,1,1,width_factor=0.25,root=small,label=BiT-R111x0.25],"
    "bit_r26x1[layers=2,2,2,width_factor=0.25,root=small,label=BiT-R222x0.25],"
    "bit_r26x1[layers=2,2,2,width_factor=0.5,root=small,label=BiT-R222x0.5],"
    "r_vit_ti16[patch_size=1,resnet_layers=1,resnet_width_factor=0.125,width=32,depth=2,"
    "num_heads=2,mlp_dim=64,label=Hybrid-w32d2],"
    "r_vit_ti16[patch_size=1,resnet_layers=1,resnet_width_factor=0.25,width=64,depth=4,"
    "num_heads=4,mlp_dim=128,label=Hybrid-w64d4],"
    "r_vit_ti16[patch_size=1,resnet_layers=2,resnet_width_factor=0.25,width=96,depth=6,"
    "num_heads=4,mlp_dim=192,label=Hybrid-w96d6],"
    "r_vit_ti16[patch_size=1,resnet_layers=2,resnet_width_factor=0.5,width=128,depth=8,"
    "num_heads=4,mlp_dim=256,label=Hybrid-w128d8]"
)
COMPUTE_COMMAND = (
    "vitkit study compute --data shapes-hard --train-size 100000 --seeds 3 --epochs 10 "
    "--warmup-steps 200 --device cuda --out-dir runs/compute-shapes-hard"
)
