"""Looking inside a ViT: attention maps and rollout, mean attention distance, position-embedding
similarity, embedding-filter principal components (the paper's Figures 6 and 7), and a
self-contained HTML report. Works on any model :func:`vitkit.load_model` can load; imports
nothing from training or the command line. The figures are drawn by `vitkit.plotting.analysis`
and re-exported here."""

from vitkit.analysis.attention import (
    Explanation,
    attention_distance,
    attention_rollout,
    attention_weights,
    box_mass,
    explain,
    fuse_heads,
    input_config,
    mean_attention_distance,
    patch_distances,
    patch_map,
    rollout_by_layer,
    token_pixels,
)
from vitkit.analysis.filters import FilterComponents, embedding_filter_pca
from vitkit.analysis.posemb import (
    PositionSimilarityStats,
    RowColumnStats,
    patch_position_embeddings,
    position_embedding_similarity,
    row_column_structure,
    similarity_by_distance,
)
from vitkit.analysis.report import Figure, Section, Table, render_html, write_html
from vitkit.analysis.summary import (
    AnalysisData,
    AnalysisResult,
    analyze_model,
    model_table,
    sample_dataset,
    training_sections,
    write_report,
)
from vitkit.plotting.analysis import (  # the figures are drawn in vitkit.plotting
    plot_attention_distance,
    plot_embedding_filters,
    plot_layer_maps,
    plot_position_similarity,
    plot_rollout,
    plot_rollout_examples,
    upsample_map,
)

__all__ = [
    "AnalysisData",
    "AnalysisResult",
    "Explanation",
    "FilterComponents",
    "Figure",
    "PositionSimilarityStats",
    "RowColumnStats",
    "Section",
    "Table",
    "analyze_model",
    "attention_distance",
    "attention_rollout",
    "attention_weights",
    "box_mass",
    "embedding_filter_pca",
    "explain",
    "fuse_heads",
    "input_config",
    "mean_attention_distance",
    "model_table",
    "patch_distances",
    "patch_map",
    "patch_position_embeddings",
    "plot_attention_distance",
    "plot_embedding_filters",
    "plot_layer_maps",
    "plot_position_similarity",
    "plot_rollout",
    "plot_rollout_examples",
    "position_embedding_similarity",
    "render_html",
    "rollout_by_layer",
    "row_column_structure",
    "sample_dataset",
    "similarity_by_distance",
    "token_pixels",
    "training_sections",
    "upsample_map",
    "write_html",
    "write_report",
]
