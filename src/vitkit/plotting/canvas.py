"""What every figure shares: a bare matplotlib ``Figure`` on an Agg canvas, written atomically.

Figures are drawn on a bare ``Figure`` with an Agg canvas rather than through ``pyplot``: no
global backend switch, no figure registry to leak into, safe in a headless process or a
notebook. Every PNG is written to a temporary file in the target folder and moved into place
with ``os.replace``, so a reader never sees half an image. matplotlib is imported inside the
functions, so importing vitkit does not pay for it.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING

from vitkit.output_files import set_file_mode, writing

if TYPE_CHECKING:
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure

DPI = 120


def new_figure(size: tuple[float, float]) -> Figure:
    """A matplotlib ``Figure`` (inches) on its own Agg canvas: no pyplot, no global state."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=size, dpi=DPI)
    FigureCanvasAgg(fig)
    return fig


def save_png(fig: Figure, path: str | os.PathLike[str]) -> Path:
    """Write ``fig`` to ``path`` atomically: a temp file in the same folder, then ``os.replace``."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    with writing(path, tmp):  # any failure removes tmp; no room is one line
        with os.fdopen(fd, "wb") as f:
            fig.savefig(f, format="png", dpi=DPI)
        set_file_mode(tmp)  # mkstemp creates 0600 whatever the umask
        os.replace(tmp, path)
    return path


__all__ = ["DPI", "new_figure", "save_png"]


def save_accuracy_plot(fig: Figure, ax: Axes, path: str | os.PathLike[str], title: str) -> Path:
    """The ending every "test accuracy vs X" plot shares: y label, grid, legend, title, saved."""
    ax.set_ylabel("test top-1 accuracy (%)")
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=8, loc="lower right")
    if title:
        ax.set_title(title, fontsize=10)
    fig.tight_layout()
    return save_png(fig, path)
