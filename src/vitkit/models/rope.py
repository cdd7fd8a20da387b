"""Rotary position embeddings (RoPE) on the patch tokens' queries and keys (not in the paper).

RoPE (Su et al., "RoFormer", 2021) rotates each pair of a head's query/key channels by an angle
proportional to the token's position, so that q . k depends on the positions' difference only.
The ViT family's 2-D forms, as timm's ``eva.py`` / ``layers/pos_embed_sincos.py`` compute them
(``ViTConfig.rope``; the prefix tokens -- class token, registers -- are never rotated):

- ``"dinov3"`` (DINOv3, Simeoni et al. 2025; LingBot, Sapiens2): patch centres normalised to
  [-1, 1] per axis, ``(i + 0.5) / n * 2 - 1``, so the same image region keeps its coordinate at
  any input size; head_dim / 4 periods ``theta ** (4 k / head_dim)`` per axis; angle
  ``2 pi coord / period`` (timm's ``RotaryEmbeddingDinoV3``). ``rope_hf``: transformers'
  arithmetic, ``(2 pi coord)`` rounded to float32 times ``1 / period`` (float32), the same
  angle to float32 rounding (``DINOv3ViTRopePositionEmbedding``).
- ``"axial"`` (RoPE-ViT axial, Heo et al. 2024; EVA-02; Perception Encoder): integer patch
  indices (plus ``rope_offset``; EVA-02 rescales them to ``rope_ref_grid``), frequencies
  ``theta ** (-4 k / head_dim)`` per axis (timm's ``RotaryEmbeddingCat``, ``in_pixels=False``).
- ``"mixed"`` (RoPE-ViT mixed): learned frequencies per block and head, ``freqs`` [2, depth,
  heads, head_dim / 2], angle ``x f_x + y f_y`` (timm's ``RotaryEmbeddingMixed``).

``rope_half`` picks the channel pairing: (c, c + head_dim / 2) (timm ``rotate_half``; DINOv3)
or (2c, 2c + 1) (interleaved; EVA-02, RoPE-ViT). ``rope_xy`` orders the per-axis channels
(x, y) instead of (row, column) (timm ``grid_indexing="xy"``).

Numerics are timm's, so that float64 models agree to rounding: grids and periods / bands are
made in float32; DINOv3's angles and sin / cos are then taken in the model's dtype (float64
for a float64 model), the axial and mixed forms' in float32 (timm caches them so).
"""

from __future__ import annotations

import math

import torch
from torch import Tensor, nn

from vitkit.registry.model_config import ViTConfig

F32 = torch.float32


def _grid(shape: tuple[int, int], kind: str, xy: bool, offset: float, ref: tuple | None) -> Tensor:
    """Coordinates [H * W, 2] of a (rows, columns) grid, row-major; channels (row, column), or
    (x, y) with ``xy``: timm's ``_build_grid`` ("centered" for dinov3, "index" otherwise)."""
    dims = [shape[1], shape[0]] if xy else list(shape)
    refs = None if ref is None else ([ref[1], ref[0]] if xy else list(ref))
    if kind == "dinov3":
        # (a traced side stays a symbol: float() would fix the grid at the traced size)
        t = [(torch.arange(0.5, s, dtype=F32) + offset) / _side(s) for s in dims]
    else:
        t = [torch.arange(s, dtype=torch.int64).to(F32) + offset for s in dims]
    if refs is not None:
        t = [x / f * r for x, f, r in zip(t, dims, refs)]
    grid = torch.stack(torch.meshgrid(t, indexing="xy" if xy else "ij"), dim=-1).to(F32)
    if kind == "dinov3":
        grid = 2.0 * grid - 1.0
    return grid.flatten(0, 1)


def _side(s: int) -> float | int:
    return s if isinstance(s, torch.SymInt) else float(s)


def _layout(x: Tensor, half: bool) -> Tensor:
    return torch.cat([x, x], dim=-1) if half else x.repeat_interleave(2, -1)


def mixed_freqs(head_dim: int, depth: int, heads: int, theta: float) -> Tensor:
    """RoPE-ViT mixed's initial frequencies [2, depth, heads, head_dim / 2]: axial magnitudes
    turned by a random angle per block and head (timm's ``init_random_2d_freqs``)."""
    mag = 1.0 / (theta ** (torch.arange(0, head_dim, 4, dtype=F32) / head_dim))[None, None]
    angles = torch.rand(depth, heads, 1) * 2 * torch.pi
    fx = torch.cat([mag * torch.cos(angles), mag * torch.cos(angles + torch.pi / 2)], dim=-1)
    fy = torch.cat([mag * torch.sin(angles), mag * torch.sin(angles + torch.pi / 2)], dim=-1)
    return torch.stack([fx, fy], dim=0)


class RotaryEmbedding(nn.Module):
    """The [sin, cos] table of a patch grid for every block (``ViTConfig.rope``)."""

    def __init__(self, cfg: ViTConfig) -> None:
        super().__init__()
        self.kind = cfg.rope
        self.head_dim = cfg.width // cfg.num_heads
        self.depth = cfg.depth
        self.theta = cfg.rope_theta
        self.rotate_half = cfg.rope_half
        self.xy = cfg.rope_xy
        self.offset = cfg.rope_offset
        self.ref_grid = cfg.rope_ref_grid
        self.hf = cfg.rope_hf
        if self.kind == "mixed":
            self.freqs = nn.Parameter(
                mixed_freqs(self.head_dim, cfg.depth, cfg.num_heads, cfg.rope_theta)
            )

    def forward(self, grid: tuple[int, int], dtype: torch.dtype) -> list[Tensor]:
        """Per block, [sin | cos]: [N, 2 head_dim] (mixed: [heads, N, 2 head_dim]) for a grid of
        (rows, columns) patches; ``dtype`` is the model's (float64 keeps DINOv3's angles so)."""
        n = self.head_dim // 4
        coords = _grid(grid, self.kind, self.xy, self.offset, self.ref_grid)  # [N, 2]
        if self.kind == "mixed":
            f = self.freqs.float()
            coords = coords.to(f.device)
            angles = coords[:, :1] * f[0].unsqueeze(-2) + coords[:, 1:] * f[1].unsqueeze(-2)
            emb = torch.cat([_layout(angles.sin(), False), _layout(angles.cos(), False)], -1)
            return list(emb.to(self.freqs.dtype).unbind(0))
        if self.kind == "dinov3" and self.hf:  # transformers' DINOv3ViTRopePositionEmbedding
            wide = torch.float64 if dtype == torch.float64 else F32
            inv = 1 / self.theta ** torch.arange(0, 1, 4 / self.head_dim, dtype=F32)
            angles = ((2 * math.pi * coords[:, :, None]).to(wide) * inv.to(wide)).flatten(1)
        elif self.kind == "dinov3":
            exps = 2.0 * torch.arange(n, dtype=F32) / (self.head_dim // 2)
            wide = torch.float64 if dtype == torch.float64 else F32
            periods = (self.theta**exps).to(wide)
            angles = (2 * math.pi * coords[:, :, None].to(wide) / periods[None, None, :]).flatten(1)
        else:  # axial
            bands = 1.0 / (self.theta ** (torch.arange(0, n, 1, dtype=torch.int64).to(F32) / n))
            angles = (coords[:, :, None] * bands).flatten(1)
        emb = torch.cat(
            [_layout(angles.sin(), self.rotate_half), _layout(angles.cos(), self.rotate_half)], -1
        )
        return [emb] * self.depth


def rotate(x: Tensor, emb: Tensor, half: bool, skip: int) -> Tensor:
    """Queries or keys [B, heads, T, head_dim] with the patch tokens (after the ``skip`` prefix
    tokens) rotated by ``emb`` = [sin | cos]; the result in ``x``'s dtype (timm's
    ``apply_rot_embed_cat``)."""
    sin, cos = emb.to(x.device).chunk(2, -1)
    p = x[:, :, skip:]
    if half:
        p1, p2 = p.chunk(2, dim=-1)
        turned = torch.cat([-p2, p1], dim=-1)
    else:
        turned = torch.stack([-p[..., 1::2], p[..., ::2]], -1).reshape(p.shape)
    return torch.cat([x[:, :, :skip], (p * cos + turned * sin).to(x.dtype)], dim=2)
