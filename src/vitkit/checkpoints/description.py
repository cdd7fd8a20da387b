"""What ``vitkit inspect`` prints: :func:`vitkit.checkpoints.describe`'s dict as text."""

from __future__ import annotations

from typing import Any

from vitkit.config import ViTConfig

_GELU = {"tanh": "tanh approximation", "none": "exact (erf)", "quick": "quick x*sigmoid(1.702x)"}


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
        switches = ViTConfig.from_dict(arch).family_switches
        if switches:
            family = ", ".join(f"{k}={v}" for k, v in switches.items())
            lines.append(f"family:      {family}  (not the paper's ViT)")
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
    lines.append(
        f"preprocess:  mean {pre['mean']}, std {pre['std']}, {pre['interpolation']}, "
        f"crop {pre['crop_pct']}"
    )
    return "\n".join(lines)
