"""The ViT family's named models: the paper's encoder with the switches later work flipped.

One table, :data:`FAMILIES`: a timm model name → the :class:`vitkit.registry.model_config.ViTConfig`
fields of the same network (``vitkit.registry.model_config.model_config`` resolves these names,
``vitkit models`` lists them). Each row is timm's registered model at its default input size and
head (so parameter counts equal ``timm.create_model(name)``'s; ``tests/test_families.py`` checks
every row), with the numerics timm's weights were trained or converted with: exact GELU and
LayerNorm eps 1e-6, CLIP's eps 1e-5 and, where named, quick GELU.

- DeiT (Touvron et al., 2021): the paper's ViT; ``distilled``: a distillation token with its own
  head (``dist_token``).
- DeiT-III (Touvron et al., 2022): layer scale 1e-6, position embeddings for the patches only.
- DINOv2 (Oquab et al., 2023): patch 14 at 518 px, layer scale 1e-5, no head; the giant's MLP is
  SwiGLU; ``reg4`` adds four registers (Darcet et al., 2024) and drops E_pos's class row.
- CLIP image towers (Radford et al., 2021): LayerNorm before the encoder, no patch bias, eps
  1e-5; ``quickgelu``: x * sigmoid(1.702 x) (OpenAI's weights). The head is the projection.
- MAE encoders (He et al., 2022): the paper's ViT with exact GELU and no head.
- DINOv3 (Siméoni et al., 2025; timm eva.py): no E_pos but rotary embeddings on centred
  coordinates in [-1, 1] (``rope="dinov3"``, period 100, rotate_half pairing), 4 storage
  tokens, layer scale 1e-5, LayerNorm eps 1e-5, no head, 256 px; timm pools by the patch mean
  (upstream DINOv3 by the class token: ``-o pool=token``); S+ and H+ have a SwiGLU MLP, 7B
  too; ``_qkvb``: q and v biases (the key's is 0). LingBot (timm eva.py) is DINOv3's network
  with class-token pooling at 512 px.
- RoPE-ViT (Heo et al., 2024; timm eva.py): DeiT-III's recipe with 2-D rotary embeddings
  (``rope="axial"``, base 100, x before y) instead of E_pos, or ``mixed`` with learned
  per-block frequencies (base 10); ``_ape``: E_pos on the patches as well. timm's SBB RoPE ViTs
  (``*_rope_reg*_gap_256``): axial RoPE rescaled to a 16 x 16 grid, registers, mean pool.
- EVA-02 (Fang et al., 2023; timm eva.py): axial RoPE (base 10^4, interleaved pairs, rescaled to
  a 16 x 16 grid) beside E_pos, SwiGLU (B / L with its sub-LayerNorm), q / v biases; the MIM /
  ImageNet towers pool the mean patch with ``fc_norm``, the CLIP towers add the attention
  sub-norm; the enormous CLIP tower is post-norm without RoPE. EVA-1 giants (Fang et al., 2022):
  E_pos and q / v biases.
- Perception Encoder (Bolya et al., 2025; timm eva.py): axial RoPE in (x, y) order from 1 on the
  entry's own grid, LayerNorm before the encoder, no patch bias, eps 1e-5; core: the
  attention-pool head (8 heads, over every token); lang / spatial: no final norm.
- Sapiens2 (Khirodkar et al., 2026; timm eva.py): DINOv3's RoPE, RMSNorm, q / k norm, 8
  registers, layer scale on the attention branch only, grouped-query attention (half the key /
  value heads) in all but the first and last 8 blocks.

This module imports nothing from vitkit (``config`` imports it).
"""

from __future__ import annotations

import re
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


# DINOv3: rotary embeddings (vitkit.models.rope "dinov3") and storage tokens instead of E_pos
_DINOV3 = {
    "rope": "dinov3",
    "rope_theta": 100.0,
    "rope_half": True,
    "abs_pos_embed": False,
    "num_reg_tokens": 4,
    "class_token": True,
    "layer_scale_init": 1e-5,
    "layer_norm_eps": 1e-5,
}
_QKVB: dict[str, Any] = {"k_bias": False}  # q and v biases, the key's 0 (timm attn_type="eva")
_NO_QKV_BIAS: dict[str, Any] = {"qkv_bias": False}
_PLUS: dict[str, Any] = {"mlp": "swiglu", "mlp_dim": 8 * 384}  # S+: SwiGLU 2 x 1536 (packed as fc1)


def _dinov3(size: str, pool: str = "gap", image: int = 256, **switches: Any) -> dict[str, Any]:
    return _vit(size, 16, image, 0, **_DINOV3, pool=pool, **switches)


_ROPE = {"class_token": True, "layer_scale_init": 1e-5, "rope_xy": True, "abs_pos_embed": False}
_AXIAL = {**_ROPE, "rope": "axial", "rope_theta": 100.0}
_MIXED = {**_ROPE, "rope": "mixed", "rope_theta": 10.0}
_APE = {"abs_pos_embed": True, "pos_embed_prefix": False}  # + E_pos on the patches only
_SBB = {  # timm's SBB RoPE ViTs: axial RoPE on a 16 x 16 reference grid, registers, mean pool
    "rope": "axial",
    "rope_theta": 10000.0,
    "rope_ref_grid": (16, 16),
    "abs_pos_embed": False,
    "pool": "gap",
    "class_token": False,
    "fc_norm": True,
    "layer_scale_init": 1e-5,
    "k_bias": False,
}
_BETWIXT = {"width": 640, "num_heads": 10, "mlp_dim": 2560}

# the eva.py rows (checkpoints/timm/eva.py reads the same entries' weights)
_EVA: dict[str, dict[str, Any]] = {
    "vit_small_patch16_dinov3": _dinov3("small", **_NO_QKV_BIAS),
    "vit_small_patch16_dinov3_qkvb": _dinov3("small", **_QKVB),
    "vit_small_plus_patch16_dinov3": _dinov3("small", **_PLUS, **_NO_QKV_BIAS),
    "vit_small_plus_patch16_dinov3_qkvb": _dinov3("small", **_PLUS, **_QKVB),
    "vit_base_patch16_dinov3": _dinov3("base", **_NO_QKV_BIAS),
    "vit_base_patch16_dinov3_qkvb": _dinov3("base", **_QKVB),
    "vit_large_patch16_dinov3": _dinov3("large", **_NO_QKV_BIAS),
    "vit_large_patch16_dinov3_qkvb": _dinov3("large", **_QKVB),
    "vit_huge_plus_patch16_dinov3": _dinov3(
        "huge", mlp="swiglu", mlp_dim=8 * 1280, num_heads=20, **_NO_QKV_BIAS
    ),
    "vit_huge_plus_patch16_dinov3_qkvb": _dinov3(
        "huge", mlp="swiglu", mlp_dim=8 * 1280, num_heads=20, **_QKVB
    ),
    "vit_7b_patch16_dinov3": _dinov3(
        "huge", width=4096, depth=40, num_heads=32, mlp="swiglu", mlp_dim=4 * 4096, **_NO_QKV_BIAS
    ),
    "vit_tiny_patch16_dinov3_qkvb": _dinov3("tiny", **_QKVB),
    "vit_small_patch16_lingbot": _dinov3("small", "token", 512, **_QKVB),
    "vit_base_patch16_lingbot": _dinov3("base", "token", 512, **_QKVB),
    "vit_large_patch16_lingbot": _dinov3("large", "token", 512, **_QKVB),
    "vit_giant_patch16_lingbot": _dinov3("large", "token", 512, **_GIANT, **_NO_QKV_BIAS),
    **{
        f"vit_{size}_patch16_rope{kind}{ape}_224": _vit(size, 16, 224, 1000, **{**rope, **extra})
        for size in ("small", "base", "large")
        for kind, rope in (("", _AXIAL), ("_mixed", _MIXED))
        for ape, extra in (("", {}), ("_ape", _APE))
    },
    "vit_medium_patch16_rope_reg1_gap_256": _vit("medium", 16, 256, 1000, **_SBB, num_reg_tokens=1),
    "vit_mediumd_patch16_rope_reg1_gap_256": _vit(
        "medium",
        16,
        256,
        1000,
        **{**_SBB, **_NO_QKV_BIAS, "k_bias": True},
        num_reg_tokens=1,
        depth=20,
    ),
    "vit_betwixt_patch16_rope_reg4_gap_256": _vit(
        "medium", 16, 256, 1000, **_SBB, num_reg_tokens=4, **_BETWIXT
    ),
    "vit_base_patch16_rope_reg1_gap_256": _vit("base", 16, 256, 1000, **_SBB, num_reg_tokens=1),
}
FAMILIES.update(_EVA)

# EVA-02 / EVA-1 giants / Perception Encoder / Sapiens2 (the rest of timm eva.py)
_EVA02 = {
    "mlp": "swiglu",
    "k_bias": False,  # q and v biases
    "class_token": True,
    "rope": "axial",
    "rope_theta": 10000.0,
    "rope_ref_grid": (16, 16),
}
_EVA02_IN = {**_EVA02, "pool": "gap", "fc_norm": True}  # MIM / ImageNet towers
_EVA02_CLIP = {**_EVA02, "scale_attn_norm": True, "scale_mlp_norm": True}
_EVA02_MLP = {"tiny": 1024, "small": 2048, "base": 4096, "large": 5460}  # 2 x SwiGLU hidden
_EVA_GIANT = {"width": 1408, "depth": 40, "num_heads": 16, "mlp_dim": 6144, "k_bias": False}
_PE = {
    "layer_norm_eps": 1e-5,
    "norm_pre": True,
    "patch_bias": False,
    "class_token": True,
    "rope": "axial",
    "rope_theta": 10000.0,
    "rope_xy": True,
    "rope_offset": 1.0,
}
_PE_G = {"width": 1536, "depth": 50, "num_heads": 16, "mlp_dim": 8960, "class_token": False}
_PE_G_ROPE = {"rope_offset": 0.0}  # no class token: the grid counts from 0
_PE_CORE = {"pool": "map", "map_heads": 8, "map_prefix": True}
_PE_FEATURES = {"pool": "gap", "final_norm": False}  # lang / spatial: the tokens, no final norm


def _eva02(size: str, image: int, classes: int, clip: bool = False, **more: Any) -> dict:
    sub = {"scale_mlp_norm": True} if size in ("base", "large") and not clip else {}
    switches = {**(_EVA02_CLIP if clip else _EVA02_IN), **sub, "mlp_dim": _EVA02_MLP[size]}
    return _vit(size, 16 if clip and size == "base" else 14, image, classes, **switches, **more)


def _pe(size: str, patch: int, image: int, classes: int, **switches: Any) -> dict[str, Any]:
    grid = (image // patch, image // patch)
    return _vit(size, patch, image, classes, **{**_PE, "rope_ref_grid": grid, **switches})


def _gqa(depth: int, heads: int) -> tuple[int, ...]:
    """Sapiens2's key / value heads per block: all in the first and last 8, half between."""
    return (heads,) * 8 + (heads // 2,) * (depth - 16) + (heads,) * 8


_SAPIENS2 = {
    "image_size": (1024, 768),
    "class_token": True,
    "num_reg_tokens": 8,
    "layer_scale_init": 1e-5,
    "layer_scale_mlp": False,
    "mlp": "swiglu",
    "qk_norm": True,
    "norm": "rmsnorm",
    "abs_pos_embed": False,
    "rope": "dinov3",
    "rope_half": True,
}


def _sapiens2(size: str, width: int, depth: int, heads: int) -> dict[str, Any]:
    gqa = {"kv_heads": _gqa(depth, heads)} if size != "base" else {}
    shape = {"width": width, "depth": depth, "num_heads": heads, "mlp_dim": 8 * width}
    return _vit("base", 16, 1024, 0, **{**_SAPIENS2, **shape, **gqa})


FAMILIES.update(
    {
        **{
            f"eva02_{size}_patch14_{image}": _eva02(size, image, 0 if image == 224 else 1000)
            for size, images in (
                ("tiny", (224, 336)),
                ("small", (224, 336)),
                ("base", (224, 448)),
                ("large", (224, 448)),
            )
            for image in images
        },
        "eva02_base_patch16_clip_224": _eva02("base", 224, 512, clip=True),
        "eva02_large_patch14_clip_224": _eva02("large", 224, 768, clip=True),
        "eva02_large_patch14_clip_336": _eva02("large", 336, 768, clip=True),
        "eva02_enormous_patch14_clip_224": _vit(
            "huge",
            14,
            224,
            1024,
            width=1792,
            depth=64,
            num_heads=16,
            mlp_dim=15360,
            block="post",
            k_bias=False,
            class_token=True,
        ),
        **{
            f"eva_giant_patch14_{image}": _vit(
                "huge", 14, image, 1000, **_EVA_GIANT, pool="gap", fc_norm=True, class_token=True
            )
            for image in (224, 336, 560)
        },
        "eva_giant_patch14_clip_224": _vit("huge", 14, 224, 1024, **_EVA_GIANT, class_token=True),
        "vit_pe_core_tiny_patch16_384": _pe("tiny", 16, 384, 512, **_PE_CORE),
        "vit_pe_core_small_patch16_384": _pe("small", 16, 384, 512, **_PE_CORE),
        "vit_pe_core_base_patch16_224": _pe("base", 16, 224, 1024, **_PE_CORE),
        "vit_pe_core_large_patch14_336": _pe("large", 14, 336, 1024, **_PE_CORE),
        "vit_pe_core_gigantic_patch14_448": _pe(
            "huge", 14, 448, 1280, **_PE_G, **_PE_G_ROPE, pool="map", map_heads=8, map_mlp_dim=6144
        ),
        "vit_pe_lang_large_patch14_448": _pe(
            "large", 14, 448, 0, **_PE_FEATURES, depth=23, layer_scale_init=1e-5
        ),
        "vit_pe_lang_gigantic_patch14_448": _pe(
            "huge",
            14,
            448,
            0,
            **_PE_FEATURES,
            **{**_PE_G, "depth": 47},
            **_PE_G_ROPE,
            layer_scale_init=1e-5,
        ),
        **{
            f"vit_pe_spatial_{size}_patch16_512": _pe(size, 16, 512, 0, **_PE_FEATURES)
            for size in ("tiny", "small", "base")
        },
        "vit_pe_spatial_large_patch14_448": _pe("large", 14, 448, 0, **_PE_FEATURES),
        "vit_pe_spatial_gigantic_patch14_448": _pe(
            "huge", 14, 448, 0, **_PE_FEATURES, **_PE_G, **_PE_G_ROPE, layer_scale_init=1e-5
        ),
        "vit_base_patch16_sapiens2": _sapiens2("base", 768, 12, 12),
        "vit_large_patch16_sapiens2": _sapiens2("large", 1024, 24, 16),
        "vit_huge_patch16_sapiens2": _sapiens2("huge", 1280, 32, 16),
        "vit_giant_patch16_sapiens2": _sapiens2("giant", 1536, 40, 24),
        "vit_5b_patch16_sapiens2": _sapiens2("5b", 2432, 56, 32),
    }
)


def timm_vit(name: str) -> dict[str, Any] | None:
    """timm's plain ViT names (``vit_base_patch16_224``, ``vit_small_patch32_384``; a
    ``.pretrained_tag`` ignored): the paper's ViT at that size, patch and input, with timm's
    numerics and 1,000 classes; None for any other name."""
    found = re.fullmatch(
        r"vit_(tiny|small|medium|base|large|huge)_patch(\d+)_(\d+)", name.split(".")[0]
    )
    if found is None:
        return None
    return _vit(found[1], int(found[2]), int(found[3]), 1000)


def family_of(name: str) -> str:
    """The family a :data:`FAMILIES` name belongs to: "DeiT", "DeiT-III", "DINOv2", "CLIP",
    "MAE", "DINOv3", "LingBot", "RoPE-ViT", "EVA-02", "EVA", "PE", "Sapiens2"."""
    if name.endswith(("_dinov3", "_dinov3_qkvb")):
        return "DINOv3"
    if name.endswith("_lingbot"):
        return "LingBot"
    if name.startswith("eva02_"):
        return "EVA-02"
    if name.startswith("eva_"):
        return "EVA"
    if name.startswith("vit_pe_"):
        return "PE"
    if name.endswith("_sapiens2"):
        return "Sapiens2"
    if "_rope" in name:
        return "RoPE-ViT"
    if name.startswith("deit3_"):
        return "DeiT-III"
    if name.startswith("deit_"):
        return "DeiT"
    if "dinov2" in name:
        return "DINOv2"
    if "_clip_" in name:
        return "CLIP"
    return "MAE"
