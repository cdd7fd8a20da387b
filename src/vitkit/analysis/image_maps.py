"""Attention maps of image files as PNGs: ``vitkit explain``'s work, callable from Python."""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from vitkit.analysis.attention import HeadFusion, explain
from vitkit.checkpoints import Checkpoint
from vitkit.data.images import load_images, shown_name
from vitkit.data.transforms import normalize
from vitkit.eval.predict import Prediction, class_names, format_top_k, top_k
from vitkit.models.vit import VisionTransformer


@dataclass
class ExplainedImage:
    """One image's top-k prediction and the PNGs drawn for it; for a MAP model also the MAP
    head's attention (``pool_png``); with prefix tokens the share of the output's rollout that
    ends on each group of them (``prefix_rollout``: class token, distillation token,
    registers) rather than on the patches of the maps."""

    image: str
    top_k: Prediction = field(default_factory=list)
    rollout_png: Path | None = None
    layers_png: Path | None = None
    pool_png: Path | None = None
    prefix_rollout: dict[str, float] = field(default_factory=dict)


def output_stems(paths: Sequence[str | os.PathLike[str]]) -> list[str]:
    """Each image's output name stem: its file's, with ``_1``, ``_2``, ... by position where
    several images share one."""
    stems = [Path(p).stem for p in paths]
    return [s if stems.count(s) == 1 else f"{s}_{i + 1}" for i, s in enumerate(stems)]


def output_names(paths: Sequence[str | os.PathLike[str]]) -> list[str]:
    """Every file :func:`explain_files` may write for ``paths``."""
    kinds = ("rollout", "layers", "pool")
    return [f"{stem}_{kind}.png" for stem in output_stems(paths) for kind in kinds]


def explain_files(
    model: VisionTransformer,
    ckpt: Checkpoint,
    paths: Sequence[str | os.PathLike[str]],
    out_dir: str | os.PathLike[str],
    *,
    k: int = 5,
    head_fusion: HeadFusion = "mean",
) -> list[ExplainedImage]:
    """For each image: ``STEM_rollout.png`` (the input, the attention rollout over it and the
    input multiplied by it, the paper's Figure 6) and ``STEM_layers.png`` (every layer's and
    head's map with the rollout up to each layer), and its top-``k`` labels; for a MAP model
    ``STEM_pool.png``, the MAP head's attention over the patches (heads averaged). Images
    sharing a file stem get ``_1``, ``_2``, ... by position."""
    from vitkit.plotting import plot_layer_maps, plot_rollout

    pre = ckpt.preprocess
    raw = load_images([str(p) for p in paths], pre)
    x = normalize(raw.float(), pre.mean, pre.std, pre.rescale_factor)
    found = explain(model, x, head_fusion=head_fusion)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    if model.cfg.num_classes:
        names = class_names(ckpt, found.logits.shape[-1])
        tops = top_k(found.logits.softmax(-1), names, k)
    else:
        tops = [[] for _ in paths]
    explained = []
    for i, (path, stem) in enumerate(zip(paths, output_stems(paths))):
        shown = format_top_k(tops[i])
        name = shown_name(Path(path).name)
        title = f"{name}: {shown}" if shown else name
        pixels = raw[i].float() / 255
        rollout_png = plot_rollout(
            pixels, found.rollout[i], out / f"{stem}_rollout.png", title=title
        )
        layers_png = plot_layer_maps(
            found.layer_maps[i],
            found.rollout_maps[i],
            out / f"{stem}_layers.png",
            image=pixels,
            title=f"{title}  ({model.cfg.short_name}, per-layer attention)",
        )
        pool_png = None
        if found.pool_maps is not None:  # what the MAP head pools: the pooled map
            pool_png = plot_rollout(
                pixels,
                found.pool_maps[i].mean(dim=0),
                out / f"{stem}_pool.png",
                title=title,
                label="MAP head's attention",
            )
        prefix = {k: float(v[i]) for k, v in found.prefix_rollout.items() if k != "patches"}
        explained.append(
            ExplainedImage(str(path), tops[i], rollout_png, layers_png, pool_png, prefix)
        )
    return explained
