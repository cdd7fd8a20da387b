"""The timm architecture names vitkit reads, and those it refuses with the reason (timm 1.0.31).

A timm folder's ``config.json`` names its ``architecture``. vitkit computes exactly the
entries of timm's ``vision_transformer.py``, ``deit.py`` and ``vision_transformer_hybrid.py``
(:data:`VIT_NAMES`, less the few :mod:`vitkit.checkpoints.timm.vision_transformer` refuses by their
layout), the entries of timm's ``eva.py`` in :data:`EVA_NAMES` (:mod:`vitkit.checkpoints.timm.eva`),
and those of ``beit.py`` and ``vision_transformer_relpos.py`` (:data:`RELPOS_MODULES`,
:mod:`vitkit.checkpoints.timm.beit_relpos`) and of ``naflexvit.py`` (:data:`NAFLEX_NAMES`,
:mod:`vitkit.checkpoints.timm.naflexvit`); the entries of timm's other ViT modules
(:data:`OTHER_MODULES`; since every eva.py entry is read, it holds none) compute something vitkit
does not, so a folder naming one would be refused with what is missing, never read as the nearest
ViT. A name in neither table (a later timm's, a user's own) is refused too.
``tests/test_timm_names.py`` checks both tables against the installed timm.
"""

from __future__ import annotations

from vitkit.checkpoints.timm.eva import check_eva_architecture, family_of
from vitkit.errors import VitkitError

TIMM_VERSION = "1.0.31"

VIT_NAMES: frozenset[str] = (
    frozenset(
        """
    aimv2_1b_patch14_224 aimv2_1b_patch14_336 aimv2_1b_patch14_448 aimv2_3b_patch14_224
    aimv2_3b_patch14_336 aimv2_3b_patch14_448 aimv2_huge_patch14_224 aimv2_huge_patch14_336
    aimv2_huge_patch14_448 aimv2_large_patch14_224 aimv2_large_patch14_336
    aimv2_large_patch14_448 beit3_base_patch16_224 beit3_giant_patch14_224
    beit3_giant_patch14_336 beit3_large_patch16_224 eva_large_patch14_196
    eva_large_patch14_336 flexivit_base flexivit_large flexivit_small test_vit test_vit2
    test_vit3 test_vit4 vit_base_patch14_dinov2 vit_base_patch14_reg1_tipsv2
    vit_base_patch14_reg4_dinov2 vit_base_patch16_18x2_224 vit_base_patch16_224
    vit_base_patch16_224_miil vit_base_patch16_384 vit_base_patch16_clip_224
    vit_base_patch16_clip_384 vit_base_patch16_clip_quickgelu_224 vit_base_patch16_gap_224
    vit_base_patch16_plus_240 vit_base_patch16_plus_clip_240 vit_base_patch16_radio_v3
    vit_base_patch16_reg4_gap_256 vit_base_patch16_rpn_224 vit_base_patch16_siglip_224
    vit_base_patch16_siglip_256 vit_base_patch16_siglip_384 vit_base_patch16_siglip_512
    vit_base_patch16_siglip_gap_224 vit_base_patch16_siglip_gap_256
    vit_base_patch16_siglip_gap_384 vit_base_patch16_siglip_gap_512 vit_base_patch16_xp_224
    vit_base_patch32_224 vit_base_patch32_384 vit_base_patch32_clip_224
    vit_base_patch32_clip_256 vit_base_patch32_clip_384 vit_base_patch32_clip_448
    vit_base_patch32_clip_quickgelu_224 vit_base_patch32_plus_256 vit_base_patch32_siglip_256
    vit_base_patch32_siglip_gap_256 vit_base_patch8_224 vit_betwixt_patch16_gap_256
    vit_betwixt_patch16_reg1_gap_256 vit_betwixt_patch16_reg4_gap_256
    vit_betwixt_patch16_reg4_gap_384 vit_betwixt_patch32_clip_224
    vit_dlittle_patch16_reg1_gap_256 vit_dpwee_patch16_reg1_gap_256
    vit_dwee_patch16_reg1_gap_256 vit_giant_patch14_224 vit_giant_patch14_clip_224
    vit_giant_patch14_dinov2 vit_giant_patch14_reg1_tipsv2 vit_giant_patch14_reg4_dinov2
    vit_giant_patch16_gap_224 vit_giant_patch16_radio_v3 vit_giantopt_patch16_siglip_256
    vit_giantopt_patch16_siglip_384 vit_giantopt_patch16_siglip_gap_256
    vit_giantopt_patch16_siglip_gap_384 vit_gigantic_patch14_224 vit_gigantic_patch14_clip_224
    vit_gigantic_patch14_clip_378 vit_gigantic_patch14_clip_quickgelu_224 vit_huge_patch14_224
    vit_huge_patch14_clip_224 vit_huge_patch14_clip_336 vit_huge_patch14_clip_378
    vit_huge_patch14_clip_quickgelu_224 vit_huge_patch14_clip_quickgelu_378
    vit_huge_patch14_gap_224 vit_huge_patch14_xp_224 vit_huge_patch16_gap_448
    vit_huge_patch16_radio_v3 vit_huge_patch16_radio_v4 vit_intern300m_patch14_448
    vit_large_patch14_224 vit_large_patch14_clip_224 vit_large_patch14_clip_336
    vit_large_patch14_clip_quickgelu_224 vit_large_patch14_clip_quickgelu_336
    vit_large_patch14_dinov2 vit_large_patch14_reg1_tipsv2 vit_large_patch14_reg4_dinov2
    vit_large_patch14_xp_224 vit_large_patch16_224 vit_large_patch16_384
    vit_large_patch16_radio_v3 vit_large_patch16_siglip_256 vit_large_patch16_siglip_384
    vit_large_patch16_siglip_512 vit_large_patch16_siglip_gap_256
    vit_large_patch16_siglip_gap_384 vit_large_patch16_siglip_gap_512 vit_large_patch32_224
    vit_large_patch32_384 vit_little_patch16_reg1_gap_256 vit_little_patch16_reg4_gap_256
    vit_medium_patch16_clip_224 vit_medium_patch16_gap_240 vit_medium_patch16_gap_256
    vit_medium_patch16_gap_384 vit_medium_patch16_reg1_gap_256 vit_medium_patch16_reg4_gap_256
    vit_medium_patch32_clip_224 vit_mediumd_patch16_reg4_gap_256
    vit_mediumd_patch16_reg4_gap_384 vit_pwee_patch16_reg1_gap_256 vit_small_patch14_dinov2
    vit_small_patch14_reg4_dinov2 vit_small_patch16_18x2_224 vit_small_patch16_224
    vit_small_patch16_36x1_224 vit_small_patch16_384 vit_small_patch32_224
    vit_small_patch32_384 vit_small_patch8_224 vit_so150m2_patch16_reg1_gap_256
    vit_so150m2_patch16_reg1_gap_384 vit_so150m2_patch16_reg1_gap_448
    vit_so150m_patch16_reg4_gap_256 vit_so150m_patch16_reg4_gap_384
    vit_so150m_patch16_reg4_map_256 vit_so400m_patch14_reg1_tipsv2
    vit_so400m_patch14_siglip_224 vit_so400m_patch14_siglip_378 vit_so400m_patch14_siglip_384
    vit_so400m_patch14_siglip_gap_224 vit_so400m_patch14_siglip_gap_378
    vit_so400m_patch14_siglip_gap_384 vit_so400m_patch14_siglip_gap_448
    vit_so400m_patch14_siglip_gap_896 vit_so400m_patch16_radio_v4
    vit_so400m_patch16_siglip_256 vit_so400m_patch16_siglip_384 vit_so400m_patch16_siglip_512
    vit_so400m_patch16_siglip_gap_256 vit_so400m_patch16_siglip_gap_384
    vit_so400m_patch16_siglip_gap_512 vit_tiny_patch16_224 vit_tiny_patch16_384
    vit_wee_patch16_reg1_gap_256 vit_xsmall_patch16_clip_224
""".split()
    )
    | frozenset(
        """
    deit3_base_patch16_224 deit3_base_patch16_384 deit3_huge_patch14_224
    deit3_large_patch16_224 deit3_large_patch16_384 deit3_medium_patch16_224
    deit3_small_patch16_224 deit3_small_patch16_384 deit_base_distilled_patch16_224
    deit_base_distilled_patch16_384 deit_base_patch16_224 deit_base_patch16_384
    deit_small_distilled_patch16_224 deit_small_patch16_224 deit_tiny_distilled_patch16_224
    deit_tiny_patch16_224
""".split()
    )
    | frozenset(
        """
    vit_base_mci_224 vit_base_r26_s32_224 vit_base_r50_s16_224 vit_base_r50_s16_384
    vit_base_resnet26d_224 vit_base_resnet50d_224 vit_large_r50_s32_224 vit_large_r50_s32_384
    vit_small_r26_s32_224 vit_small_r26_s32_384 vit_small_resnet26d_224
    vit_small_resnet50d_s16_224 vit_tiny_r_s16_p8_224 vit_tiny_r_s16_p8_384
""".split()
    )
)

# timm eva.py's entries (rotary position embeddings: vitkit.models.rope, checkpoints.timm_eva)
_EVA_ALL = frozenset(
    """
    eva02_base_patch14_224 eva02_base_patch14_448 eva02_base_patch16_clip_224
    eva02_enormous_patch14_clip_224 eva02_large_patch14_224 eva02_large_patch14_448
    eva02_large_patch14_clip_224 eva02_large_patch14_clip_336 eva02_small_patch14_224
    eva02_small_patch14_336 eva02_tiny_patch14_224 eva02_tiny_patch14_336
    eva_giant_patch14_224 eva_giant_patch14_336 eva_giant_patch14_560
    eva_giant_patch14_clip_224 vit_5b_patch16_sapiens2 vit_7b_patch16_dinov3
    vit_base_patch16_dinov3 vit_base_patch16_dinov3_qkvb vit_base_patch16_lingbot
    vit_base_patch16_rope_224 vit_base_patch16_rope_ape_224 vit_base_patch16_rope_mixed_224
    vit_base_patch16_rope_mixed_ape_224 vit_base_patch16_rope_reg1_gap_256
    vit_base_patch16_sapiens2 vit_betwixt_patch16_rope_reg4_gap_256 vit_giant_patch16_lingbot
    vit_giant_patch16_sapiens2 vit_huge_patch16_sapiens2 vit_huge_plus_patch16_dinov3
    vit_huge_plus_patch16_dinov3_qkvb vit_large_patch16_dinov3 vit_large_patch16_dinov3_qkvb
    vit_large_patch16_lingbot vit_large_patch16_rope_224 vit_large_patch16_rope_ape_224
    vit_large_patch16_rope_mixed_224 vit_large_patch16_rope_mixed_ape_224
    vit_large_patch16_sapiens2 vit_medium_patch16_rope_reg1_gap_256
    vit_mediumd_patch16_rope_reg1_gap_256 vit_pe_core_base_patch16_224
    vit_pe_core_gigantic_patch14_448 vit_pe_core_large_patch14_336
    vit_pe_core_small_patch16_384 vit_pe_core_tiny_patch16_384
    vit_pe_lang_gigantic_patch14_448 vit_pe_lang_large_patch14_448
    vit_pe_spatial_base_patch16_512 vit_pe_spatial_gigantic_patch14_448
    vit_pe_spatial_large_patch14_448 vit_pe_spatial_small_patch16_512
    vit_pe_spatial_tiny_patch16_512 vit_small_patch16_dinov3 vit_small_patch16_dinov3_qkvb
    vit_small_patch16_lingbot vit_small_patch16_rope_224 vit_small_patch16_rope_ape_224
    vit_small_patch16_rope_mixed_224 vit_small_patch16_rope_mixed_ape_224
    vit_small_plus_patch16_dinov3 vit_small_plus_patch16_dinov3_qkvb
    vit_tiny_patch16_dinov3_qkvb
""".split()
)
# the eva.py entries read exactly (DINOv3, LingBot, RoPE-ViT, timm's SBB RoPE ViTs, EVA-02,
# EVA-1 giants, Perception Encoder core / lang / spatial, Sapiens2): all of them
EVA_NAMES: frozenset[str] = frozenset(n for n in _EVA_ALL if family_of(n) is not None)

# timm's naflexvit.py: read exactly (vitkit.models.naflex_packing; checkpoints/timm/naflexvit.py has
# each entry)
NAFLEX_NAMES: frozenset[str] = frozenset(
    """
    naflexvit_base_patch16_gap naflexvit_base_patch16_map naflexvit_base_patch16_par_gap
    naflexvit_base_patch16_parfac_gap naflexvit_base_patch16_radio_v3
    naflexvit_base_patch16_siglip naflexvit_giant_patch16_radio_v3
    naflexvit_huge_patch16_radio_v3 naflexvit_huge_patch16_radio_v4
    naflexvit_large_patch16_radio_v3 naflexvit_so150m2_patch16_reg1_gap
    naflexvit_so150m2_patch16_reg1_map naflexvit_so400m_patch16_radio_v4
    naflexvit_so400m_patch16_siglip
""".split()
)

# timm's other ViT modules: (what vitkit lacks, their names)
OTHER_MODULES: dict[str, tuple[str, frozenset[str]]] = {
    "eva": (
        "not read (none: every timm 1.0.31 eva.py entry is read)",
        _EVA_ALL - EVA_NAMES,
    ),
}

# timm's relative-position ViT modules vitkit reads exactly (checkpoints/timm/beit_relpos.py)
RELPOS_MODULES: dict[str, frozenset[str]] = {
    "beit": frozenset(
        """
    beit_base_patch16_224 beit_base_patch16_384 beit_large_patch16_224 beit_large_patch16_384
    beit_large_patch16_512 beitv2_base_patch16_224 beitv2_large_patch16_224
""".split()
    ),
    "vision_transformer_relpos": frozenset(
        """
    test_vit_relpos vit_relpos_base_patch16_224 vit_relpos_base_patch16_cls_224
    vit_relpos_base_patch16_clsgap_224 vit_relpos_base_patch16_plus_240
    vit_relpos_base_patch16_rpn_224 vit_relpos_base_patch32_plus_rpn_256
    vit_relpos_medium_patch16_224 vit_relpos_medium_patch16_cls_224
    vit_relpos_medium_patch16_rpn_224 vit_relpos_small_patch16_224
    vit_relpos_small_patch16_rpn_224 vit_srelpos_medium_patch16_224
    vit_srelpos_small_patch16_224
""".split()
    ),
}


def relpos_module(arch: str) -> str | None:
    """ "beit" or "relpos" when ``arch`` (a pretrained tag dropped) is one of their entries."""
    name = arch.split(".")[0]
    if name in RELPOS_MODULES["beit"]:
        return "beit"
    return "relpos" if name in RELPOS_MODULES["vision_transformer_relpos"] else None


def check_architecture(arch: str, source: str) -> str:
    """``arch`` (a pretrained tag after a dot dropped) if vitkit reads it; else one line
    naming what is missing."""
    name = arch.split(".")[0]
    if name in VIT_NAMES or name in EVA_NAMES or name in NAFLEX_NAMES or relpos_module(name):
        return name
    if name in _EVA_ALL:
        check_eva_architecture(name, source)  # raises with what is missing
    for why, names in OTHER_MODULES.values():
        if name in names:
            raise VitkitError(f"{source}: {name}: {why}")
    raise VitkitError(
        f"{source}: architecture {arch!r} is not one of the timm ViTs vitkit reads (timm "
        f"{TIMM_VERSION}'s vision_transformer, deit and vision_transformer_hybrid entries), so "
        "vitkit cannot know what its blocks compute. If it is a timm VisionTransformer, load "
        "its weights file alone and state what the weights do not say (heads, eps, GELU)"
    )
