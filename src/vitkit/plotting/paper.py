"""The figures of the paper-finding studies (`vitkit.studies`): attention distance of every head
of several seeds against depth, accuracy against the labelled fraction per pre-training, and
fine-tuning at two resolutions beside few-shot against fine-tuned accuracy.

Drawn as every vitkit figure is (`vitkit.plotting.canvas`); the numbers come from the studies.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
from torch import Tensor

from vitkit.errors import VitkitError
from vitkit.plotting.canvas import new_figure, save_accuracy_plot, save_png


def plot_distance_by_depth(
    distances: Sequence[Tensor],
    path: str | os.PathLike[str],
    *,
    uniform: float,
    thresholds: tuple[float, float],
    title: str = "",
) -> Path:
    """One dot per head and seed ([L, heads] per seed, seeds side by side within a layer), the
    mean over heads and seeds as a line; the uniform distance dotted, the global and local
    thresholds dashed (the paper's Figure 7, right)."""
    if not distances:
        raise VitkitError(f"{path}: no attention distances to plot")
    fig = new_figure((6.4, 4.4))
    ax = fig.add_subplot(1, 1, 1)
    seeds = len(distances)
    layers = distances[0].shape[0]
    depth = np.arange(1, layers + 1)
    for s, d in enumerate(distances):
        arr = d.double().numpy()
        offset = (s - (seeds - 1) / 2) * 0.12
        for h in range(arr.shape[1]):
            ax.scatter(depth + offset, arr[:, h], s=10, color=f"C{s % 10}", alpha=0.7,
                       label=f"seed {s}" if h == 0 else None, zorder=3)  # fmt: skip
    mean = np.mean([d.double().numpy().mean(axis=1) for d in distances], axis=0)
    ax.plot(depth, mean, color="black", linewidth=1.2, label="mean over heads and seeds")
    ax.axhline(uniform, color="gray", linestyle=":", linewidth=1.2, label="uniform attention")
    ax.axhline(thresholds[0], color="gray", linestyle="--", linewidth=0.8, label="global / local")
    ax.axhline(thresholds[1], color="gray", linestyle="--", linewidth=0.8)
    ax.set_xlabel("network depth (layer)")
    ax.set_ylabel("mean attention distance (pixels)")
    ax.set_xticks(depth)
    ax.set_ylim(0, 1.1 * max(uniform, max(float(d.max()) for d in distances)))
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=7, loc="lower right")
    ax.set_title(title or "Mean attention distance by head and depth", fontsize=10)
    fig.tight_layout()
    return save_png(fig, path)


def plot_label_fractions(rows: Sequence[dict[str, Any]], path: str | os.PathLike[str],
                         title: str = "") -> Path:  # fmt: skip
    """Test accuracy against the labelled fraction (log axis), one line per start: mean over
    seeds with a ±1 std band. ``rows``: method, fraction, mean, std."""
    if not rows:
        raise VitkitError(f"{path}: nothing to plot (no runs)")
    fig = new_figure((6.4, 4.4))
    ax = fig.add_subplot(1, 1, 1)
    for i, method in enumerate(dict.fromkeys(r["method"] for r in rows)):
        mine = sorted((r for r in rows if r["method"] == method), key=lambda r: r["fraction"])
        x = np.array([100 * r["fraction"] for r in mine])
        mean = np.array([100 * r["mean"] for r in mine])
        std = np.array([100 * r["std"] for r in mine])
        ax.plot(x, mean, "-o", color=f"C{i % 10}", label=method, markersize=4)
        if std.any():
            ax.fill_between(x, mean - std, mean + std, color=f"C{i % 10}", alpha=0.15, lw=0)
    fractions = sorted({100 * r["fraction"] for r in rows})
    ax.set_xscale("log")
    ax.set_xticks(fractions)
    ax.set_xticklabels([f"{f:g} %" for f in fractions])
    ax.minorticks_off()
    ax.set_xlabel("labelled training images")
    return save_accuracy_plot(fig, ax, path, title)


def plot_resolution(
    arms: dict[str, dict[str, Any]],
    points: Sequence[dict[str, Any]],
    path: str | os.PathLike[str],
    *,
    rho: float,
    title: str = "",
) -> Path:
    """Left: fine-tuned accuracy per model at the two resolutions (bars, mean ± std). Right:
    few-shot linear accuracy against fine-tuned accuracy, one point per model (mean ± std),
    with Spearman's rank correlation in the title. ``arms``: model → {res label: (mean, std)};
    ``points``: model, fewshot_mean, fewshot_std, finetune_mean, finetune_std."""
    if not arms or not points:
        raise VitkitError(f"{path}: nothing to plot (no runs)")
    fig = new_figure((11.0, 4.4))
    ax = fig.add_subplot(1, 2, 1)
    models = list(arms)
    labels = list(dict.fromkeys(k for a in arms.values() for k in a))
    width = 0.8 / max(len(labels), 1)
    for j, label in enumerate(labels):
        xs = np.arange(len(models)) + (j - (len(labels) - 1) / 2) * width
        mean = [100 * arms[m].get(label, (np.nan, 0))[0] for m in models]
        std = [100 * arms[m].get(label, (np.nan, 0))[1] for m in models]
        ax.bar(xs, mean, width, yerr=std, color=f"C{j}", label=label, capsize=3)
    ax.set_xticks(np.arange(len(models)))
    ax.set_xticklabels(models, fontsize=7, rotation=15)
    lows = [100 * v[0] for a in arms.values() for v in a.values() if np.isfinite(v[0])]
    ax.set_ylim(max(0.0, min(lows, default=0) - 10), 100)
    ax.set_ylabel("fine-tuned test top-1 (%)")
    ax.legend(fontsize=8, loc="lower right")
    ax.grid(True, axis="y", alpha=0.3)
    ax.set_title("fine-tuning resolution", fontsize=10)
    bx = fig.add_subplot(1, 2, 2)
    for i, p in enumerate(points):
        bx.errorbar(100 * p["fewshot_mean"], 100 * p["finetune_mean"],
                    xerr=100 * p["fewshot_std"], yerr=100 * p["finetune_std"], fmt="o",
                    color=f"C{i % 10}", label=p["model"], capsize=3)  # fmt: skip
    bx.set_xlabel("few-shot linear probe accuracy (%)")
    bx.set_ylabel("fine-tuned accuracy (%)")
    bx.grid(True, alpha=0.3)
    bx.legend(fontsize=7, loc="lower right")
    bx.set_title(f"probe vs fine-tuning: Spearman {rho:+.2f}", fontsize=10)
    if title:
        fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    return save_png(fig, path)
