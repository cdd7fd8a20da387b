"""The figures studies share beyond `vitkit.plotting`: every run's training loss (to see it
flatten) and accuracy against training compute."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from vitkit.errors import VitkitError
from vitkit.plotting import new_figure, read_jsonl, save_png
from vitkit.plotting.canvas import save_accuracy_plot
from vitkit.studies.common import RunResult


def train_loss_curve(run_dir: str | Path) -> tuple[list[int], list[float]]:
    """(steps, training loss) of a run's ``metrics.jsonl``."""
    records = read_jsonl(Path(run_dir) / "metrics.jsonl")
    points = [(int(r["step"]), float(r["train_loss"])) for r in records if "train_loss" in r]
    return [s for s, _ in points], [v for _, v in points]


def plot_loss_curves(
    results: Sequence[RunResult], path: str | Path, *, panel_key: str, title: str = ""
) -> Path:
    """One panel per value of ``info[panel_key]`` (e.g. the training-set size), one colour per
    model, one line per seed: training loss against optimizer steps (log y); a marker where the
    run's best validation epoch ended, when it early-stopped."""
    if not results:
        raise VitkitError(f"{path}: nothing to plot (no runs)")
    panels = sorted({r.info[panel_key] for r in results})
    models = list(dict.fromkeys(r.model for r in results))
    cols = min(len(panels), 3)
    rows = -(-len(panels) // cols)
    fig = new_figure((4.2 * cols, 3.2 * rows))
    for i, value in enumerate(panels):
        ax = fig.add_subplot(rows, cols, i + 1)
        labelled: set[str] = set()
        for r in (x for x in results if x.info[panel_key] == value):
            j = models.index(r.model)
            steps, loss = train_loss_curve(r.out_dir)
            if not steps:
                continue
            label = None if r.model in labelled else r.model
            labelled.add(r.model)
            ax.plot(steps, loss, color=f"C{j % 10}", linewidth=1, alpha=0.8, label=label)
            if r.info.get("early_stopped"):
                ax.plot(steps[-1], loss[-1], "x", color=f"C{j % 10}", markersize=5)
        log_y_axis(ax)
        ax.set_title(f"{panel_key} = {panel_value(value)}", fontsize=9)
        ax.set_xlabel("optimizer step", fontsize=8)
        ax.set_ylabel("training loss", fontsize=8)
        ax.grid(True, alpha=0.3)
        ax.tick_params(labelsize=7)
        if i == 0:
            ax.legend(fontsize=7)
    if title:
        fig.suptitle(title + " (x: early-stopped)", fontsize=10)
    fig.tight_layout()
    return save_png(fig, path)


def log_y_axis(ax: Any) -> None:
    """A log y axis with plain numbers (``0.05``, not ``5 x 10^-2``). Minor ticks (2, 3, ... 9 x
    10^k) are labelled only where the axis spans at most one decade: across several, their
    labels overlap each other and the major ones."""
    from matplotlib.ticker import FuncFormatter, NullFormatter

    plain = FuncFormatter(lambda v, _: f"{v:g}")
    ax.set_yscale("log")
    ax.yaxis.set_major_formatter(plain)
    low, high = ax.get_ylim()
    ax.yaxis.set_minor_formatter(plain if high <= 10 * low else NullFormatter())


def panel_value(value: Any) -> str:
    """A panel's key value as people write it: ``59,000`` for a size, ``0.01`` for a
    fraction."""
    if isinstance(value, int):
        return f"{value:,}"
    if isinstance(value, float):
        return f"{value:g}"
    return str(value)


def plot_accuracy_vs_compute(
    rows: Sequence[dict[str, Any]], path: str | Path, title: str = ""
) -> Path:
    """Test accuracy against total training compute (exaFLOPs, log x), one line per model
    family through its sizes, ±1 std as error bars (the paper's Figure 5 in miniature).

    ``rows``: dicts with family, model, mean, std and train_exaflops."""
    if not rows:
        raise VitkitError(f"{path}: nothing to plot (no runs)")
    fig = new_figure((7.0, 4.6))
    ax = fig.add_subplot(1, 1, 1)
    families = list(dict.fromkeys(r["family"] for r in rows))
    for i, family in enumerate(families):
        mine = sorted((r for r in rows if r["family"] == family), key=lambda r: r["train_exaflops"])
        x = np.array([r["train_exaflops"] for r in mine])
        y = np.array([100 * r["mean"] for r in mine])
        err = np.array([100 * r["std"] for r in mine])
        ax.errorbar(x, y, yerr=err, fmt="-o", color=f"C{i % 10}", label=family, markersize=4)
        for r, xi, yi in zip(mine, x, y, strict=True):
            ax.annotate(
                r["model"], (xi, yi), fontsize=6, xytext=(3, -8), textcoords="offset points"
            )
    ax.set_xscale("log")
    ax.set_xlabel("total training compute (exaFLOPs, analytic: 3 x forward x images seen)")
    return save_accuracy_plot(fig, ax, path, title)
