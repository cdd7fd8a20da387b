"""Relative position bias: an additive term on the attention logits that depends on where the
query and the key sit relative to each other (not in the paper; Shaw et al. 2018, Swin, BEiT).

    softmax(q k^T / sqrt(d) + B) v,   B[h, i, j] = f_h(row_i - row_j, col_i - col_j)

Two ways to get f, as timm has them (``ViTConfig.rel_pos``):

- ``"bias"``: a learned table with one row per offset, (2H - 1)(2W - 1) rows for an H x W
  patch grid, plus 3 rows when there is a class token (class-to-patch, patch-to-class,
  class-to-class), each a value per head. BEiT (timm ``beit.py``) and timm's ``RelPosBias``.
  The table belongs to its grid: another input size is refused (timm resamples the table
  with its own interpolation when asked to, which vitkit does not implement).
- ``"mlp"`` / ``"mlp_swin"``: a small MLP (2 -> ``rel_pos_dim`` -> heads, ReLU) of log-spaced
  offsets (Swin v2's continuous position bias; timm's ``RelPosMlp`` in its 'cr' and 'swin'
  modes). 'cr': sign(x) log(1 + |x|); 'swin': offsets scaled to [-8, 8] by the grid, then
  sign(x) log2(1 + |x|) / 3, and the MLP's output through 16 sigmoid(.). A class token gets a
  zero bias. It follows any input grid (the MLP weights do not depend on it), as timm's
  ``set_input_size`` does. The coordinates are computed in float32 and then cast, as timm does.

Per block (``blocks.{i}.attn.rel_pos``) or one for all blocks (``shared_rel_pos``,
``rel_pos_shared``); the model computes each block's bias once per forward
(:func:`attention_biases`) and :class:`vitkit.models.vit.Attention` adds it to its logits (the
fused kernel takes it as a float ``attn_mask``).
"""

from __future__ import annotations

import math
from collections.abc import Iterable

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from vitkit.errors import VitkitError
from vitkit.registry.model_config import ViTConfig


def relative_position_index(grid: tuple[int, int], class_token: bool) -> Tensor:
    """[T, T] row of the table for each (query, key) pair (timm's ``gen_relative_position_index``,
    BEiT's with the class token's 3 entries last)."""
    h, w = grid
    coords = torch.stack(torch.meshgrid(torch.arange(h), torch.arange(w), indexing="ij")).flatten(1)
    rel = (coords[:, :, None] - coords[:, None, :]).permute(1, 2, 0)  # [N, N, 2]
    index = (rel[:, :, 0] + h - 1) * (2 * w - 1) + (rel[:, :, 1] + w - 1)
    if class_token:
        n = (2 * h - 1) * (2 * w - 1)
        index = F.pad(index, [1, 0, 1, 0])
        index[0, 0:] = n  # class token to patches
        index[0:, 0] = n + 1  # patches to class token
        index[0, 0] = n + 2
    return index.contiguous()


def log_coords(grid: tuple[int, int], mode: str) -> Tensor:
    """[2H - 1, 2W - 1, 2] log-spaced offsets (timm's ``gen_relative_log_coords``), float32."""
    h, w = grid
    dh = torch.arange(-(h - 1), h).to(torch.float32)
    dw = torch.arange(-(w - 1), w).to(torch.float32)
    table = torch.stack(torch.meshgrid(dh, dw, indexing="ij")).permute(1, 2, 0).contiguous()
    if mode == "swin":
        table[:, :, 0] /= h - 1
        table[:, :, 1] /= w - 1
        table *= 8  # to [-8, 8]
        return torch.sign(table) * torch.log2(1.0 + table.abs()) / math.log2(8)
    return torch.sign(table) * torch.log(1.0 + table.abs())


class RelPosBias(nn.Module):
    """The learned table (``"bias"``): ``relative_position_bias_table`` [rows, heads]."""

    def __init__(self, cfg: ViTConfig) -> None:
        super().__init__()
        self.grid = cfg.grid_size
        self.prefix = int(cfg.has_class_token)
        h, w = self.grid
        rows = (2 * h - 1) * (2 * w - 1) + 3 * self.prefix
        self.relative_position_bias_table = nn.Parameter(torch.zeros(rows, cfg.num_heads))
        index = relative_position_index(self.grid, self.prefix > 0).view(-1)
        self.register_buffer("relative_position_index", index, persistent=False)

    def forward(self, grid: tuple[int, int]) -> Tensor:
        """The bias [1, heads, T, T] for the patch grid ``grid``."""
        if grid != self.grid:
            raise VitkitError(
                f"the relative position bias table is learned for a {self.grid[0]}x{self.grid[1]} "
                f"patch grid; these images make {grid[0]}x{grid[1]} (timm resamples the table "
                "for another size; vitkit does not): run at the model's own size"
            )
        t = self.grid[0] * self.grid[1] + self.prefix
        index: Tensor = self.relative_position_index  # type: ignore[assignment]
        bias = self.relative_position_bias_table[index].view(t, t, -1)
        return bias.permute(2, 0, 1).unsqueeze(0).contiguous()


class CoordMlp(nn.Module):
    """timm's ``Mlp(2, hidden, heads, act=ReLU, drop=(0.125, 0))``: ``fc1``, ``fc2``."""

    def __init__(self, hidden: int, heads: int, fc2_bias: bool) -> None:
        super().__init__()
        self.fc1 = nn.Linear(2, hidden)
        self.drop = nn.Dropout(0.125)  # timm's, in training only
        self.fc2 = nn.Linear(hidden, heads, bias=fc2_bias)

    def forward(self, x: Tensor) -> Tensor:
        return self.fc2(self.drop(torch.relu(self.fc1(x))))


class RelPosMlp(nn.Module):
    """The MLP of log offsets (``"mlp"``: timm's 'cr' mode; ``"mlp_swin"``: Swin v2's)."""

    def __init__(self, cfg: ViTConfig) -> None:
        super().__init__()
        self.mode = "swin" if cfg.rel_pos == "mlp_swin" else "cr"
        self.grid = cfg.grid_size
        self.prefix = int(cfg.has_class_token)
        self.heads = cfg.num_heads
        self.mlp = CoordMlp(cfg.rel_pos_dim, cfg.num_heads, fc2_bias=self.mode != "swin")
        index = relative_position_index(self.grid, False).view(-1)
        self.register_buffer("relative_position_index", index, persistent=False)
        self.register_buffer("rel_coords_log", log_coords(self.grid, self.mode), persistent=False)

    def forward(self, grid: tuple[int, int]) -> Tensor:
        """The bias [1, heads, T, T] for the patch grid ``grid`` (any grid)."""
        coords: Tensor = self.rel_coords_log  # type: ignore[assignment]
        index: Tensor = self.relative_position_index  # type: ignore[assignment]
        if grid != self.grid:
            dtype, device = coords.dtype, coords.device
            coords = log_coords(grid, self.mode).to(device=device, dtype=dtype)
            index = relative_position_index(grid, False).view(-1).to(device)
        n = grid[0] * grid[1]
        bias = self.mlp(coords).view(-1, self.heads)[index].view(n, n, self.heads)
        bias = bias.permute(2, 0, 1)
        if self.mode == "swin":
            bias = 16 * torch.sigmoid(bias)
        if self.prefix:
            bias = F.pad(bias, [self.prefix, 0, self.prefix, 0])
        return bias.unsqueeze(0).contiguous()


def make_rel_pos(cfg: ViTConfig) -> nn.Module:
    """The config's bias module (``cfg.rel_pos`` is not "none")."""
    return RelPosBias(cfg) if cfg.rel_pos == "bias" else RelPosMlp(cfg)


def attention_biases(
    blocks: Iterable[nn.Module], shared: nn.Module | None, grid: tuple[int, int]
) -> list[Tensor | None]:
    """Each block's additive attention bias for ``grid``: its own (``attn.rel_pos``) plus
    the shared one (BEiT adds both; timm relpos has one or the other); None without either."""
    common = shared(grid) if shared is not None else None
    out: list[Tensor | None] = []
    for block in blocks:
        own_module = getattr(getattr(block, "attn", None), "rel_pos", None)
        own = own_module(grid) if own_module is not None else None
        out.append(common if own is None else own if common is None else own + common)
    return out
