"""The analysis figures as PNGs: embedding filters, position-embedding similarity, attention
distance (the three panels of the paper's Figure 7), attention rollout overlays (Figure 6) and
per-layer attention maps.

Grids of many small maps (a 14 x 14 grid of 14 x 14 similarity maps, 24 layers x 16 heads of
attention) are drawn as one mosaic image with blank gutters rather than hundreds of matplotlib
axes, so even an L/16 figure takes a second. Drawn and written as every vitkit figure is
(`vitkit.plotting.canvas`).

The maps come from `vitkit.analysis`, which computes them; this module only draws, and imports
nothing from `vitkit.analysis` (`vitkit.analysis` re-exports these functions).
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path
from typing import Protocol

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor

from vitkit.errors import VitkitError
from vitkit.plotting.canvas import new_figure, save_png


class FilterComponents(Protocol):
    """What the filters figure draws (``vitkit.analysis.filters.FilterComponents`` has it)."""

    components: Tensor  # [k, C, P_h, P_w]
    explained_variance_ratio: Tensor  # [k]


def _mosaic(tiles: np.ndarray, gap: int = 1) -> np.ndarray:
    """[rows, cols, h, w(, 3)] → one image with ``gap`` NaN pixels between the tiles."""
    rows, cols, h, w = tiles.shape[:4]
    extra = tiles.shape[4:]
    out = np.full((rows * (h + gap) - gap, cols * (w + gap) - gap, *extra), np.nan)
    for r in range(rows):
        for c in range(cols):
            out[r * (h + gap) : r * (h + gap) + h, c * (w + gap) : c * (w + gap) + w] = tiles[r, c]
    return out


def _tile_ticks(ax, n: int, size: int, gap: int, axis: str, labels: Sequence[str]) -> None:
    centres = [i * (size + gap) + (size - 1) / 2 for i in range(n)]
    if axis == "x":
        ax.set_xticks(centres)
        ax.set_xticklabels(labels)
    else:
        ax.set_yticks(centres)
        ax.set_yticklabels(labels)


def _every(n: int, most: int = 16) -> list[str]:
    """Tick labels 1..n, thinned to at most ``most`` shown."""
    step = max(1, -(-n // most))
    return [str(i + 1) if i % step == 0 or i == n - 1 else "" for i in range(n)]


def _cmap(name: str):
    import matplotlib

    return matplotlib.colormaps[name].with_extremes(bad="white")


def _display(image: Tensor) -> tuple[np.ndarray, str | None]:
    """[C, H, W] in [0, 1] → an array for imshow and the colormap it needs."""
    img = image.detach().float().clamp(0, 1).cpu()
    if img.shape[0] == 3:
        return img.permute(1, 2, 0).numpy(), None
    return img.mean(dim=0).numpy(), "gray"


# ---------------------------------------------------------------------------------------------
# Figure 7


def plot_embedding_filters(
    pca: FilterComponents, path: str | os.PathLike[str], *, title: str | None = None
) -> Path:
    """The principal components of the embedding filters as tiles: RGB for 3-channel models
    (each tile scaled to [0, 1] on its own), grayscale otherwise (the mean over channels)."""
    comps = pca.components.numpy()  # [k, C, ph, pw]
    k, c, ph, pw = comps.shape
    cols = min(7, k)
    rows = -(-k // cols)
    lo = comps.reshape(k, -1).min(axis=1)[:, None, None, None]
    hi = comps.reshape(k, -1).max(axis=1)[:, None, None, None]
    scaled = (comps - lo) / np.maximum(hi - lo, 1e-12)
    tiles = scaled.transpose(0, 2, 3, 1) if c == 3 else scaled.mean(axis=1)
    fig = new_figure((1.15 * cols + 0.4, 1.25 * rows + 0.8))
    for i in range(k):
        ax = fig.add_subplot(rows, cols, i + 1)
        ax.imshow(tiles[i], cmap=None if c == 3 else "gray", interpolation="nearest")
        ax.set_xticks([])
        ax.set_yticks([])
        ax.set_title(f"{i + 1}: {100 * float(pca.explained_variance_ratio[i]):.1f}%", fontsize=7)
    fig.suptitle(title or f"Embedding filters: first {k} principal components", fontsize=10)
    fig.tight_layout()
    return save_png(fig, path)


def plot_position_similarity(
    sim: Tensor, path: str | os.PathLike[str], *, title: str | None = None
) -> Path:
    """Tile (r, c) is the cosine similarity of patch (r, c)'s position embedding with every
    patch's, on the grid (the paper's Figure 7, centre)."""
    if sim.ndim != 4:
        raise VitkitError(f"expected a [gh, gw, gh, gw] similarity, got {tuple(sim.shape)}")
    gh, gw = sim.shape[:2]
    gap = max(1, min(gh, gw) // 7)
    mosaic = _mosaic(sim.numpy(), gap)
    side = min(11.0, max(4.5, 0.45 * max(gh, gw) + 2))
    fig = new_figure((side * gw / max(gh, gw) + 1.4, side * gh / max(gh, gw) + 0.6))
    ax = fig.add_subplot(1, 1, 1)
    image = ax.imshow(mosaic, cmap=_cmap("viridis"), vmin=-1, vmax=1, interpolation="nearest")
    _tile_ticks(ax, gw, gw, gap, "x", _every(gw))
    _tile_ticks(ax, gh, gh, gap, "y", _every(gh))
    ax.set_xlabel("input patch column")
    ax.set_ylabel("input patch row")
    ax.tick_params(length=0)
    for spine in ax.spines.values():
        spine.set_visible(False)
    fig.colorbar(image, ax=ax, fraction=0.046, pad=0.03, label="cosine similarity")
    ax.set_title(title or "Position embedding similarity")
    fig.tight_layout()
    return save_png(fig, path)


def plot_attention_distance(
    distance: Tensor,
    path: str | os.PathLike[str],
    *,
    uniform: float | None = None,
    title: str | None = None,
) -> Path:
    """Mean attention distance of every head against network depth, one dot per head, with the
    mean over heads as a line (the paper's Figure 7, right). ``distance`` is [L, heads];
    ``uniform``, if given, is drawn as a dotted line: the distance of a head that attends to all
    patches equally."""
    if distance.ndim != 2:
        raise VitkitError(f"expected attention distances [layers, heads], got {distance.shape}")
    d = distance.numpy()
    layers, heads = d.shape
    fig = new_figure((6.0, 4.2))
    ax = fig.add_subplot(1, 1, 1)
    depth = np.arange(1, layers + 1)
    cmap = _cmap("tab20" if heads > 10 else "tab10")
    for h in range(heads):
        label = f"head {h + 1}" if heads <= 16 else None
        ax.scatter(depth, d[:, h], s=14, color=cmap(h % cmap.N), label=label, zorder=3)
    ax.plot(depth, d.mean(axis=1), color="black", linewidth=1.2, label="mean", zorder=2)
    top = float(np.nanmax(d)) if d.size else 1.0
    if uniform is not None:
        ax.axhline(uniform, color="gray", linestyle=":", linewidth=1.2, label="uniform attention")
        top = max(top, uniform)
    ax.set_xlabel("network depth (layer)")
    ax.set_ylabel("mean attention distance (pixels)")
    ax.set_xticks(depth if layers <= 24 else depth[:: -(-layers // 24)])
    ax.set_ylim(0, 1.1 * top)
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=7, ncol=2 if heads > 6 else 1, loc="lower right")
    ax.set_title(title or "Mean attention distance by head and depth")
    fig.tight_layout()
    return save_png(fig, path)


# ---------------------------------------------------------------------------------------------
# Figure 6 and per-layer maps


def upsample_map(maps: Tensor, size: tuple[int, int]) -> Tensor:
    """[..., gh, gw] → [..., H, W] by bilinear interpolation (for drawing over the image)."""
    lead = maps.shape[:-2]
    flat = maps.reshape(-1, 1, *maps.shape[-2:]).float()
    up = F.interpolate(flat, size=tuple(size), mode="bilinear", align_corners=False)
    return up.reshape(*lead, *size)


def _heat(map_: Tensor, size: tuple[int, int]) -> np.ndarray:
    """A patch-grid map upsampled to the image and scaled to [0, 1] by its maximum."""
    up = upsample_map(map_, size).clamp_min(0)
    return (up / up.max().clamp_min(1e-12)).numpy()


def _masked(image: np.ndarray, heat: np.ndarray) -> np.ndarray:
    """The paper's Figure 6: the image multiplied by the (max-normalised) rollout."""
    return image * (heat[..., None] if image.ndim == 3 else heat)


def plot_rollout(
    image: Tensor,
    rollout: Tensor,
    path: str | os.PathLike[str],
    *,
    title: str | None = None,
    label: str = "attention rollout",
) -> Path:
    """Three panels: the input, the attention rollout upsampled to the image (with the patch
    grid; scaled to its maximum), and the input multiplied by it (the paper's Figure 6).

    ``image`` is [C, H, W] in [0, 1]; ``rollout`` [gh, gw] over the patches (any map over them:
    ``label`` names it, e.g. a MAP head's attention)."""
    img, cmap = _display(image)
    size = (image.shape[-2], image.shape[-1])
    heat = _heat(rollout, size)
    fig = new_figure((9.6, 3.6))
    panels = [("input", img, cmap), (label, None, None)]
    panels.append((f"input x {label.split()[-1]}", _masked(img, heat), cmap))
    for i, (name, data, cm) in enumerate(panels, start=1):
        ax = fig.add_subplot(1, 3, i)
        if data is None:  # the map alone: an overlay would let bright pixels pass for attention
            ax.imshow(heat, cmap="inferno", vmin=0, vmax=1)
            gh, gw = rollout.shape
            for r in range(1, gh):
                ax.axhline(r * size[0] / gh - 0.5, color="white", linewidth=0.3, alpha=0.4)
            for c in range(1, gw):
                ax.axvline(c * size[1] / gw - 0.5, color="white", linewidth=0.3, alpha=0.4)
        else:
            ax.imshow(data, cmap=cm, vmin=0, vmax=1, interpolation="nearest")
        ax.set_title(name, fontsize=10)
        ax.set_xticks([])
        ax.set_yticks([])
    if title:
        fig.suptitle(title, fontsize=11)
    fig.tight_layout(rect=(0, 0, 1, 0.94 if title else 1))
    return save_png(fig, path)


def plot_layer_maps(
    layer_maps: Tensor,
    rollout_maps: Tensor,
    path: str | os.PathLike[str],
    *,
    image: Tensor | None = None,
    title: str | None = None,
) -> Path:
    """Rows are layers; columns each head's attention from the pooled query (class token, or
    the mean query for GAP models) over the patches, the mean over heads, and the rollout up
    to that layer. Each tile is scaled by its own maximum (bright = most attended).

    ``layer_maps`` is [L, heads, gh, gw], ``rollout_maps`` [L, gh, gw]; ``image`` [C, H, W] in
    [0, 1], if given, is shown beside the grid."""
    layers, heads, gh, gw = layer_maps.shape
    tiles = torch.cat([layer_maps, layer_maps.mean(dim=1, keepdim=True), rollout_maps[:, None]], 1)
    peak = tiles.amax(dim=(-2, -1), keepdim=True).clamp_min(1e-12)
    gap = max(1, min(gh, gw) // 6)
    mosaic = _mosaic((tiles / peak).numpy(), gap)
    cols = heads + 2
    tile_in = 0.55 if max(layers, cols) <= 16 else 0.38
    grid_w, grid_h = cols * tile_in * gw / max(gh, gw), layers * tile_in * gh / max(gh, gw)
    img_w = 2.6 if image is not None else 0.0
    fig = new_figure((grid_w + img_w + 1.6, max(grid_h, 2.0) + 1.2))
    if image is not None:
        ax_img = fig.add_axes((0.02, 0.3, img_w / (grid_w + img_w + 1.6) * 0.95, 0.45))
        img, cmap = _display(image)
        ax_img.imshow(img, cmap=cmap, interpolation="nearest")
        ax_img.set_xticks([])
        ax_img.set_yticks([])
        ax_img.set_title("input", fontsize=9)
        left = (img_w + 0.3) / (grid_w + img_w + 1.6)
        ax = fig.add_axes((left, 0.08, 1 - left - 0.02, 0.8))
    else:
        ax = fig.add_subplot(1, 1, 1)
    ax.imshow(mosaic, cmap=_cmap("inferno"), vmin=0, vmax=1, interpolation="nearest")
    col_labels = [f"h{h + 1}" for h in range(heads)] + ["mean", "rollout"]
    _tile_ticks(ax, cols, gw, gap, "x", col_labels)
    _tile_ticks(ax, layers, gh, gap, "y", [f"layer {i + 1}" for i in range(layers)])
    ax.xaxis.tick_top()
    ax.tick_params(length=0, labelsize=7 if cols > 10 else 8)
    for spine in ax.spines.values():
        spine.set_visible(False)
    if title:
        fig.suptitle(title, fontsize=10, y=0.995)
    return save_png(fig, path)


def plot_rollout_examples(
    images: Tensor,
    rollouts: Tensor,
    path: str | os.PathLike[str],
    *,
    captions: Sequence[str] | None = None,
    boxes: Tensor | None = None,
    title: str | None = None,
) -> Path:
    """A grid of examples, each three panels: the input, the rollout upsampled to the image, and
    the input multiplied by the rollout (Figure 6), with the object box drawn where there is
    one. ``images`` [N, C, H, W] in [0, 1], ``rollouts`` [N, gh, gw], ``boxes`` [N, 4]
    (x0, y0, x1, y1) in pixels."""
    from matplotlib.patches import Rectangle

    n = images.shape[0]
    if n == 0:
        raise VitkitError("no images to draw")
    per_row = min(3, n)
    rows = -(-n // per_row)
    fig = new_figure((per_row * 4.2, rows * 1.6 + 0.5))
    size = (images.shape[-2], images.shape[-1])
    for i in range(n):
        img, cmap = _display(images[i])
        heat = _heat(rollouts[i], size)
        for j in range(3):
            ax = fig.add_subplot(rows, 3 * per_row, 3 * i + j + 1)
            if j == 1:  # the map alone: an overlay would let bright pixels pass for attention
                ax.imshow(heat, cmap="inferno", vmin=0, vmax=1)
            else:
                data = img if j == 0 else _masked(img, heat)
                ax.imshow(data, cmap=cmap, vmin=0, vmax=1, interpolation="nearest")
            if j > 0 and boxes is not None:
                x0, y0, x1, y1 = (float(v) for v in boxes[i])
                box = Rectangle((x0 - 0.5, y0 - 0.5), x1 - x0, y1 - y0, fill=False, lw=1)
                box.set_edgecolor("cyan")
                ax.add_patch(box)
            ax.set_xticks([])
            ax.set_yticks([])
            if j == 0 and captions is not None:
                ax.set_title(captions[i], fontsize=7, loc="left")
    fig.suptitle(title or "Attention rollout: input, rollout, input x rollout", fontsize=10)
    fig.tight_layout()
    return save_png(fig, path)


__all__ = [
    "plot_attention_distance",
    "plot_embedding_filters",
    "plot_layer_maps",
    "plot_position_similarity",
    "plot_rollout",
    "plot_rollout_examples",
    "upsample_map",
]
