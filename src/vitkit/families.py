"""The ViT family's named models: the paper's encoder with the switches later work flipped.

One table, :data:`FAMILIES`: a timm model name → the :class:`vitkit.config.ViTConfig` fields of
the same network (``vitkit.config.model_config`` resolves these names, ``vitkit models`` lists
them). Each row is timm's registered model at its default input size and head (so parameter
counts equal ``timm.create_model(name)``'s; ``tests/test_families.py`` checks every row), with
the numerics timm's weights were trained or converted with: exact GELU and LayerNorm eps 1e-6,
CLIP's eps 1e-5 and, where named, quick GELU.

- DeiT (Touvron et al., 2021): the paper's ViT; ``distilled``: a distillation token with its own
  head (``dist_token``).
- DeiT-III (Touvron et al., 2022): layer scale 1e-6, position embeddings for the patches only.
- DINOv2 (Oquab et al., 2023): patch 14 at 518 px, layer scale 1e-5, no head; the giant's MLP is
  SwiGLU; ``reg4`` adds four registers (Darcet et al., 2024) and drops E_pos's class row.
- CLIP image towers (Radford et al., 2021): LayerNorm before the encoder, no patch bias, eps
  1e-5; ``quickgelu``: x * sigmoid(1.702 x) (OpenAI's weights). The head is the projection.
- MAE encoders (He et al., 2022): the paper's ViT with exact GELU and no head.

This module imports nothing from vitkit (``config`` imports it).
"""

from __future__ import annotations

from typing import Any

# width, depth, heads of the sizes the family uses (the paper's Table 1 plus DeiT-III's medium)
_SIZES: dict[str, tuple[int, int, int]] = {
    "tiny": (192, 12, 3),
    "small": (384, 12, 6),
    "medium": (512, 12, 8),
    "base": (768, 12, 12),
    "large": (1024, 24, 16),
    "huge": (1280, 32, 16),
}
_TIMM = {"gelu": "none", "layer_norm_eps": 1e-6}  # PyTorch's exact GELU, timm's eps
_DEIT3 = {"layer_scale_init": 1e-6, "pos_embed_prefix": False}
_DINOV2 = {"layer_scale_init": 1e-5}
_REG4 = {"num_reg_tokens": 4, "pos_embed_prefix": False}
_CLIP = {"norm_pre": True, "patch_bias": False, "layer_norm_eps": 1e-5}


def _vit(size: str, patch: int, image: int, classes: int, **switches: Any) -> dict[str, Any]:
    width, depth, heads = _SIZES[size]
    return {
        "image_size": image,
        "patch_size": patch,
        "num_classes": classes,
        "width": width,
        "depth": depth,
        "num_heads": heads,
        "mlp_dim": 4 * width,
        **_TIMM,
        **switches,
    }


_GIANT = {"width": 1536, "depth": 40, "num_heads": 24, "mlp_dim": 8192, "mlp": "swiglu"}

# timm name → ViTConfig fields. The family (for `vitkit models`) is the key's first column.
FAMILIES: dict[str, dict[str, Any]] = {
    "deit_tiny_patch16_224": _vit("tiny", 16, 224, 1000),
    "deit_small_patch16_224": _vit("small", 16, 224, 1000),
    "deit_base_patch16_224": _vit("base", 16, 224, 1000),
    "deit_base_patch16_384": _vit("base", 16, 384, 1000),
    "deit_tiny_distilled_patch16_224": _vit("tiny", 16, 224, 1000, dist_token=True),
    "deit_small_distilled_patch16_224": _vit("small", 16, 224, 1000, dist_token=True),
    "deit_base_distilled_patch16_224": _vit("base", 16, 224, 1000, dist_token=True),
    "deit_base_distilled_patch16_384": _vit("base", 16, 384, 1000, dist_token=True),
    "deit3_small_patch16_224": _vit("small", 16, 224, 1000, **_DEIT3),
    "deit3_small_patch16_384": _vit("small", 16, 384, 1000, **_DEIT3),
    "deit3_medium_patch16_224": _vit("medium", 16, 224, 1000, **_DEIT3),
    "deit3_base_patch16_224": _vit("base", 16, 224, 1000, **_DEIT3),
    "deit3_base_patch16_384": _vit("base", 16, 384, 1000, **_DEIT3),
    "deit3_large_patch16_224": _vit("large", 16, 224, 1000, **_DEIT3),
    "deit3_large_patch16_384": _vit("large", 16, 384, 1000, **_DEIT3),
    "deit3_huge_patch14_224": _vit("huge", 14, 224, 1000, **_DEIT3),
    "vit_small_patch14_dinov2": _vit("small", 14, 518, 0, **_DINOV2),
    "vit_base_patch14_dinov2": _vit("base", 14, 518, 0, **_DINOV2),
    "vit_large_patch14_dinov2": _vit("large", 14, 518, 0, **_DINOV2),
    "vit_giant_patch14_dinov2": _vit("large", 14, 518, 0, **_DINOV2, **_GIANT),
    "vit_small_patch14_reg4_dinov2": _vit("small", 14, 518, 0, **_DINOV2, **_REG4),
    "vit_base_patch14_reg4_dinov2": _vit("base", 14, 518, 0, **_DINOV2, **_REG4),
    "vit_large_patch14_reg4_dinov2": _vit("large", 14, 518, 0, **_DINOV2, **_REG4),
    "vit_giant_patch14_reg4_dinov2": _vit("large", 14, 518, 0, **_DINOV2, **_REG4, **_GIANT),
    "vit_base_patch32_clip_224": _vit("base", 32, 224, 1000, **_CLIP),
    "vit_base_patch16_clip_224": _vit("base", 16, 224, 1000, **_CLIP),
    "vit_large_patch14_clip_224": _vit("large", 14, 224, 1000, **_CLIP),
    "vit_large_patch14_clip_336": _vit("large", 14, 336, 1000, **_CLIP),
    "vit_huge_patch14_clip_224": _vit("huge", 14, 224, 1000, **_CLIP),
    "vit_base_patch32_clip_quickgelu_224": _vit("base", 32, 224, 512, **_CLIP, gelu="quick"),
    "vit_base_patch16_clip_quickgelu_224": _vit("base", 16, 224, 512, **_CLIP, gelu="quick"),
    "vit_large_patch14_clip_quickgelu_224": _vit("large", 14, 224, 768, **_CLIP, gelu="quick"),
    "vit_base_patch16_224.mae": _vit("base", 16, 224, 0),
    "vit_large_patch16_224.mae": _vit("large", 16, 224, 0),
    "vit_huge_patch14_224.mae": _vit("huge", 14, 224, 0),
}


def family_of(name: str) -> str:
    """The family a :data:`FAMILIES` name belongs to: "DeiT", "DeiT-III", "DINOv2", "CLIP",
    "MAE"."""
    if name.startswith("deit3_"):
        return "DeiT-III"
    if name.startswith("deit_"):
        return "DeiT"
    if "dinov2" in name:
        return "DINOv2"
    if "_clip_" in name:
        return "CLIP"
    return "MAE"
