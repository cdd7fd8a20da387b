"""Position-embedding similarity (the paper's Figure 7, centre).

The cosine similarity of each patch's learned position embedding with every other patch's,
arranged on the patch grid: tile (r, c) of the figure is the similarity of patch (r, c) to all
patches. The class token's embedding is left out (it has no grid position). A model that has
learned the 2-D layout shows a bright spot around each tile's own position, and row/column
stripes (Figure 7 of the paper).

:func:`similarity_by_distance` turns that into numbers: the mean cosine of adjacent pairs
(4-neighbours: same row or column, one patch apart), of other pairs in the same row or
column, and of far pairs (grid distance at least half the longer grid side).
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor

from vitkit.errors import VitkitError
from vitkit.models.naflex_packing import pos_embed_for_grid
from vitkit.models.vit import VisionTransformer


def patch_position_embeddings(model: VisionTransformer) -> Tensor:
    """The position embeddings of the patches, without the class token's: [gh, gw, D]. A
    NaFlex model's are on their own grid (``naflex_grid``; a factorised table summed there)."""
    cfg = model.cfg
    if model.pos_embed is None:
        raise VitkitError("the model has no learned position embeddings (abs_pos_embed=False)")
    if cfg.naflex:
        table = pos_embed_for_grid(model.pos_embed.detach().float().cpu(), cfg, cfg.naflex_grid)
        return table[0].reshape(*cfg.naflex_grid, -1)
    pe = model.pos_embed.detach().float().cpu()[0, cfg.num_pos_prefix :]
    return pe.reshape(*cfg.grid_size, -1)


def position_embedding_similarity(model: VisionTransformer) -> Tensor:
    """Cosine similarity of every patch's position embedding with every other's,
    [gh, gw, gh, gw]: ``sim[r, c]`` is the map of patch (r, c) over the grid."""
    pe = patch_position_embeddings(model)
    gh, gw, d = pe.shape
    unit = F.normalize(pe.reshape(gh * gw, d).double(), dim=-1)
    return (unit @ unit.T).reshape(gh, gw, gh, gw).float()


@dataclass(frozen=True)
class PositionSimilarityStats:
    """Mean cosine similarity of position embeddings by how far apart the patches are."""

    adjacent: float  # 4-neighbours: same row or column, one patch apart
    same_row_or_column: float  # same row or column, two or more patches apart
    far: float  # grid distance >= far_distance
    other: float  # every pair of distinct patches
    far_distance: float  # in patches
    by_distance: tuple[tuple[float, float], ...]  # (grid distance, mean cosine), ascending

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["by_distance"] = [list(p) for p in self.by_distance]
        return d


def similarity_by_distance(sim: Tensor) -> PositionSimilarityStats:
    """Summarise a [gh, gw, gh, gw] similarity (:func:`position_embedding_similarity`)."""
    if sim.ndim != 4 or sim.shape[:2] != sim.shape[2:]:
        raise VitkitError(f"expected a [gh, gw, gh, gw] similarity, got {tuple(sim.shape)}")
    gh, gw = sim.shape[:2]
    if gh * gw < 2:
        raise VitkitError("a grid of one patch has no pairs to compare")
    ys, xs = torch.meshgrid(torch.arange(gh), torch.arange(gw), indexing="ij")
    ys, xs = ys.reshape(-1).double(), xs.reshape(-1).double()
    dy, dx = (ys[:, None] - ys[None, :]).abs(), (xs[:, None] - xs[None, :]).abs()
    dist = torch.sqrt(dy**2 + dx**2)
    s = sim.reshape(gh * gw, gh * gw).double()
    distinct = dist > 0
    line = (dy == 0) | (dx == 0)
    far_distance = max(gh, gw) / 2

    def mean(mask: Tensor) -> float:
        return float(s[mask].mean()) if bool(mask.any()) else math.nan

    by_distance = tuple(
        (round(float(d), 4), mean((dist - d).abs() < 1e-9))
        for d in torch.unique(dist[distinct]).tolist()
    )
    return PositionSimilarityStats(
        adjacent=mean(dist == 1),
        same_row_or_column=mean(line & (dist >= 2)),
        far=mean(dist >= far_distance),
        other=mean(distinct),
        far_distance=far_distance,
        by_distance=by_distance,
    )


@dataclass(frozen=True)
class RowColumnStats:
    """Row/column structure of a position-embedding similarity (the paper's Figure 7, centre:
    "patches in the same row/column have similar embeddings"), as mean cosine similarities."""

    same_row: float  # distinct patches in the same row
    same_column: float  # distinct patches in the same column
    other: float  # pairs in neither the same row nor the same column
    line_excess: float  # mean over rows and columns minus `other`
    # The same comparison at equal distance, so that locality alone does not count as
    # row/column structure: for every whole distance k, the pairs on a line k patches apart
    # minus the off-line pairs' similarity at distance k (linearly interpolated between the
    # off-line distances that occur, sqrt(2), sqrt(5), ...); the mean over k inside that range.
    line_excess_at_distance: float

    def to_dict(self) -> dict[str, float]:
        return asdict(self)


def row_column_structure(sim: Tensor) -> RowColumnStats:
    """Summarise a [gh, gw, gh, gw] similarity (:func:`position_embedding_similarity`) by
    whether patches in the same row or column are more alike than other pairs."""
    if sim.ndim != 4 or sim.shape[:2] != sim.shape[2:]:
        raise VitkitError(f"expected a [gh, gw, gh, gw] similarity, got {tuple(sim.shape)}")
    gh, gw = sim.shape[:2]
    if gh < 2 or gw < 2:
        raise VitkitError(f"a {gh} x {gw} grid has no pairs off its rows and columns to compare")
    ys, xs = torch.meshgrid(torch.arange(gh), torch.arange(gw), indexing="ij")
    ys, xs = ys.reshape(-1).double(), xs.reshape(-1).double()
    dy, dx = (ys[:, None] - ys[None, :]).abs(), (xs[:, None] - xs[None, :]).abs()
    dist = torch.sqrt(dy**2 + dx**2)
    s = sim.reshape(gh * gw, gh * gw).double()
    row, column = (dy == 0) & (dx > 0), (dx == 0) & (dy > 0)
    line, off = row | column, (dy > 0) & (dx > 0)

    def mean(mask: Tensor) -> float:
        return float(s[mask].mean()) if bool(mask.any()) else math.nan

    off_d = torch.unique(dist[off])
    off_s = torch.stack([s[off & ((dist - d).abs() < 1e-9)].mean() for d in off_d])
    diffs = []
    for k in range(1, max(gh, gw)):
        if not off_d[0] <= k <= off_d[-1]:
            continue
        j = int(torch.searchsorted(off_d, torch.tensor(float(k), dtype=off_d.dtype)))
        j = min(max(j, 1), len(off_d) - 1)
        d0, d1, s0, s1 = off_d[j - 1], off_d[j], off_s[j - 1], off_s[j]
        expected = float(s0 + (s1 - s0) * (k - d0) / (d1 - d0))
        diffs.append(mean(line & (dist == k)) - expected)
    return RowColumnStats(
        same_row=mean(row),
        same_column=mean(column),
        other=mean(off),
        line_excess=mean(line) - mean(off),
        line_excess_at_distance=sum(diffs) / len(diffs) if diffs else math.nan,
    )
