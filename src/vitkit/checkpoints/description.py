"""What ``vitkit inspect`` prints: :func:`vitkit.checkpoints.describe`'s dict as text."""

from __future__ import annotations

from typing import Any

from vitkit.checkpoints.adapt import is_zero_head
from vitkit.checkpoints.native.safetensors_io import Checkpoint
from vitkit.registry.counts import count_params
from vitkit.registry.model_config import ResNetConfig, ViTConfig

_GELU = {"tanh": "tanh approximation", "none": "exact (erf)", "quick": "quick x*sigmoid(1.702x)"}


def family_name(cfg: ViTConfig) -> str:
    """The family a config belongs to, read from its switches, with what sets it apart:
    ``"DeiT-III S/16, layer scale 1e-06, 224 px"``, ``"DINOv2 S/14, 4 registers, layer scale
    1e-05, 518 px"``, ``"CLIP tower B/16, quick GELU, 224 px"``, ``"ViT-B/16 (the paper's),
    224 px"``. The switches, not a name, decide: two checkpoints with the same switches get the
    same family."""
    details: list[str] = []
    size = cfg.short_name
    if cfg.rope != "none":  # vitkit.models.rope: named by the rotary embedding's kind
        kinds = {"dinov3": "DINOv3", "axial": "RoPE-ViT (axial)", "mixed": "RoPE-ViT (mixed)"}
        family = kinds[cfg.rope] if cfg.rope_ref_grid is None else "timm RoPE ViT (SBB)"
        if cfg.rope == "axial" and cfg.norm_pre and not cfg.patch_bias:
            family = "Perception Encoder"  # RoPE from (1, 1) in (x, y) order, norm_pre
        elif cfg.rope == "axial" and cfg.rope_ref_grid is not None and not cfg.k_bias:
            family = "EVA-02"  # RoPE on a reference grid, q / v biases
        elif cfg.rope == "dinov3" and cfg.norm == "rmsnorm":
            family = "Sapiens2"  # DINOv3's RoPE with RMSNorm (and grouped-query attention)
        details += ["E_pos + RoPE"] if cfg.abs_pos_embed else []
        details += ["no qkv bias"] if not cfg.qkv_bias else [] if cfg.k_bias else ["q/v biases"]
    elif _rel_pos_family(cfg):  # BEiT, timm's relpos ViTs (vitkit.models.relpos)
        family = _rel_pos_family(cfg)
        details += _rel_pos_details(cfg)
    elif _later_family(cfg):  # AIMv2 / BEiT-3 / post-norm
        family = _later_family(cfg)
    elif cfg.dist_token:
        family = "DeiT (distilled)"
    elif _block_details(cfg):  # vitkit.models.parallel_blocks
        family = "Parallel-block" if cfg.parallel > 1 or cfg.parallel_scaling else "Differential"
    elif cfg.norm_pre and not cfg.patch_bias:
        family = "CLIP tower"
        details += ["quick GELU"] if cfg.gelu == "quick" else []
    elif cfg.layer_scale_init is not None and not cfg.pos_embed_prefix and not cfg.num_reg_tokens:
        family = "DeiT-III"  # E_pos for the patches only
    elif cfg.layer_scale_init is not None and (cfg.patch_size == (14, 14) or cfg.num_reg_tokens):
        family = "DINOv2"
    elif cfg.layer_scale_init is not None:
        family = "ViT with layer scale"
    elif cfg.num_reg_tokens:
        family = "ViT with registers"
    elif cfg.fc_norm:
        family = "timm GAP ViT (fc_norm)"
    elif cfg.family_switches:
        family = "ViT variant"
    else:
        family, size = "", f"{size} (the paper's)"
    if not family:  # the paper's: "ViT-B/16", "R(3,4,9)x1+ViT-B/16"; "ViT-w64-d6-h4/4" as it is
        head, plus, vit = size.rpartition("+")
        size = f"{head}{plus}{vit if vit.startswith('ViT-') else 'ViT-' + vit}"
    details += _block_details(cfg)
    if cfg.num_reg_tokens:
        details.append(f"{cfg.num_reg_tokens} registers")
    if cfg.mlp == "swiglu":
        details.append("SwiGLU MLP")
    if cfg.layer_scale_init is not None:
        details.append(f"layer scale {cfg.layer_scale_init:g}")
    if cfg.qk_norm:
        details.append("q/k norm")
    if cfg.pool != "token":
        details.append(f"{cfg.pool} pool" + (" + fc_norm" if cfg.fc_norm else ""))
    h, w = cfg.image_size
    details.append(f"{h} px" if h == w else f"{h}x{w} px")
    return f"{family + ' ' if family else ''}{size}, {', '.join(details)}"


def _block_details(cfg: ViTConfig) -> list[str]:
    """The blocks of vitkit.models.parallel_blocks a config has, in words."""
    out = [f"{cfg.parallel} parallel branches"] if cfg.parallel > 1 else []
    out += ["attention + MLP in parallel (ViT-22B)"] if cfg.parallel_scaling else []
    return out + (["differential attention"] if cfg.diff_attn else [])


def _rel_pos_family(cfg: ViTConfig) -> str:
    """BEiT (q and v biases), a relative-position ViT (timm's relpos); ""."""
    if not cfg.k_bias:  # (E_pos, no relative bias: EVA-1, EVA-02 enormous)
        return "BEiT" if cfg.rel_pos != "none" or not cfg.abs_pos_embed else "EVA"
    if cfg.rel_pos != "none":
        return "relative-position ViT" + (" (post-norm)" if cfg.block == "post" else "")
    return "ViT without position embeddings" if not cfg.abs_pos_embed else ""


def _rel_pos_details(cfg: ViTConfig) -> list[str]:
    kind = {"bias": "table", "mlp": "log-coordinate MLP", "mlp_swin": "Swin v2 MLP"}
    out = [] if cfg.rel_pos == "none" else [f"{kind[cfg.rel_pos]} relative position bias"]
    out += ["shared across blocks"] if cfg.rel_pos_shared else []
    return out + (["absolute E_pos too"] if cfg.abs_pos_embed and cfg.rel_pos != "none" else [])


def _later_family(cfg: ViTConfig) -> str:
    """AIMv2 (RMSNorm, SwiGLU, a norm on the patch embeddings), BEiT-3 (sub-LayerNorms), a
    post-norm ViT; "" for the others."""
    if cfg.norm == "rmsnorm" and cfg.mlp == "swiglu" and cfg.patch_norm:
        return "AIMv2"
    if cfg.scale_attn_norm or cfg.scale_mlp_norm:
        return "BEiT-3"
    return "post-norm ViT" if cfg.block == "post" else ""


def describe(ckpt: Checkpoint) -> dict[str, Any]:
    """What ``vitkit inspect`` prints."""
    cfg = ckpt.model_config
    return {
        "path": str(ckpt.path),
        "format": ckpt.format,
        "model": cfg.short_name,
        "family": cfg.short_name if isinstance(cfg, ResNetConfig) else family_name(cfg),
        "architecture": cfg.to_dict(),
        "parameters": count_params(cfg),
        "resolution": list(cfg.image_size),
        "grid": None if isinstance(cfg, ResNetConfig) else list(cfg.grid_size),
        "num_classes": cfg.num_classes,
        "class_names": list(ckpt.class_names[:10])
        + (["..."] if len(ckpt.class_names) > 10 else []),
        "zero_head": is_zero_head(ckpt.state_dict),
        "preprocess": ckpt.preprocess.to_dict(),
        "dtype": sorted({str(v.dtype).replace("torch.", "") for v in ckpt.state_dict.values()}),
        "provenance": None if ckpt.provenance is None else ckpt.provenance.to_dict(),
    }


def format_description(info: dict[str, Any]) -> str:
    """A checkpoint's description (``describe(read_checkpoint(...))``), one field a line."""
    arch = info["architecture"]
    pre = info["preprocess"]
    lines = [
        f"path:        {info['path']}",
        f"format:      {info['format']}",
        f"model:       {info['model']}  ({info['parameters']:,} parameters, "
        f"{', '.join(info['dtype'])})",
    ]
    if arch.get("architecture") == "resnet":
        lines.append(
            f"layers:      BiT ResNet-v2, stages {arch['layers']}, "
            f"width x{arch['width_factor']:g}, root {arch['root']}"
        )
        lines.append(f"resolution:  {info['resolution'][0]}x{info['resolution'][1]}")
    else:
        size = arch["representation_size"]
        pre_logits = f"pre-logits {size}" if size else "no pre-logits"
        lines.append(
            f"layers:      width {arch['width']}, depth {arch['depth']}, heads "
            f"{arch['num_heads']}, mlp {arch['mlp_dim']}, patch {arch['patch_size']}, pool "
            f"{arch['pool']}, {pre_logits}"
        )
        lines.append(
            f"numerics:    LayerNorm eps {arch['layer_norm_eps']:g}, GELU {_GELU[arch['gelu']]}"
        )
        cfg = ViTConfig.from_dict(arch)
        lines.append(f"family:      {family_name(cfg)}")
        if cfg.family_switches:
            switches = ", ".join(f"{k}={v}" for k, v in cfg.family_switches.items())
            lines.append(f"switches:    {switches}  (not the paper's ViT)")
        if arch.get("resnet_layers") is not None:
            lines.append(
                f"hybrid:      ResNet stages {arch['resnet_layers']}, "
                f"width x{arch['resnet_width_factor']:g}"
            )
        lines.append(
            f"resolution:  {info['resolution'][0]}x{info['resolution'][1]} "
            f"(grid {info['grid'][0]}x{info['grid'][1]})"
        )
    head = f"{info['num_classes']}" + (
        "  (all zeros: train or replace it)" if info["zero_head"] else ""
    )
    names = f"  {', '.join(info['class_names'])}" if info["class_names"] else ""
    lines.append(f"classes:     {head}{names}")
    extra = "" if pre.get("resize", "shortest_edge") == "shortest_edge" else f", {pre['resize']}"
    if pre.get("rescale_factor", 1 / 255) != 1 / 255:
        extra += f", rescale {pre['rescale_factor']:g}"
    lines.append(
        f"preprocess:  mean {pre['mean']}, std {pre['std']}, {pre['interpolation']}, "
        f"crop {pre['crop_pct']}{extra}"
    )
    return "\n".join(lines + _provenance_lines(info.get("provenance")))


# the order in which inspect lists the sources, and their words
_SOURCE_WORDS = {
    "given": "given when loading",
    "file": "the file's config",
    "name": "the architecture's name",
    "format": "the format",
    "weights": "the weights",
    "assumed": "ASSUMED",
    "default": "default (no effect)",
}


def _provenance_lines(prov: dict[str, Any] | None) -> list[str]:
    """Per source, the fields it set; each assumed field with what it could be instead."""
    if not prov:
        return []
    by_source: dict[str, list[str]] = {}
    for f, s in prov["sources"].items():
        by_source.setdefault(s, []).append(f)
    lines = ["provenance:"]
    for source, words in _SOURCE_WORDS.items():
        fields = by_source.get(source, [])
        if fields:
            lines.append(f"  {words + ':':24s}{', '.join(fields)}")
    for line in prov.get("assumed", {}).values():
        lines.append(f"  assumed: {line}")
    return lines
