"""What a bare timm state dict (no config, no name) implies beyond its shapes, and what it leaves
to assume.

A state dict says widths, depth, patch, which tokens and norms exist; it does not say the heads,
the norms' epsilon, the GELU, the block order or how a MAP head pools. timm's registered
ViTs (``vision_transformer.py``, ``deit.py``, ``vision_transformer_hybrid.py``, timm 1.0.31)
fall into layouts the keys do show, and within a layout they mostly agree: every CLIP tower
(``norm_pre``, no patch-embedding bias) has LayerNorm eps 1e-5, every AIMv2 (RMSNorm, patch
norm, SwiGLU) its own heads per width. Where every registered entry of the layout agrees,
the value is implied by the weights; where they disagree (a CLIP tower's GELU is exact or
quick; a SigLIP tower's exact or tanh; a GAP ViT-B has 12 or 16 heads; a no-class-token
``fc_norm`` layout may be the post-norm ``vit_base_patch16_rpn_224``), vitkit takes the
commoner value and says so (:class:`vitkit.checkpoints.provenance.Assumption`). Layouts only
timm eva.py's EVA-02, EVA, Perception Encoder or Sapiens2 have are read as that family by
:mod:`vitkit.checkpoints.timm.eva_bare`, the rotary embedding the weights do not show said;
the other eva.py layouts are refused.
``bench/coverage.py --mode bare`` checks every registered name against these rules.
"""

from __future__ import annotations

import re
from typing import Any

from torch import Tensor

from vitkit.checkpoints.provenance import Assumption, Provenance
from vitkit.errors import VitkitError
from vitkit.registry.model_config import ViTConfig

# Heads by width, per layout, as every registered timm entry of the layout has them.
PAPER_HEADS = {192: 3, 384: 6, 768: 12, 1024: 16, 1280: 16}  # Ti, S, B, L, H
OTHER_HEADS = {  # timm's sizes outside the paper's table (its test models' 64 and 96 left out:
    # a width of a toy model says nothing about its heads)
    256: 4,  # wee, xsmall
    320: 5,  # little
    512: 8,  # medium
    640: 10,  # betwixt
    832: 13,  # so150m2
    896: 14,  # so150m, base plus
    1152: 16,  # so400m
    1408: 16,  # giant
    1664: 16,  # gigantic
}
FAMILY_HEADS: dict[str, dict[int, int]] = {
    "CLIP": {256: 4, 512: 8, 640: 10, 768: 12, 896: 14, 1024: 16, 1280: 16, 1408: 16, 1664: 16},
    "SigLIP": {768: 12, 1024: 16, 1152: 16, 1536: 16},  # MAP head, and GAP towers
    "AIMv2": {1024: 8, 1536: 12, 2048: 16, 3072: 24},
    "BEiT-3": {768: 12, 1024: 16, 1408: 16},
    "layer scale": {1536: 24},  # DINOv2-g, TIPSv2-g (SwiGLU); RADIO-g
    "registers": {1536: 24},
}


def family(sd: dict[str, Tensor], cfg: ViTConfig) -> str:
    """The layout's family name as far as the keys show it ("" for the paper's layout)."""
    if cfg.norm == "rmsnorm" and cfg.patch_norm and cfg.mlp == "swiglu":
        return "AIMv2"
    if cfg.scale_attn_norm or cfg.scale_mlp_norm:
        return "BEiT-3"
    if cfg.parallel_scaling and cfg.norm == "rmsnorm":
        return "vit_*_xp_*"  # (norm_pre and no patch bias as CLIP, but RMSNorm: eps 1e-6)
    if cfg.norm_pre and not cfg.patch_bias:
        return "CLIP"
    if cfg.pool == "map":
        return "SigLIP"
    if cfg.layer_scale_init is not None:
        return "layer scale"
    if cfg.num_reg_tokens:
        return "registers"
    return ""


# Keys only timm's other ViT modules have: (pattern, what it is and what vitkit lacks)
_OTHER_KEYS: tuple[tuple[str, str], ...] = (  # (the first match names the architecture)
    (
        r"^embeds\.",
        "timm naflexvit.py's NaFlex embedding (packed variable-size patches), whose settings "
        "the keys do not show; a timm folder naming its entry is read",
    ),
    (
        r"\.attn\.[qv]_bias$|\.gamma_[12]$|\.attn\.[qkv]_proj\.",
        "timm eva.py's blocks (q / v biases, gamma_1 layer scale or split q / k / v: DINOv3, "
        "RoPE-ViT, LingBot, EVA-02 or EVA with registers or layer scale), whose "
        "rotary position embeddings the keys do not show; a timm folder whose config.json "
        "names the eva.py entry is read",
    ),
)


def refuse_other_keys(sd: dict[str, Tensor], source: str) -> None:
    """State dicts with keys only an architecture vitkit does not read bare has."""
    for pattern, what in _OTHER_KEYS:
        key = next((k for k in sd if re.search(pattern, k)), None)
        if key is not None:
            raise VitkitError(f"{source}: {key}: these weights are {what}")


def refuse_other_architectures(cfg: ViTConfig, source: str) -> None:
    """Layouts that only an architecture vitkit does not implement has."""
    if cfg.norm_pre and not cfg.patch_bias and (cfg.pool == "map" or not cfg.final_norm):
        which = "core (a MAP head)" if cfg.pool == "map" else "spatial (no final norm)"
        raise VitkitError(
            f"{source}: these weights have the layout of Meta's Perception Encoder {which}, "
            "timm's eva.py vit_pe_*, whose 2-D rotary position embeddings the weights do not "
            "show; a timm folder whose config.json names its vit_pe_* entry (or a "
            "vision_transformer architecture with this layout) is read"
        )


def _siglip_gap(fam: str, cfg: ViTConfig) -> bool:
    """SigLIP's GAP towers' layout, which timm's ``vit_*_gap_*`` share: no class token, the
    mean of the final-normalised tokens, no layer scale nor registers."""
    return not fam and not cfg.has_class_token and cfg.pool == "gap" and not cfg.fc_norm


def bare_heads(width: int, fam: str, cfg: ViTConfig, prov: Provenance, source: str) -> int:
    """The heads of a bare state dict of ``width``: the family's table, else timm's sizes;
    assumed (said) where registered entries of this layout differ; refused where no table has
    the width."""
    table = FAMILY_HEADS.get(fam, {})
    if _siglip_gap(fam, cfg) and width != 768:  # (at 768: vit_base_patch16_gap_224, below)
        table = FAMILY_HEADS["SigLIP"]
    if width in table:
        return heads_assumed(table[width], width, f"every timm {fam or 'ViT'}", prov)
    general = {**PAPER_HEADS, **OTHER_HEADS}
    if width not in general:
        raise VitkitError(
            f"{source}: width {width} is not a size timm registers, so the number of heads "
            "cannot be known from the weights; pass num_heads (--num-heads N)"
        )
    heads = general[width]
    if _siglip_gap(fam, cfg) and width == 768:
        prov.assume(
            Assumption(
                "num_heads",
                heads,
                "ViT-B's heads, as timm's SigLIP-GAP B towers have",
                "timm's vit_base_patch16_gap_224 has 16",
                16,
            )
        )
    else:
        heads_assumed(heads, width, "every timm ViT with this layout", prov)
    return heads


def heads_assumed(heads: int, width: int, which: str, prov: Provenance) -> int:
    """``heads`` from the tables, said: a state dict never records the heads (any divisor of
    the width fits the same weights)."""
    other = next((h for h in (2 * heads, heads // 2) if h and width % h == 0), heads)
    prov.assume(
        Assumption(
            "num_heads",
            heads,
            f"{which} of width {width} has {heads}; a state dict does not record the heads",
            f"a model trained with another count (any divisor of {width}) has the same weights",
            other,
        )
    )
    return heads


def complete(
    sd: dict[str, Tensor],
    cfg: ViTConfig,
    num_heads: int | None,
    source: str,
    bare: bool,
    grid_given: bool = False,
) -> tuple[ViTConfig, Provenance]:
    """``cfg`` as the shapes say it (any heads) completed: the heads (given, or from the
    tables), and for a ``bare`` state dict the family's numerics; with its provenance. A
    bare layout only another architecture has is refused."""
    prov = Provenance().set("weights", cfg.to_dict())
    if bare:
        refuse_other_architectures(cfg, source)
    fam = family(sd, cfg)
    qk_norm = sd.get("blocks.0.attn.q_norm.weight")
    if num_heads is not None:
        heads = num_heads
        prov.set("given", ["num_heads"])
    elif qk_norm is not None and qk_norm.ndim == 1 and cfg.width % qk_norm.shape[0] == 0:
        heads = cfg.width // qk_norm.shape[0]  # (qk_norm normalises each head: its width)
        prov.set("weights", ["num_heads"], "the width over qk_norm's (one head's) width")
    else:
        heads = bare_heads(cfg.width, fam, cfg, prov, source)
    changes = bare_numerics(sd, cfg, prov) if bare else {}
    if bare and not grid_given and (a := grid_assumption(cfg)) is not None:
        prov.assume(a)
    try:
        return cfg.replace(num_heads=heads, **changes), prov
    except VitkitError as e:
        raise VitkitError(f"{source}: {e}") from None


def bare_numerics(sd: dict[str, Tensor], cfg: ViTConfig, prov: Provenance) -> dict[str, Any]:
    """Epsilon, GELU, block order and pooling of a bare state dict: the changes to ``cfg`` and
    the assumptions, recorded in ``prov``."""
    fam = family(sd, cfg)
    changes: dict[str, Any] = {}
    eps = 1e-5 if fam == "CLIP" else cfg.layer_norm_eps
    if fam == "CLIP":
        changes["layer_norm_eps"] = eps
    which = "CLIP tower (norm_pre, no patch bias)" if fam == "CLIP" else fam or "ViT"
    prov.assume(eps_assumption(eps, f"every registered timm {which}"))
    siglip_gap = _siglip_gap(fam, cfg)
    if cfg.mlp == "swiglu":
        prov.set("weights", ["gelu"], "SwiGLU: SiLU, no GELU")
    elif fam == "CLIP":
        prov.assume(
            Assumption(
                "gelu",
                "none",
                "exact GELU: LAION, DFN and MetaCLIP towers",
                "OpenAI's CLIP towers (timm's *_clip_quickgelu_*) use quick GELU",
                "quick",
            )
        )
    elif fam == "SigLIP":
        changes["gelu"] = "tanh"
        prov.assume(
            Assumption(
                "gelu",
                "tanh",
                "a MAP head: SigLIP 2 and big_vision's tanh GELU",
                "timm's SigLIP 1 towers run the exact GELU",
                "none",
            )
        )
    elif siglip_gap:
        prov.assume(
            Assumption(
                "gelu",
                "none",
                "exact GELU: timm's GAP ViTs and SigLIP 1 GAP towers",
                "SigLIP 2 GAP towers use the tanh GELU",
                "tanh",
            )
        )
    else:
        prov.assume(gelu_assumption(f"every registered timm {fam or 'ViT'} of this layout"))
    post_possible = (
        not fam and not cfg.has_class_token and cfg.fc_norm and cfg.parallel == 1
    ) and not cfg.parallel_scaling
    if post_possible:
        prov.assume(
            Assumption(
                "block",
                "pre",
                "the paper's pre-norm block",
                "timm's vit_base_patch16_rpn_224, with the same keys, is post-norm",
                "post",
            )
        )
    elif cfg.parallel != 1 or cfg.parallel_scaling or fam in ("AIMv2", "BEiT-3"):
        prov.set("weights", ["block"], "pre-norm: the only block of this layout vitkit has")
    else:
        prov.assume(
            Assumption(
                "block",
                "pre",
                "the pre-norm block of every registered timm entry of this layout",
                "a model built with timm's ResPostBlock (post-norm) has the same keys",
                "post",
            )
        )
    if cfg.pool != "map" and not cfg.dist_token:  # (DeiT's distilled class pools its own way)
        prov.assume(pool_assumption(cfg))
    elif cfg.num_prefix_tokens > 0:
        prov.assume(
            Assumption(
                "pool",
                "map",
                "the MAP head attends to the patches only (timm's default)",
                "timm's pool_include_prefix=True (test_vit3) pools the prefix tokens too, "
                "which vitkit does not implement",
                None,
            )
        )
    return changes


def eps_assumption(eps: float, which: str) -> Assumption:
    """The norms' epsilon of a bare state dict: ``which`` entries' value, said."""
    return Assumption(
        "layer_norm_eps",
        eps,
        f"{which} has {eps:g}; a state dict does not record it",
        "a model built with a norm_layer of another eps has the same weights",
        1e-6 if eps == 1e-5 else 1e-5,
    )


def gelu_assumption(which: str) -> Assumption:
    """The exact GELU of a bare state dict, as ``which`` has it, said."""
    return Assumption(
        "gelu",
        "none",
        f"the exact GELU, as {which}",
        "a model built with act_layer='gelu_tanh' or 'quick_gelu' has the same weights",
        "quick",
    )


def pool_assumption(cfg: ViTConfig) -> Assumption:
    """The pooling of a state dict without a MAP head: its keys show whether there is a class
    token and an ``fc_norm``, not which of timm's global_pool read the tokens."""
    if cfg.pool == "token":
        return Assumption(
            "pool",
            "token",
            "timm's default, the class token: no fc_norm weights",
            "timm's global_pool='avg' / 'avgmax' / 'max' with fc_norm=False has the same keys",
            {"pool": "gap", "class_token": True},
        )
    other: dict[str, Any] = {"pool": "avgmax"}
    if cfg.has_class_token:
        other["class_token"] = True
    token = " or 'token' with fc_norm=True" if cfg.has_class_token and cfg.fc_norm else ""
    return Assumption(
        "pool",
        cfg.pool,
        "the mean of the patch tokens (timm's global_pool='avg')",
        f"timm's global_pool='avgmax' / 'max'{token} has the same keys",
        other,
    )


def grid_assumption(cfg: ViTConfig) -> Assumption | None:
    """The patch grid read from the number of position rows, where other grids (or the prefix
    tokens with or without rows of their own) fit the same count: said, with the override."""
    if cfg.resnet_layers is not None:  # (a hybrid's grid is its backbone's)
        return None
    gh, gw = cfg.grid_size
    rows = gh * gw + cfg.num_pos_prefix
    prefix = cfg.num_prefix_tokens
    counts = [rows - prefix, rows] if prefix and rows > prefix else [rows]
    grids = [(h, n // h) for n in counts for h in range(1, n + 1) if n % h == 0]
    others = [g for g in grids if g != (gh, gw)]
    if not others:
        return None
    others.sort(key=lambda g: -min(g) / max(g))  # the squarest first
    shown = ", ".join(f"{h}x{w}" for h, w in others[:4]) + (" ..." if len(others) > 4 else "")
    why = f"a square {gh}x{gw} patch grid"
    if prefix:
        which = "with" if cfg.pos_embed_prefix else "without"
        why += f", {which} position rows for the {prefix} prefix token(s)"
    pick = next((g for g in others if g[0] != g[1]), others[0])
    return Assumption(
        "image_size",
        tuple(cfg.image_size),
        f"{why}; a state dict does not record the input size",
        f"its {rows} position rows also fit the grids {shown}; say the grid",
        {"grid": pick},
    )
