"""Position embeddings on another patch grid: the paper's 2-D interpolation (Sec. 3.2).

"We perform 2D interpolation of the pre-trained position embeddings, according to their
location in the original image." The prefix rows (the class token's) are kept apart; the patch
rows are reshaped to their (rows, columns) grid and resampled. Modes (``align_corners=False``
but for zoom; computed in float32 and cast back, as timm):

- ``"bicubic"``: PyTorch's plain bicubic (Keys' kernel with a = -0.75, four taps whatever the
  scale): Hugging Face's ``interpolate_pos_encoding`` (ViT, DeiT, Dinov2, ViTMAE, CLIP,
  SigLIP, BEiT), the DeiT and MAE authors' fine-tuning code.
- ``"bicubic-antialias"``: PyTorch's ``antialias=True`` bicubic, a different kernel (a = -0.5,
  its support widened by the scale when shrinking): timm's ``resample_abs_pos_embed`` (its
  ``dynamic_img_size`` forward and its checkpoint filter) and Hugging Face's
  Dinov2WithRegisters. On a 2x2 -> 3x4 grid the two bicubics differ by about 1e-3.
- ``"bilinear"``: timm's checkpoint filter for FlexiViT and RADIO.
- ``"zoom"``: the official ``scipy.ndimage.zoom(grid, ..., order=1)`` (bilinear with the corner
  samples aligned; computed in float64 like scipy).

Which one a model uses is its config's ``pos_resample``, set by the reader from the source
(:mod:`vitkit.checkpoints.posemb_kernels`).

In an export of any size (a symbolic grid) the antialiased kernels are not left to the
runtime's ``Resize``: OpenVINO's antialiased bicubic is not PyTorch's (0.78 relative off at
an 8x8 grid). The grid is resampled as two matrix products, rows then columns
(``E' = A_h E A_w^T``), the matrices computed in the graph from the target size with plain
operations (:func:`antialias_matrix`): PyTorch's own weights, to float32 rounding.

Both ``vitkit convert --image-size`` (:func:`vitkit.checkpoints.adapt`) and a model run on
images of another size (:meth:`vitkit.models.vit.VisionTransformer.pos_embed_for`) use this one
function, so running at a new size equals converting first.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor

from vitkit.errors import VitkitError
from vitkit.registry.config_checks import RESAMPLE_MODES as RESAMPLE_MODES
from vitkit.registry.model_config import Resample as Resample


def symbolic(sizes: tuple[Any, ...]) -> bool:
    """Whether ``sizes`` are traced symbols (torch.export with a dynamic height and width)."""
    return any(isinstance(n, torch.SymInt) for n in sizes)


def resample_pos_embed(
    pos_embed: Tensor,
    old_grid: tuple[int, int],
    new_grid: tuple[int, int],
    num_prefix_tokens: int = 1,
    mode: Resample = "bicubic",
) -> Tensor:
    """``[1, prefix + old_h * old_w, D]`` → ``[1, prefix + new_h * new_w, D]``.

    The same grid returns the input unchanged (bit for bit); a symbolic grid (an export with
    a dynamic height and width) is always interpolated, which at the same grid is the identity
    for every mode. Differentiable.
    """
    if mode not in RESAMPLE_MODES:
        raise VitkitError(f"unknown resampling mode {mode!r} (choose from {RESAMPLE_MODES})")
    n_old = old_grid[0] * old_grid[1]
    if pos_embed.ndim != 3 or pos_embed.shape[1] != num_prefix_tokens + n_old:
        raise VitkitError(
            f"position embeddings of shape {tuple(pos_embed.shape)} do not hold "
            f"{num_prefix_tokens} prefix token(s) + a {old_grid[0]}x{old_grid[1]} grid"
        )
    if not symbolic(new_grid) and tuple(old_grid) == tuple(new_grid):
        return pos_embed
    old, new = [old_grid[0], old_grid[1]], [new_grid[0], new_grid[1]]
    return resample_grid(pos_embed, old, new, num_prefix_tokens, mode, symbolic(new_grid))


def resample_grid(
    pos_embed: Tensor,
    old_grid: list[int],
    new_grid: list[int],
    num_prefix_tokens: int,
    mode: str,
    exporting: bool = False,
) -> Tensor:
    """:func:`resample_pos_embed`'s interpolation, unchecked, on any grid (its own included);
    TorchScript compiles it, so that a scripted model (:mod:`vitkit.models.scriptable`) runs
    the eager model's numbers. ``exporting``: zoom in float32 (ONNX Runtime has no float64
    Resize; the export is checked against the float64 result)."""
    prefix, grid = pos_embed[:, :num_prefix_tokens], pos_embed[:, num_prefix_tokens:]
    d, dtype = grid.shape[-1], grid.dtype
    grid = grid.reshape(1, old_grid[0], old_grid[1], d).permute(0, 3, 1, 2)
    if mode == "zoom":
        wide = grid.float() if exporting else grid.double()
        grid = F.interpolate(wide, size=new_grid, mode="bilinear", align_corners=True)
    elif mode == "bicubic-antialias" and exporting:
        if not torch.jit.is_scripting():  # (a scripted model never exports)
            grid = antialiased(grid.float(), new_grid, "bicubic")
    else:  # "bicubic", "bicubic-antialias", "bilinear"
        kind = "bicubic" if mode.startswith("bicubic") else mode
        antialias = mode.endswith("-antialias")
        grid = F.interpolate(
            grid.float(), size=new_grid, mode=kind, align_corners=False, antialias=antialias
        )
    grid = grid.to(dtype).permute(0, 2, 3, 1).reshape(1, new_grid[0] * new_grid[1], d)
    return torch.cat([prefix, grid], dim=1)


def antialiased(grid: Tensor, size: list[int], kind: str) -> Tensor:
    """``F.interpolate(grid, size, mode=kind, align_corners=False, antialias=True)`` of a
    ``[N, C, H, W]`` float grid as two matrix products, rows then columns: the same numbers
    (float32 rounding, ~1e-6 relative) in a graph that holds no antialiased ``Resize``."""
    rows = antialias_matrix(grid.shape[-2], size[0], kind)
    columns = antialias_matrix(grid.shape[-1], size[1], kind)
    return rows @ grid @ columns.transpose(0, 1)


def antialias_matrix(n_in: int, n_out: Any, kind: str = "bicubic") -> Tensor:
    """``[n_out, n_in]``: PyTorch's antialiased resampling weights of one axis
    (``aten/src/ATen/native/cpu/UpSampleKernel.cpp``, ``_compute_indices_weights_aa``), from
    plain tensor operations, so that ``n_out`` may be a traced size.

    Output sample i is centred at ``c = s (i + 1/2)`` input pixels (``s = n_in / n_out``). When
    shrinking (s >= 1) the kernel is widened by s: support ``taps / 2 * s``, distances divided
    by s. Input j in ``[floor(c - support + 1/2), floor(c + support + 1/2))`` (clipped to the
    input) gets ``kernel((j - c + 1/2) / max(s, 1))``; each row is normalised to sum 1. The
    kernels: bicubic, Keys' with a = -0.5 (4 taps); bilinear, the triangle (2 taps).
    """
    taps = {"bicubic": 4.0, "bilinear": 2.0}[kind]
    i = torch.arange(n_out, dtype=torch.float32)
    j = torch.arange(n_in, dtype=torch.float32)
    scale = torch.full_like(i, float(n_in)) / torch.ones_like(i).sum()  # n_out may be traced
    widen = torch.clamp(scale, min=1.0)  # 1 when enlarging, s when shrinking
    support = taps / 2 * widen
    center = scale * (i + 0.5)
    first = torch.clamp(torch.floor(center - support + 0.5), min=0.0)
    end = torch.clamp(torch.floor(center + support + 0.5), max=float(n_in))
    x = ((j[None, :] - center[:, None] + 0.5) / widen[:, None]).abs()
    if kind == "bicubic":
        a = -0.5
        near = ((a + 2.0) * x - (a + 3.0)) * x * x + 1.0
        far = (((x - 5.0) * x + 8.0) * x - 4.0) * a
        w = torch.where(x < 1.0, near, torch.where(x < 2.0, far, torch.zeros_like(x)))
    else:
        w = torch.clamp(1.0 - x, min=0.0)
    inside = (j[None, :] >= first[:, None]) & (j[None, :] < end[:, None])
    w = torch.where(inside, w, torch.zeros_like(w))
    total = w.sum(dim=1, keepdim=True)
    return w / torch.where(total != 0, total, torch.ones_like(total))
