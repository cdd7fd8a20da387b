"""The official initialisation of a ViT (vit_jax ``models_vit.py`` and flax's defaults).

LeCun-normal patch embedding, Xavier-uniform dense kernels (q, k and v each as its own D x D
kernel), near-zero MLP biases, zero class token and head; the family's parts as their authors
initialise them (DeiT's distillation token, timm's registers, big_vision's MAP head).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any, cast

import torch
from torch import Tensor, nn

from vitkit.models.hybrid_stem import init_resnet


def _lecun_normal_(w: Tensor, fan_in: int) -> None:
    """flax's ``lecun_normal``: truncated normal (±2σ) with variance 1/fan_in."""
    std = math.sqrt(1.0 / fan_in) / 0.87962566103423978  # std of N(0,1) truncated to [-2, 2]
    nn.init.trunc_normal_(w, std=std, a=-2 * std, b=2 * std)


@torch.no_grad()
def init_weights(model: Any, is_plain_block: Callable[[nn.Module], bool]) -> None:
    """The official initialisation (vit_jax ``models_vit.py`` and flax defaults) of a
    :class:`vitkit.models.vit.VisionTransformer`; ``is_plain_block``: the blocks of Eq. 2-3 (the
    others, vitkit.models.parallel_blocks, initialise themselves)."""
    cfg = model.cfg
    conv = model.patch_embed.proj
    _lecun_normal_(conv.weight, fan_in=conv.in_channels * conv.kernel_size[0] * conv.kernel_size[1])
    if conv.bias is not None:
        nn.init.zeros_(conv.bias)
    if model.patch_embed.stem is not None:
        init_resnet(model.patch_embed.stem)
    if model.pos_embed is not None:
        nn.init.normal_(model.pos_embed, std=0.02)
    if model.cls_token is not None:
        nn.init.zeros_(model.cls_token)
    if model.dist_token is not None:
        nn.init.normal_(model.dist_token, std=0.02)  # DeiT's init
    if model.reg_token is not None:
        nn.init.normal_(model.reg_token, std=1e-6)  # timm's register init
    for block in model.blocks:
        if not is_plain_block(block):  # parallel blocks initialise themselves
            continue
        d = cfg.width
        for i in range(3):  # q, k and v are separate D x D kernels in the official code
            nn.init.xavier_uniform_(block.attn.qkv.weight[i * d : (i + 1) * d])
        if block.attn.qkv.bias is not None:
            nn.init.zeros_(block.attn.qkv.bias)
        nn.init.xavier_uniform_(block.attn.proj.weight)
        if block.attn.proj.bias is not None:  # none with proj_bias=False (AIMv2)
            nn.init.zeros_(block.attn.proj.bias)
        for fc in (block.mlp.fc1, block.mlp.fc2):
            nn.init.xavier_uniform_(fc.weight)
            if fc.bias is not None:
                nn.init.normal_(fc.bias, std=1e-6)
    for norm in model.modules():  # every LayerNorm / RMSNorm: unit scale, zero bias
        if isinstance(norm, (nn.LayerNorm, nn.RMSNorm)) and norm.weight is not None:
            nn.init.ones_(norm.weight)
        if isinstance(norm, nn.LayerNorm) and norm.bias is not None:
            nn.init.zeros_(norm.bias)
    if model.attn_pool is not None:  # xavier kernels (big_vision's MAPHead), probe as timm's
        pool = model.attn_pool
        nn.init.normal_(pool.latent, std=cfg.width**-0.5)
        for dense in (pool.q, pool.kv, pool.proj, pool.mlp.fc1, pool.mlp.fc2):
            nn.init.xavier_uniform_(dense.weight)
            nn.init.zeros_(dense.bias)
    if cfg.representation_size:
        dense = cast(nn.Linear, cast(nn.Sequential, model.pre_logits)[0])
        _lecun_normal_(dense.weight, fan_in=cfg.width)
        nn.init.zeros_(dense.bias)
    for head in (model.head, model.head_dist):
        if head is not None:
            nn.init.zeros_(head.weight)
            nn.init.zeros_(head.bias)
