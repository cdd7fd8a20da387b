"""Bare timm ``eva.py`` state dicts (no config, no name) whose keys fix the family: EVA-02, EVA,
Perception Encoder and Sapiens2. Each is read as every registered timm entry of its layout has it
(:mod:`vitkit.checkpoints.timm.eva`), and its rotary embedding, which no key shows, is said in one
:class:`vitkit.errors.AssumptionWarning` line with the override (``-o rope=none``). Other eva.py
layouts (DINOv3, LingBot, RoPE-ViT: the same keys, other RoPE) are refused bare by
:mod:`vitkit.checkpoints.timm.bare`.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

from torch import Tensor

from vitkit.checkpoints.provenance import Assumption, Provenance
from vitkit.checkpoints.timm.bare import (
    eps_assumption,
    gelu_assumption,
    grid_assumption,
    heads_assumed,
)
from vitkit.checkpoints.timm.eva import check_eva_architecture, eva_hub_config_provenance
from vitkit.errors import VitkitError
from vitkit.registry.model_config import ViTConfig


def bare_layout(sd: dict[str, Tensor]) -> str | None:
    """ "EVA-02" (q / v biases, SwiGLU, E_pos and a class token, nothing else) or "EVA" (the same
    with a GELU MLP): the eva.py layouts whose keys fix the family; None for another."""
    b = "blocks.0."
    if f"{b}attn.k_proj.bias" in sd and f"{b}norm1.bias" not in sd and "pos_embed" not in sd:
        return "Sapiens2"  # RMSNorm, unfused q / k / v all with biases: only Sapiens2's
    if "norm_pre.weight" in sd and "patch_embed.proj.bias" not in sd and "pos_embed" in sd:
        # norm_pre, no patch bias, and a MAP head or no final norm: only PE's (timm_bare)
        finals = ("norm.weight", "fc_norm.weight")
        pe = "attn_pool.latent" in sd or not any(k in sd for k in finals)
        return "Perception Encoder" if pe and f"{b}attn.qkv.bias" in sd else None
    split = f"{b}attn.q_proj.bias" in sd
    qv = f"{b}attn.k_proj.bias" not in sd if split else f"{b}attn.q_bias" in sd
    others = ("reg_token", "rope.freqs", f"{b}gamma_1", "attn_pool.latent", "norm_pre.weight")
    if not qv or "pos_embed" not in sd or "cls_token" not in sd or any(k in sd for k in others):
        return None
    if f"{b}mlp.fc1_g.weight" in sd:
        return "EVA-02"
    fc1, fc2 = sd.get(f"{b}mlp.fc1.weight"), sd.get(f"{b}mlp.fc2.weight")
    if fc1 is None or fc2 is None:
        return None
    return "EVA-02" if fc1.shape[0] == 2 * fc2.shape[1] else "EVA"


def bare_eva_config_provenance(
    sd: dict[str, Tensor], source: str, num_heads: int | None = None
) -> tuple[ViTConfig, Provenance]:
    """A bare EVA-02 / EVA state dict (:func:`bare_layout`): what every registered entry of the
    layout has (pooling by ``fc_norm``, EVA's post-norm by its width), the RoPE (EVA-02's; EVA:
    none) and the heads (never in a state dict) assumed and said, as no key shows them."""
    cfg, prov = _bare_eva(sd, source, num_heads)
    which = f"every timm eva.py entry of the {bare_layout(sd)} layout"
    if num_heads is None:
        heads_assumed(cfg.num_heads, cfg.width, which, prov)
    prov.assume(eps_assumption(cfg.layer_norm_eps, which))
    if cfg.mlp != "swiglu" and cfg.gelu == "none":
        prov.assume(gelu_assumption(which))
    if (grid := grid_assumption(cfg)) is not None:  # (this reader takes no grid: no override)
        otherwise = f"{grid.otherwise.removesuffix('; say the grid')}, which vitkit does not read"
        prov.assume(dataclasses.replace(grid, otherwise=otherwise, example=None))
    return cfg, prov


def _bare_eva(
    sd: dict[str, Tensor], source: str, num_heads: int | None
) -> tuple[ViTConfig, Provenance]:
    layout = bare_layout(sd)
    fc_norm, width = "fc_norm.weight" in sd, sd["patch_embed.proj.weight"].shape[0]
    if layout == "Perception Encoder":
        return _bare_pe(sd, source, num_heads)
    if layout == "Sapiens2":
        cfg, prov = eva_hub_config_provenance(
            {"architecture": "vit_base_patch16_sapiens2"}, sd, source, num_heads
        )
        named = check_eva_architecture("vit_base_patch16_sapiens2", source)[1]
        prov.set("weights", list(named), "every timm *_sapiens2 entry")
        why = (
            "Sapiens2's keys (RMSNorm, q / k / v apart, all with biases): every timm *_sapiens2 "
            "entry rotates q / k as DINOv3 does (centred coordinates, base 100); no key shows it"
        )
        return cfg, prov.assume(Assumption("rope", "dinov3", why, "it may have none", "none"))
    if layout == "EVA-02":
        arch = "eva02_base_patch14_224" if fc_norm else "eva02_base_patch16_clip_224"
    elif fc_norm:
        arch = "eva_giant_patch14_224"
    else:  # EVA-02 enormous (1792) is post-norm, the EVA-1 giant CLIP tower (1408) pre-norm
        arch = "eva02_enormous_patch14_clip_224" if width == 1792 else "eva_giant_patch14_clip_224"
    cfg, prov = eva_hub_config_provenance({"architecture": arch}, sd, source, num_heads)
    _, named = check_eva_architecture(arch, source)  # (every entry of this layout has them)
    prov.set("weights", list(named), f"every timm eva.py entry of the {layout} layout")
    if layout == "EVA-02":
        why = (
            "EVA-02's keys (q / v biases, SwiGLU): every timm eva02_* entry rotates q / k by "
            "patch index rescaled to a 16 x 16 grid, base 10000; no key shows it"
        )
        prov.assume(Assumption("rope", "axial", why, "an Eva of this layout may have none", "none"))
    else:
        why = "EVA's keys (q / v biases, GELU MLP): no timm entry of them has RoPE"
        could = "one with RoPE needs rope, rope_theta and rope_ref_grid stated"
        prov.assume(Assumption("rope", "none", why, could, None))
        if not fc_norm and width not in (1408, 1792):  # no registered entry says the block
            why = "the EVA-1 giant CLIP tower's (width 1408); EVA-02 enormous (1792) is post-norm"
            other = "post" if cfg.block == "pre" else "pre"
            prov.assume(Assumption("block", cfg.block, why, f"it may be {other}-norm", other))
    return cfg, prov


def _bare_pe(
    sd: dict[str, Tensor], source: str, num_heads: int | None
) -> tuple[ViTConfig, Provenance]:
    """A bare Perception Encoder: every vit_pe_* entry counts its RoPE from (1, 1) with a class
    token and from (0, 0) without, on its own E_pos grid, and pools with an 8-head MAP head
    (core) or the mean of the patch tokens (lang / spatial); the RoPE is said, as no key shows
    it."""
    cls, core = "cls_token" in sd, "attn_pool.latent" in sd
    small = "vit_pe_core_tiny_patch16_384" if core else "vit_pe_spatial_tiny_patch16_512"
    arch = small if cls else f"vit_pe_{'core' if core else 'spatial'}_gigantic_patch14_448"
    side = int(round((sd["pos_embed"].shape[1] - cls) ** 0.5))
    args = {"ref_feat_shape": [side, side]}
    cfg, prov = eva_hub_config_provenance(
        {"architecture": arch, "model_args": args}, sd, source, num_heads
    )
    prov.set(
        "weights", [*check_eva_architecture(arch, source)[1], "rope_ref_grid"], "every vit_pe_*"
    )
    head = "a MAP head" if core else "no final norm"
    why = (
        f"Perception Encoder's keys (norm_pre, no patch bias, {head}): "
        f"every timm vit_pe_* entry rotates q / k by patch index from {int(cls)} in (x, y) order, "
        "rescaled to its E_pos grid; no key shows it"
    )
    return cfg, prov.assume(
        Assumption("rope", "axial", why, "a model of this layout may have none", "none")
    )


def check_bare_eva_grid(
    p: Path, sd: dict[str, Tensor], cfg: ViTConfig, grid: tuple[int, int] | None
) -> None:
    """A bare EVA / EVA-02 file is read on a square grid (its rotary embedding follows the
    grid, which only a timm folder states): a grid given, or position rows that no square grid
    fills, are refused with what to do instead."""
    rows = sd["pos_embed"].shape[1] if "pos_embed" in sd else None
    gh, gw = cfg.grid_size
    fits = rows is None or rows == gh * gw + cfg.num_pos_prefix
    if grid is None and fits:
        return
    why = (
        f"a grid ({grid[0]}x{grid[1]}) was given"
        if grid is not None
        else f"its {rows} position rows fill no square grid"
    )
    raise VitkitError(
        f"{p}: {why}, and a bare EVA / EVA-02 state dict takes no grid: it is read on a square "
        "one, as its rotary embedding follows the grid; for another grid read a timm folder: "
        "this file as model.safetensors beside a config.json naming the timm eva.py entry "
        "(architecture) with model_args.img_size [height, width]"
    )
