"""Pixel-space views of patches and the per-patch targets of the self-supervised objectives.

All pure functions of tensors. Patches are in the order :class:`vitkit.models.vit.PatchEmbed` makes
tokens (row-major over the grid); the pixels of one patch are flattened channel-major
``(c, i, j)``, the layout of the patch-embedding kernel.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

from vitkit.errors import VitkitError


def patchify(images: Tensor, patch_size: tuple[int, int]) -> Tensor:
    """``[B, C, H, W]`` → ``[B, N, C * ph * pw]``, patches row-major as the model's tokens."""
    b, c, h, w = images.shape
    ph, pw = patch_size
    if h % ph or w % pw:
        raise VitkitError(f"images of {h}x{w} px do not split into {ph}x{pw} patches")
    x = images.reshape(b, c, h // ph, ph, w // pw, pw)
    return x.permute(0, 2, 4, 1, 3, 5).reshape(b, (h // ph) * (w // pw), c * ph * pw)


def unpatchify(patches: Tensor, patch_size: tuple[int, int], grid: tuple[int, int]) -> Tensor:
    """The inverse of :func:`patchify`: ``[B, N, C * ph * pw]`` → ``[B, C, H, W]``."""
    b, n, k = patches.shape
    ph, pw = patch_size
    gh, gw = grid
    c = k // (ph * pw)
    if n != gh * gw or c * ph * pw != k:
        raise VitkitError(f"{n} patches of {k} values are not a {gh}x{gw} grid of {ph}x{pw}")
    x = patches.reshape(b, gh, gw, c, ph, pw).permute(0, 3, 1, 4, 2, 5)
    return x.reshape(b, c, gh * ph, gw * pw)


def quantize(values: Tensor, bits: int) -> Tensor:
    """Values in [0, 1] → integer levels ``floor(v * 2^bits)``, the top edge in the last level."""
    levels = 2**bits
    return (values * levels).floor().clamp_(0, levels - 1).long()


def color_index(levels: Tensor, bits: int) -> Tensor:
    """Per-channel levels ``[..., C]`` → one class index in ``[0, 2^(bits C))``, the first
    channel most significant (3 bits of R, G, B: ``r * 64 + g * 8 + b``, 512 classes)."""
    base = 2**bits
    index = torch.zeros(levels.shape[:-1], dtype=torch.long, device=levels.device)
    for c in range(levels.shape[-1]):
        index = index * base + levels[..., c]
    return index


def mean_color_target(pixels: Tensor, patch_size: tuple[int, int], bits: int = 3) -> Tensor:
    """The paper's target: each patch's mean colour, every channel quantised to ``bits``.

    ``pixels``: images ``[B, C, H, W]`` with values in [0, 1]. Returns class indices ``[B, N]``
    in ``[0, 2^(bits C))``: 512 classes for RGB at 3 bits; for grayscale (C = 1) the quantised
    mean intensity, 8 classes at 3 bits.
    """
    means = F.avg_pool2d(pixels.float(), patch_size)  # [B, C, gh, gw]
    levels = quantize(means.flatten(2).transpose(1, 2), bits)  # [B, N, C]
    return color_index(levels, bits)


def downsized_target(
    pixels: Tensor, patch_size: tuple[int, int], grid: int = 4, bits: int = 3
) -> Tensor:
    """The paper's second target: each patch downsized to ``grid x grid`` cells (mean colour of
    each cell), every cell's colour quantised as in :func:`mean_color_target`.

    Returns class indices ``[B, N, grid * grid]`` (cells row-major inside the patch).
    """
    ph, pw = patch_size
    if ph % grid or pw % grid:
        raise VitkitError(f"a {ph}x{pw} patch does not downsize to {grid}x{grid} cells")
    cells = F.avg_pool2d(pixels.float(), (ph // grid, pw // grid))  # [B, C, gh*grid, gw*grid]
    per_patch = patchify(cells, (grid, grid))  # [B, N, C * grid * grid], channel-major
    b, n, _ = per_patch.shape
    c = pixels.shape[1]
    levels = quantize(per_patch.reshape(b, n, c, grid * grid).transpose(2, 3), bits)
    return color_index(levels, bits)  # [B, N, grid * grid]


def normalize_patches(patches: Tensor, eps: float = 1e-6) -> Tensor:
    """Each patch standardised by its own mean and variance (MAE's ``norm_pix_loss``)."""
    mean = patches.mean(-1, keepdim=True)
    var = patches.var(-1, keepdim=True, unbiased=True) if patches.shape[-1] > 1 else 0.0
    return (patches - mean) / (var + eps) ** 0.5


def color_values(index: Tensor, bits: int, channels: int) -> Tensor:
    """Class indices of :func:`color_index` → the colours at their levels' centres
    ``[..., C]`` in [0, 1] (for showing predictions)."""
    base = 2**bits
    levels = []
    for _ in range(channels):
        levels.append(index % base)
        index = index // base
    return (torch.stack(levels[::-1], dim=-1).float() + 0.5) / base


def paint_cells(colors: Tensor, patch_size: tuple[int, int]) -> Tensor:
    """Per-patch cell colours ``[B, N, cells, C]`` (cells a square grid, row-major) → patch
    pixels ``[B, N, C * ph * pw]`` with every cell filled by its colour."""
    b, n, cells, c = colors.shape
    g = int(round(cells**0.5))
    ph, pw = patch_size
    img = colors.reshape(b * n, g, g, c).permute(0, 3, 1, 2)
    img = F.interpolate(img, size=(ph, pw), mode="nearest")
    return img.reshape(b, n, c * ph * pw)
