"""timm's AIMv2, BEiT-3 and post-norm ViTs ↔ vitkit's switches: explicit, pure functions.

What :mod:`vitkit.checkpoints.timm.vision_transformer` reads and writes for the later members of
timm's ``VisionTransformer`` (its ``vision_transformer.py`` entries):

- AIMv2 (``aimv2_*``): RMSNorm everywhere (``norm="rmsnorm"``: a norm with ``weight`` and no
  ``bias``), an RMSNorm on the patch embeddings (``patch_embed.norm``: ``patch_norm``), no
  biases in the attention projection and the MLP (``proj_bias=False``), and timm's unpacked
  ``SwiGLU``: ``mlp.fc1_g`` (the gate, through SiLU) and ``mlp.fc1_x``. vitkit's packed ``fc1``
  is the two stacked, gate first (its :class:`vitkit.models.block_parts.Mlp` computes
  SiLU(first half) x second half), exactly as ``SwiGLUPacked``; written back to an ``aimv2_*``
  entry it is split.
- BEiT-3 (``beit3_*``): sub-LayerNorms ``blocks.{i}.attn.norm`` (on the heads' output before the
  projection: ``scale_attn_norm``) and ``blocks.{i}.mlp.norm`` (on the hidden units after the
  activation: ``scale_mlp_norm``).
- ``vit_base_patch16_rpn_224``: timm's ``ResPostBlock`` (``block="post"``). Its weights have the
  same names as a pre-norm block's, so only the model name (or ``block_fn`` in the model args)
  tells; a bare state dict is read as the paper's pre-norm block.

The norms' epsilon is not in the weights: AIMv2's and BEiT-3's entries fix 1e-5, the others timm's
1e-6 (:func:`later_name_settings`).
"""

from __future__ import annotations

import re
from typing import Any

import torch
from torch import Tensor

from vitkit.errors import VitkitError
from vitkit.registry.model_config import ViTConfig

# heads of timm names whose width is not the paper's table's (AIMv2: heads of 128 channels)
NAME_HEADS: tuple[tuple[str, int], ...] = (
    (r"^aimv2_large_", 8),
    (r"^aimv2_huge_", 12),
    (r"^aimv2_1b_", 16),
    (r"^aimv2_3b_", 24),
    (r"^test_vit2?$", 2),  # timm's registered test models
    (r"^test_vit[34]$", 3),
)
_UNPACKED = re.compile(r"^(.*\.mlp)\.fc1_([gx])\.(weight|bias)$")


def pack_swiglu(sd: dict[str, Tensor], source: str) -> dict[str, Tensor]:
    """timm's unpacked ``SwiGLU`` (``mlp.fc1_g``, ``mlp.fc1_x``) → one ``mlp.fc1``, gate first;
    every other key unchanged (a state dict without them is returned as it is)."""
    if not any(_UNPACKED.match(k) for k in sd):
        return sd
    out, halves = {}, {}
    for k, v in sd.items():
        m = _UNPACKED.match(k)
        if m:
            halves[(m[1], m[3], m[2])] = v
        else:
            out[k] = v
    for prefix, kind in sorted({(p, kind) for p, kind, _ in halves}):
        gate, value = halves.get((prefix, kind, "g")), halves.get((prefix, kind, "x"))
        if gate is None or value is None or gate.shape != value.shape:
            raise VitkitError(f"{source}: {prefix}.fc1_g / fc1_x are not two equal SwiGLU halves")
        out[f"{prefix}.fc1.{kind}"] = torch.cat([gate, value], dim=0)
    return out


def unpack_swiglu(sd: dict[str, Tensor]) -> dict[str, Tensor]:
    """The inverse of :func:`pack_swiglu`: every ``blocks.{i}.mlp.fc1`` split into timm's
    ``fc1_g`` (first half) and ``fc1_x`` (second half)."""
    out = {}
    for k, v in sd.items():
        m = re.match(r"^(blocks\.\d+\.mlp)\.fc1\.(weight|bias)$", k)
        if m:
            gate, value = v.chunk(2, dim=0)
            out[f"{m[1]}.fc1_g.{m[2]}"] = gate.contiguous()
            out[f"{m[1]}.fc1_x.{m[2]}"] = value.contiguous()
        else:
            out[k] = v
    return out


def later_switches(sd: dict[str, Tensor]) -> dict[str, Any]:
    """The switches the weights show (``sd`` with SwiGLU already packed): RMSNorm (norms
    without biases), the patch-embedding norm, the projection / MLP biases, BEiT-3's
    sub-norms."""
    return {
        "norm": "rmsnorm" if _weight_only(sd, "blocks.0.norm1") else "layernorm",
        "patch_norm": "patch_embed.norm.weight" in sd,
        "proj_bias": "blocks.0.attn.proj.bias" in sd,
        "scale_attn_norm": "blocks.0.attn.norm.weight" in sd,
        "scale_mlp_norm": "blocks.0.mlp.norm.weight" in sd,
    }


def bare_eps(sd: dict[str, Tensor]) -> float:
    """The norms' epsilon a timm state dict alone implies: 1e-5 for weights only AIMv2's
    entries have (RMSNorms and a patch-embedding norm) or BEiT-3's (sub-norms), else 1e-6."""
    aimv2 = _weight_only(sd, "blocks.0.norm1") and "patch_embed.norm.weight" in sd
    beit3 = "blocks.0.attn.norm.weight" in sd or "blocks.0.mlp.norm.weight" in sd
    return 1e-5 if aimv2 or beit3 else 1e-6


def _weight_only(sd: dict[str, Tensor], name: str) -> bool:
    return f"{name}.weight" in sd and f"{name}.bias" not in sd


def later_name_settings(arch: str) -> dict[str, Any]:
    """What a timm name of these families fixes that its weights do not: the norms' epsilon
    (AIMv2, BEiT-3: 1e-5), the post-norm block (``_rpn_``), AIMv2's activation (SiLU)."""
    out: dict[str, Any] = {}
    if arch.startswith(("aimv2_", "beit3_")):
        out["layer_norm_eps"] = 1e-5
    if arch.startswith("aimv2_"):
        out["act_layer"] = "silu"
    if "_rpn_" in arch:
        out["block_fn"] = "ResPostBlock"
    if arch == "test_vit3":  # its MAP head pools the register too
        out["pool_include_prefix"] = True
    return out


def later_hub_changes(args: dict[str, Any]) -> dict[str, Any]:
    """Config changes from a timm folder's merged name settings and ``model_args``: the
    post-norm block (``block_fn``) and a ``norm_layer`` named by string (timm's eps 1e-6)."""
    out: dict[str, Any] = {}
    if args.get("block_fn") in ("ResPostBlock", "post"):
        out["block"] = "post"
    if isinstance(args.get("norm_layer"), str) and "layer_norm_eps" not in args:
        out["layer_norm_eps"] = 1e-6
    return out


def is_aimv2(cfg: ViTConfig) -> bool:
    """Whether timm's ``aimv2_*`` entry builds ``cfg`` (with :func:`later_model_args`): a
    SwiGLU model with AIMv2's RMSNorm (eps 1e-5); it is written with the unpacked SwiGLU."""
    return cfg.mlp == "swiglu" and cfg.norm == "rmsnorm" and cfg.layer_norm_eps == 1e-5


def later_architecture(cfg: ViTConfig) -> str | None:
    """The timm entry these switches need, or None for the plain ones."""
    if is_aimv2(cfg):
        return "aimv2_large_patch14_224"
    if cfg.block == "post":
        return "vit_base_patch16_rpn_224"
    if (cfg.scale_attn_norm or cfg.scale_mlp_norm) and cfg.layer_norm_eps == 1e-5:
        return "beit3_base_patch16_224"
    return None


def later_model_args(cfg: ViTConfig) -> dict[str, Any]:
    """timm ``create_model`` arguments for these switches (on top of
    :func:`vitkit.checkpoints.timm.vision_transformer.timm_model_args`; the entry of
    :func:`later_architecture` fixes what a string cannot, the norms' eps 1e-5)."""
    out: dict[str, Any] = {
        "proj_bias": cfg.proj_bias,
        "scale_attn_norm": cfg.scale_attn_norm,
        "scale_mlp_norm": cfg.scale_mlp_norm,
    }
    arch = later_architecture(cfg)
    fixed = arch is not None and arch.startswith(("aimv2_", "beit3_"))
    if not fixed and (cfg.norm == "rmsnorm" or cfg.later_switches):
        out["norm_layer"] = cfg.norm  # a string: timm's eps 1e-6, and says so to the reader
    if is_aimv2(cfg):  # timm's unpacked SwiGLU: mlp_ratio gives each half's width
        out["mlp_ratio"] = cfg.mlp_dim / 2 / cfg.width
    if cfg.patch_norm and not is_aimv2(cfg):  # (timm's create_model drops None arguments)
        out["embed_norm_layer"] = cfg.norm
    return out


def later_write_checks(cfg: ViTConfig) -> str | None:
    """Why timm cannot hold ``cfg``'s switches (None when it can)."""
    if cfg.norm == "rmsnorm" and cfg.layer_norm_eps not in (1e-5, 1e-6):
        return f"timm's RMSNorm has eps 1e-6 (AIMv2's entries 1e-5), not {cfg.layer_norm_eps:g}"
    if cfg.norm == "rmsnorm" and cfg.layer_norm_eps == 1e-5 and cfg.mlp != "swiglu":
        return "timm's RMSNorm with eps 1e-5 comes with AIMv2's SwiGLU only"
    if is_aimv2(cfg) and not cfg.patch_norm:
        return "timm's AIMv2 entries have a norm on the patch embeddings (patch_norm)"
    if cfg.block == "post" and (is_aimv2(cfg) or cfg.mlp == "swiglu"):
        return "timm's post-norm entry (vit_base_patch16_rpn_224) has a GELU MLP"
    return None
