"""The figures of a run: the training curves of a ``metrics.jsonl`` (and reading it), a
confusion matrix, rows of images (the pre-training previews) and accuracy against training-set
size (a data-scale study). Drawn and written as every vitkit figure is (`vitkit.plotting.canvas`).
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from vitkit.errors import VitkitError
from vitkit.plotting.canvas import new_figure, save_accuracy_plot, save_png

if TYPE_CHECKING:
    from matplotlib.axes import Axes

ANNOTATE_MAX_CLASSES = 20  # write the value in every cell up to this many classes
TICK_LABELS_MAX_CLASSES = 50  # above this many classes, tick labels would be an unreadable smear

# (panel title, y label, ((record key, legend label), ...)) for plot_training_curves.
_PANELS: tuple[tuple[str, str, tuple[tuple[str, str], ...]], ...] = (
    ("loss", "loss", (("train_loss", "train"), ("val_loss", "val"))),
    (
        "accuracy",
        "accuracy",
        (("train_acc", "train"), ("val_top1", "val top-1"), ("val_acc", "val")),
    ),
    ("learning rate", "lr", (("lr", "lr"),)),
    ("throughput", "images / s", (("images_per_s", "train"),)),
)


def read_jsonl(path: str | os.PathLike[str]) -> list[dict[str, Any]]:
    """Read one JSON object per line, skipping blank lines.

    An unreadable *last* line is skipped: it is what a run killed in the middle of a write
    leaves behind. An unreadable line anywhere else is corruption and raises ``VitkitError``.
    """
    path = Path(path)
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        raise VitkitError(f"metrics file not found: {path}") from None
    lines = [(i, line) for i, line in enumerate(data.split(b"\n"), start=1) if line.strip()]
    records: list[dict[str, Any]] = []
    for pos, (lineno, raw) in enumerate(lines):
        try:
            record = json.loads(raw.decode("utf-8"))
        except (UnicodeDecodeError, json.JSONDecodeError) as e:
            if pos == len(lines) - 1:
                break  # truncated by an interrupted write
            raise VitkitError(f"{path}:{lineno}: not valid JSON ({e})") from None
        if not isinstance(record, dict):
            if pos == len(lines) - 1:
                break  # a truncated object can still parse, e.g. as a bare number
            raise VitkitError(
                f"{path}:{lineno}: expected a JSON object, got {type(record).__name__}"
            )
        records.append(record)
    return records


def plot_confusion_matrix(
    confusion: np.ndarray,
    class_names: Sequence[str],
    path: str | os.PathLike[str],
    *,
    normalize: bool = True,
    title: str | None = None,
) -> Path:
    """Draw ``confusion`` (rows = true class, columns = predicted) as a heatmap PNG at ``path``.

    ``normalize`` divides each row by its count, so the diagonal is the per-class accuracy
    (a class with no samples stays 0). Cells are annotated with their value up to
    ``ANNOTATE_MAX_CLASSES`` classes. Returns the path written.
    """
    confusion = np.asarray(confusion)
    if confusion.ndim != 2 or confusion.shape[0] != confusion.shape[1]:
        raise VitkitError(f"confusion must be a square [K, K] array, got shape {confusion.shape}")
    k = confusion.shape[0]
    if k == 0:
        raise VitkitError("confusion matrix is empty (0 classes)")
    if len(class_names) != k:
        raise VitkitError(f"got {len(class_names)} class names for a {k}x{k} confusion matrix")

    counts = confusion.astype(np.float64)
    if normalize:
        row_sums = counts.sum(axis=1, keepdims=True)
        values = np.divide(counts, row_sums, out=np.zeros_like(counts), where=row_sums > 0)
        vmax = 1.0
    else:
        values = counts
        vmax = max(float(values.max()), 1.0)

    side = min(max(4.0, 0.45 * k + 2.5), 14.0)
    fig = new_figure((side + 1.2, side))
    ax = fig.add_subplot(1, 1, 1)
    image = ax.imshow(values, cmap="Blues", vmin=0.0, vmax=vmax, interpolation="nearest")
    fig.colorbar(image, ax=ax, fraction=0.046, pad=0.04)
    ax.set_xlabel("predicted class")
    ax.set_ylabel("true class")
    if title is None:
        title = "confusion matrix" + (" (row-normalised)" if normalize else " (counts)")
    ax.set_title(title)

    if k <= TICK_LABELS_MAX_CLASSES:
        names = [str(n) for n in class_names]
        ax.set_xticks(range(k))
        ax.set_yticks(range(k))
        ax.set_xticklabels(names, rotation=45, ha="right", rotation_mode="anchor")
        ax.set_yticklabels(names)

    if k <= ANNOTATE_MAX_CLASSES:
        fontsize = 9 if k <= 10 else 7
        for i in range(k):
            for j in range(k):
                v = values[i, j]
                text = f"{v:.2f}" if normalize else f"{int(confusion[i, j])}"
                color = "white" if v > 0.5 * vmax else "black"
                ax.text(j, i, text, ha="center", va="center", color=color, fontsize=fontsize)

    fig.tight_layout()
    return save_png(fig, path)


def plot_training_curves(
    records: Sequence[dict[str, Any]],
    path: str | os.PathLike[str],
    *,
    title: str | None = None,
) -> Path:
    """Plot loss, accuracy, learning rate (and throughput, if logged) against ``step``.

    ``records`` are the lines of a ``metrics.jsonl``. A record without ``step`` is ignored, a
    key no record has is skipped, a panel with no data is left out. Returns the path written.
    """
    stepped = [r for r in records if _is_number(r.get("step"))]
    panels = []
    for panel_title, ylabel, series in _PANELS:
        lines = []
        for key, label in series:
            points = [(r["step"], r[key]) for r in stepped if _is_number(r.get(key))]
            if points:
                lines.append((label, points))
        if lines:
            panels.append((panel_title, ylabel, lines))
    if not panels:
        known = ", ".join(key for _, _, series in _PANELS for key, _ in series)
        raise VitkitError(
            f"nothing to plot: none of {len(records)} records has 'step' and any of: {known}"
        )

    ncols = 2 if len(panels) == 4 else len(panels)
    nrows = 2 if len(panels) == 4 else 1
    fig = new_figure((5.0 * ncols, 3.6 * nrows))
    for index, (panel_title, ylabel, lines) in enumerate(panels, start=1):
        ax = fig.add_subplot(nrows, ncols, index)
        _draw_panel(ax, panel_title, ylabel, lines)
    if title is not None:
        fig.suptitle(title)
    fig.tight_layout()
    return save_png(fig, path)


def plot_image_rows(
    rows: Sequence[tuple[str, Any]],
    path: str | os.PathLike[str],
    *,
    title: str | None = None,
) -> Path:
    """A grid of images: one row per ``(label, images)``, images ``[B, C, H, W]`` in [0, 1]
    (C = 1 or 3, a tensor or array). Used for the pre-training previews."""
    if not rows:
        raise VitkitError("nothing to plot: no rows of images")
    cols = max(len(images) for _, images in rows)
    fig = new_figure((1.3 * cols + 1.4, 1.35 * len(rows) + 0.5))
    for r, (label, images) in enumerate(rows):
        arr = np.asarray(images.detach().float().cpu() if hasattr(images, "detach") else images)
        for c in range(len(arr)):
            ax = fig.add_subplot(len(rows), cols, r * cols + c + 1)
            img = np.clip(arr[c].transpose(1, 2, 0), 0.0, 1.0)
            if img.shape[-1] == 1:
                ax.imshow(img[..., 0], cmap="gray", vmin=0.0, vmax=1.0, interpolation="nearest")
            else:
                ax.imshow(img, interpolation="nearest")
            ax.set_xticks([])
            ax.set_yticks([])
            if c == 0:
                ax.set_ylabel(label, fontsize=8)
    if title is not None:
        fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    return save_png(fig, path)


def _draw_panel(
    ax: Axes, title: str, ylabel: str, lines: list[tuple[str, list[tuple[float, float]]]]
) -> None:
    from matplotlib.ticker import MaxNLocator

    for label, points in lines:
        points = sorted(points, key=lambda p: p[0])
        xs = [p[0] for p in points]
        ys = [p[1] for p in points]
        marker = "o" if len(points) <= 30 else None  # a lone point needs a marker to be seen
        ax.plot(xs, ys, label=label, marker=marker, markersize=3, linewidth=1.2)
    ax.set_title(title)
    ax.set_xlabel("step")
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_ylabel(ylabel)
    ax.grid(True, alpha=0.3)
    ax.ticklabel_format(axis="y", style="sci", scilimits=(-3, 4))
    if len(lines) > 1:
        ax.legend()


def _is_number(value: Any) -> bool:
    """True for an int or float (not a bool); NaN counts, so a diverged loss shows as a gap."""
    return (
        isinstance(value, int | float)
        and not isinstance(value, bool)
        and not (isinstance(value, float) and math.isinf(value))
    )


def plot_data_scale(
    rows: Sequence[dict[str, Any]],
    runs: Sequence[dict[str, Any]],
    path: str | os.PathLike[str],
    title: str = "",
) -> Path:
    """Test accuracy against training-set size (log axis), one line per model: the mean over
    seeds with a ±1 std band, every seed as a dot (the paper's Figure 3/4 in miniature).

    ``rows``: dicts with model, short_name, size, mean, std, params; ``runs``: model, size,
    test_top1 per run.
    """
    if not rows:
        raise VitkitError(f"{path}: nothing to plot (no runs)")
    fig = new_figure((7.0, 4.6))
    ax = fig.add_subplot(1, 1, 1)
    models = list(dict.fromkeys(r["model"] for r in rows))
    for i, model in enumerate(models):
        color = f"C{i % 10}"
        mine = sorted((r for r in rows if r["model"] == model), key=lambda r: r["size"])
        x = np.array([r["size"] for r in mine], dtype=float)
        mean = np.array([100 * r["mean"] for r in mine])
        std = np.array([100 * r["std"] for r in mine])
        label = f"{model} ({mine[0]['short_name']}, {mine[0]['params'] / 1e6:.2f}M params)"
        ax.plot(x, mean, "-o", color=color, label=label, markersize=4)
        if len(x) and std.any():
            ax.fill_between(x, mean - std, mean + std, color=color, alpha=0.15, linewidth=0)
        dots = [(r["size"], 100 * r["test_top1"]) for r in runs if r["model"] == model]
        if dots:
            dx, dy = zip(*dots)
            ax.scatter(dx, dy, color=color, s=10, alpha=0.5, linewidths=0)
    ax.set_xscale("log")
    sizes = sorted({r["size"] for r in rows})
    ax.set_xticks(sizes)
    ax.set_xticklabels([f"{s:,}" for s in sizes])
    ax.minorticks_off()
    ax.set_xlabel("training images (class-stratified subset)")
    return save_accuracy_plot(fig, ax, path, title)


__all__ = [
    "plot_confusion_matrix",
    "plot_data_scale",
    "plot_image_rows",
    "plot_training_curves",
    "read_jsonl",
]
