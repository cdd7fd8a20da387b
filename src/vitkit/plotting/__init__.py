"""Every figure vitkit draws, written to PNG.

- :mod:`.canvas`: what all figures share: a bare matplotlib ``Figure`` on an Agg canvas
  (`new_figure`) and the atomic PNG write (`save_png`);
- :mod:`.training`: the figures of a run: training curves (`read_jsonl` reads its
  ``metrics.jsonl``), the confusion matrix, rows of images, the data-scale plot;
- :mod:`.analysis`: the figures of `vitkit.analysis` (the paper's Figures 6 and 7, per-layer
  attention maps), which computes what they show; `vitkit.analysis` re-exports them.

matplotlib is imported inside the functions: importing this package does not import it.
Nothing here imports `vitkit.analysis`, the trainer or the command line.
"""

from vitkit.plotting.analysis import (
    plot_attention_distance,
    plot_embedding_filters,
    plot_layer_maps,
    plot_position_similarity,
    plot_rollout,
    plot_rollout_examples,
    upsample_map,
)
from vitkit.plotting.canvas import DPI, new_figure, save_png
from vitkit.plotting.training import (
    plot_confusion_matrix,
    plot_data_scale,
    plot_image_rows,
    plot_training_curves,
    read_jsonl,
)

__all__ = [
    "DPI",
    "new_figure",
    "plot_attention_distance",
    "plot_confusion_matrix",
    "plot_data_scale",
    "plot_embedding_filters",
    "plot_image_rows",
    "plot_layer_maps",
    "plot_position_similarity",
    "plot_rollout",
    "plot_rollout_examples",
    "plot_training_curves",
    "read_jsonl",
    "save_png",
    "upsample_map",
]
