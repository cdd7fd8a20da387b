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
from vitkit.model import VisionTransformer


def patch_position_embeddings(model: VisionTransformer) -> Tensor:
    """The position embeddings of the patches, without the class token's: [gh, gw, D]."""
    cfg = model.cfg
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
