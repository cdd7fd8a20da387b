"""Everything the analysis module knows, for one model: the three Figure-7 panels, attention
rollout examples, the numbers behind them (``analysis.json``) and the report sections.

:func:`analyze_model` works from the weights alone (embedding filters, position embeddings)
and, given a sample of images (:func:`sample_dataset`), adds what needs data: mean attention
distance, rollout examples and, when the images carry object boxes (the ``shapes`` dataset),
the share of rollout mass inside the box compared with the box's share of the image.
"""

from __future__ import annotations

import json
import math
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from vitkit.analysis.attention import (
    HeadFusion,
    attention_distance,
    attention_outputs,
    attention_rollout,
    box_mass,
    patch_distances,
    patch_map,
    prefix_attention_share,
    prefix_rollout_share,
    require_attention,
    safe_batch_size,
    token_pixels,
)
from vitkit.analysis.filters import embedding_filter_pca
from vitkit.analysis.html_report import Figure, Section, Table, write_html
from vitkit.analysis.posemb_similarity import position_embedding_similarity, similarity_by_distance
from vitkit.analysis.tokens import prefix_numbers, prefix_section
from vitkit.checkpoints import atomic_write_text
from vitkit.data import ArrayDataset, make_loader, to_model_input
from vitkit.errors import VitkitError
from vitkit.models.vit import VisionTransformer
from vitkit.plotting.analysis import (
    plot_attention_distance,
    plot_embedding_filters,
    plot_position_similarity,
    plot_rollout_examples,
)
from vitkit.registry.model_config import PreprocessConfig, ViTConfig

FILES = {
    "filters": "embedding_filters.png",
    "position_similarity": "position_similarity.png",
    "attention_distance": "attention_distance.png",
    "rollout_examples": "rollout_examples.png",
    "numbers": "analysis.json",
}


@dataclass
class AnalysisData:
    """A sample of images to analyse a model on."""

    images: Tensor  # normalised model input [N, C, H, W]
    pixels: Tensor  # the same images for display, [N, C, H, W] in [0, 1]
    labels: Tensor | None = None  # [N] true classes, if known
    boxes: Tensor | None = None  # [N, 4] object boxes (x0, y0, x1, y1) in model-input pixels
    class_names: tuple[str, ...] = ()
    description: str = ""  # where the images come from, for the report


def sample_dataset(
    dataset: Any, n: int, preprocess: PreprocessConfig, *, description: str = ""
) -> AnalysisData:
    """``n`` images spread evenly over ``dataset`` (so every class is represented in a sorted
    ImageFolder), prepared with the checkpoint's preprocessing; for a dataset that can only be
    streamed (webdataset shards), its first ``n``. Boxes are rescaled to the model input when
    the dataset's images are another size. Unreadable files the dataset skips are left out."""
    if n < 1:
        raise VitkitError(f"the number of images to analyse must be at least 1, got {n}")
    total = len(dataset)
    if total == 0:
        raise VitkitError(f"{dataset.info.name}: no images to analyse")
    idx = torch.linspace(0, total - 1, min(n, total)).round().long().unique()
    boxes = None
    if isinstance(dataset, ArrayDataset):
        raw, labels = dataset.get_batch(idx.tolist())
        if dataset.boxes is not None:
            boxes = dataset.boxes[idx].clone()
    elif hasattr(dataset, "__getitem__"):
        items = [dataset[i] for i in idx.tolist()]
        items = [it for it in items if it is not None]  # unreadable files skipped
        if not items:
            raise VitkitError(f"{dataset.info.name}: none of the sampled images could be read")
        raw = torch.stack([im for im, _ in items])
        labels = torch.tensor([label for _, label in items])
    else:  # a stream (webdataset shards): its first n images
        raw, labels = _first_images(dataset, n)
    pre = preprocess
    x = to_model_input(raw, pre.image_size, pre.channels, pre.mean, pre.std, pre.rescale_factor)
    mean = torch.tensor(pre.mean).view(1, -1, 1, 1)
    std = torch.tensor(pre.std).view(1, -1, 1, 1)
    if boxes is not None:
        (h, w), (mh, mw) = raw.shape[-2:], pre.image_size
        boxes = boxes * torch.tensor([mw / w, mh / h, mw / w, mh / h])
    return AnalysisData(
        images=x,
        pixels=(x * std + mean).clamp(0, 1),
        labels=labels,
        boxes=boxes,
        class_names=tuple(dataset.info.class_names),
        description=description or f"{len(labels)} images of {dataset.info.name}",
    )


def _first_images(dataset: Any, n: int) -> tuple[Tensor, Tensor]:
    """The first ``n`` images of a dataset that can only be streamed, in its stored order."""
    loader = make_loader(dataset, min(n, 256), shuffle=False, drop_last=False, seed=0)
    images, labels, count = [], [], 0
    for x, y, _ in loader:
        images.append(x)
        labels.append(y)
        count += len(y)
        if count >= n:
            break
    if not count:
        raise VitkitError(f"{dataset.info.name}: no images could be read")
    return torch.cat(images)[:n], torch.cat(labels)[:n]


@dataclass
class AnalysisResult:
    numbers: dict[str, Any]  # also written to analysis.json
    files: dict[str, Path]  # what was written, by FILES key
    sections: list[Section] = field(default_factory=list)  # for the HTML report


def _json_safe(x: Any) -> Any:
    if isinstance(x, float) and not math.isfinite(x):
        return None
    if isinstance(x, dict):
        return {k: _json_safe(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_json_safe(v) for v in x]
    return x


_POOLING = {
    "token": "class token",
    "gap": "global average",
    "avgmax": "(mean + max) / 2 of the patches",
    "max": "max over the patches",
    "map": "attention pooling (MAP head)",
    "token_gap": "class token and mean patch token, concatenated",
    "none": "none (every token)",
}


def model_table(model: VisionTransformer, *, source: str = "") -> Table:
    """The facts about a model, for a report."""
    cfg = model.cfg
    ph, pw = token_pixels(cfg)
    rows: list[list[object]] = []
    if source:
        rows.append(["checkpoint", source])
    rows += [
        ["model", cfg.short_name],
        ["parameters", sum(p.numel() for p in model.parameters())],
        ["input", f"{cfg.image_size[0]} x {cfg.image_size[1]} px, {cfg.in_chans} channel(s)"],
        ["patch grid", f"{cfg.grid_size[0]} x {cfg.grid_size[1]} patches of {ph} x {pw} px"],
        [
            "width / depth / heads / MLP",
            f"{cfg.width} / {cfg.depth} / {cfg.num_heads} / {cfg.mlp_dim}",
        ],
        ["pooling", _POOLING[cfg.pool] + ("" if cfg.has_class_token else " (no class token)")],
    ]
    return Table(["", ""], rows)


def _predict(
    model: VisionTransformer, data: AnalysisData, batch_size: int, head_fusion: HeadFusion
) -> tuple[Tensor, Tensor, Tensor, dict[str, dict[str, Tensor]]]:
    """One pass over the images: attention distance [N, L, heads], final rollout over patches
    [N, gh, gw], logits [N, classes] and the prefix tokens' shares (``"attention"``: group →
    [N, L]; ``"rollout"``: group → [N]; :mod:`vitkit.analysis.tokens`)."""
    cfg = model.cfg
    batch_size = safe_batch_size(cfg, batch_size)
    distances, rollouts, logits = [], [], []
    shares: dict[str, list[Tensor]] = {}
    rolled_shares: dict[str, list[Tensor]] = {}
    for start in range(0, data.images.shape[0], batch_size):
        attentions, out, pool = attention_outputs(model, data.images[start : start + batch_size])
        distances.append(attention_distance(attentions, cfg))
        rolled = attention_rollout(attentions, head_fusion=head_fusion)
        rollouts.append(patch_map(rolled, cfg, pool))
        logits.append(out)
        for k, v in prefix_attention_share(attentions, cfg).items():
            shares.setdefault(k, []).append(v)
        for k, v in prefix_rollout_share(rolled, cfg, pool).items():
            rolled_shares.setdefault(k, []).append(v)
    tokens = {
        "attention": {k: torch.cat(v) for k, v in shares.items()},
        "rollout": {k: torch.cat(v) for k, v in rolled_shares.items()},
    }
    return torch.cat(distances), torch.cat(rollouts), torch.cat(logits), tokens


def analyze_model(
    model: VisionTransformer,
    out_dir: str | os.PathLike[str],
    data: AnalysisData | None = None,
    *,
    num_examples: int = 8,
    filter_components: int = 28,
    head_fusion: HeadFusion = "mean",
    batch_size: int = 32,
) -> AnalysisResult:
    """Write the analysis PNGs and ``analysis.json`` into ``out_dir`` and return the numbers
    and report sections. Without ``data`` only the weight-based panels are made."""
    require_attention(model)
    cfg = model.cfg
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    numbers: dict[str, Any] = {"model": cfg.short_name, "model_config": cfg.to_dict()}
    files: dict[str, Path] = {}
    sections: list[Section] = []

    # Figure 7, left: embedding filters.
    if cfg.is_hybrid:
        sections.append(
            Section(
                "Embedding filters",
                ["A hybrid's patch embedding filters ResNet features, not pixels: no picture."],
            )
        )
    else:
        pca = embedding_filter_pca(model, filter_components)
        files["filters"] = plot_embedding_filters(pca, out / FILES["filters"])
        ratio = pca.explained_variance_ratio.tolist()
        numbers["embedding_filters"] = {"explained_variance_ratio": ratio}
        k = len(ratio)
        sections.append(
            Section(
                "Embedding filters",
                [
                    f"The first {k} principal components of the {cfg.width} patch-embedding "
                    f"filters ({cfg.in_chans} x {cfg.patch_size[0]} x {cfg.patch_size[1]} each), "
                    "as in the paper's Figure 7 (left). Together they explain "
                    f"{100 * sum(ratio):.1f}% of the filters' variance; the first explains "
                    f"{100 * ratio[0]:.1f}%.",
                    Figure(
                        files["filters"], "Each tile is one component, scaled to its own range."
                    ),
                ],
            )
        )

    # Figure 7, centre: position-embedding similarity (nothing to show without a learned E_pos).
    if getattr(model, "pos_embed", None) is None:
        none = (
            "This model has no learned position embeddings (abs_pos_embed=False: rotary "
            "embeddings or a relative position bias stand in), so the paper's Figure 7 (centre) "
            "has nothing to show; position shows in the attention distances below."
        )
        sections.append(Section("Position embedding similarity", [none]))
    else:
        sim = position_embedding_similarity(model)
        files["position_similarity"] = plot_position_similarity(
            sim, out / FILES["position_similarity"]
        )
        items: list[str | Figure | Table] = [
            "Cosine similarity of each patch's position embedding with all others (the class "
            "token's embedding left out), as in the paper's Figure 7 (centre): tile (r, c) shows "
            "patch (r, c) against the whole grid.",
            Figure(files["position_similarity"]),
        ]
        if cfg.num_patches >= 2:
            stats = similarity_by_distance(sim)
            numbers["position_similarity"] = stats.to_dict()
            items.insert(
                1,
                Table(
                    ["patch pairs", "mean cosine"],
                    [
                        ["adjacent (same row or column, 1 apart)", stats.adjacent],
                        ["same row or column, >= 2 apart", stats.same_row_or_column],
                        [f"far (>= {stats.far_distance:g} patches apart)", stats.far],
                        ["all distinct pairs", stats.other],
                    ],
                ),
            )
        sections.append(Section("Position embedding similarity", items))

    if data is not None:
        if data.images.shape[0] == 0:
            raise VitkitError("no images to analyse")
        dist, rollout, logits, tokens = _predict(model, data, batch_size, head_fusion)
        _attention_sections(cfg, dist, data, out, files, numbers, sections)
        _rollout_sections(
            cfg, rollout, logits, data, out, files, numbers, sections, num_examples, head_fusion
        )
        if cfg.num_prefix_tokens:  # class, distillation, registers: reported apart
            numbers["prefix_tokens"] = prefix_numbers(tokens["attention"], tokens["rollout"])
            section = prefix_section(cfg, tokens["attention"], tokens["rollout"], data.description)
            sections.append(section)
    else:
        sections.append(
            Section(
                "Attention",
                ["No images were given, so attention distance and rollout are not shown."],
            )
        )

    files["numbers"] = write_numbers(out / FILES["numbers"], numbers)
    return AnalysisResult(numbers, files, sections)


def _attention_sections(
    cfg: ViTConfig,
    dist: Tensor,
    data: AnalysisData,
    out: Path,
    files: dict[str, Path],
    numbers: dict[str, Any],
    sections: list[Section],
) -> None:
    mean = dist.mean(dim=0)  # [L, heads]
    uniform = float(patch_distances(cfg).mean())
    files["attention_distance"] = plot_attention_distance(
        mean, out / FILES["attention_distance"], uniform=uniform
    )
    per_layer = mean.mean(dim=1)
    numbers["attention_distance"] = {
        "images": int(dist.shape[0]),
        "per_layer_mean": per_layer.tolist(),
        "per_layer_min": mean.amin(dim=1).tolist(),
        "per_layer_max": mean.amax(dim=1).tolist(),
        "per_layer_head": mean.tolist(),
        "uniform_attention": uniform,
        "image_size": list(cfg.image_size),
    }
    rows = [
        [i + 1, float(per_layer[i]), float(mean[i].min()), float(mean[i].max())]
        for i in range(mean.shape[0])
    ]
    sections.append(
        Section(
            "Mean attention distance",
            [
                f"For each head, the pixel distance between query and key patches weighted by "
                "the attention, averaged over query patches and "
                f"{data.description}, as in the paper's Figure 7 (right). The dotted line, "
                f"{uniform:.1f} px, is where a head that attends to all patches equally lies: "
                "below it a head prefers nearby patches.",
                Figure(files["attention_distance"]),
                Table(["layer", "mean over heads (px)", "lowest head", "highest head"], rows),
            ],
        )
    )


def _rollout_sections(
    cfg: ViTConfig,
    rollout: Tensor,
    logits: Tensor,
    data: AnalysisData,
    out: Path,
    files: dict[str, Path],
    numbers: dict[str, Any],
    sections: list[Section],
    num_examples: int,
    head_fusion: HeadFusion,
) -> None:
    items: list[str | Figure | Table] = []
    names = data.class_names
    probs = logits.softmax(-1) if cfg.num_classes else None
    if probs is not None and data.labels is not None and len(names) == cfg.num_classes:
        acc = float((probs.argmax(-1) == data.labels).float().mean())
        numbers["sample_top1"] = acc
        items.append(f"Top-1 accuracy on these {len(data.labels)} images: {100 * acc:.1f}%.")
    if data.boxes is not None:
        inside, share = box_mass(rollout, data.boxes, cfg)
        others = torch.roll(data.boxes, 1, dims=0)  # another image's box: the control
        inside_c, share_c = box_mass(rollout, others, cfg)
        per_image = inside / share.clamp_min(1e-12)
        numbers["rollout_in_box"] = {
            "images": int(inside.shape[0]),
            "mass_inside_box": float(inside.mean()),
            "box_area_share": float(share.mean()),
            "ratio": float(inside.mean() / share.mean()),
            "median_per_image_ratio": float(per_image.median()),
            "control_ratio_other_images_box": float(inside_c.mean() / share_c.mean()),
            "head_fusion": head_fusion,
        }
        r = numbers["rollout_in_box"]
        items.append(
            Table(
                ["", "value"],
                [
                    ["rollout mass inside the object box", r["mass_inside_box"]],
                    ["box area / image area", r["box_area_share"]],
                    ["ratio (1 = blind to the object)", r["ratio"]],
                    ["median per-image ratio", r["median_per_image_ratio"]],
                    [
                        "control: ratio with another image's box",
                        r["control_ratio_other_images_box"],
                    ],
                ],
                caption=f"Over {r['images']} images with object boxes.",
            )
        )
    picked = example_indices(data.labels, data.images.shape[0], num_examples)
    if picked:
        captions = []
        for i in picked:
            parts = []
            if data.labels is not None and names:
                parts.append(f"true {names[int(data.labels[i])]}")
            if probs is not None:
                j = int(probs[i].argmax())
                label = names[j] if len(names) == cfg.num_classes else str(j)
                parts.append(f"pred {label} {100 * float(probs[i, j]):.0f}%")
            captions.append(", ".join(parts))
        files["rollout_examples"] = plot_rollout_examples(
            data.pixels[picked],
            rollout[picked],
            out / FILES["rollout_examples"],
            captions=captions,
            boxes=None if data.boxes is None else data.boxes[picked],
        )
        with_box = ", with the object box" if data.boxes is not None else ""
        items.append(
            Figure(
                files["rollout_examples"],
                "Each example: the input, the attention rollout over it, and the input "
                f"multiplied by the rollout (scaled to its maximum){with_box}.",
            )
        )
    pooled = "the class token" if cfg.pool == "token" else "the mean over the patch tokens (GAP)"
    if cfg.dist_token:
        pooled = "the mean of the class and distillation tokens (DeiT averages their heads)"
    if cfg.pool in ("avgmax", "max"):
        pooled = f"the {_POOLING[cfg.pool]} (the map shows the mean over the patch tokens)"
    if cfg.pool == "map":
        pooled = "the patch tokens weighted by the MAP head's attention (the pooled map)"
    items.insert(
        0,
        f"Attention rollout (Abnar & Zuidema, 2020; the paper's Figure 6): the {head_fusion} "
        "of the heads plus the identity for the residual connection, rows renormalised, "
        f"multiplied from the first layer to the last; shown is the row of {pooled} over the "
        f"patches, for {data.description}.",
    )
    sections.append(Section("Attention rollout", items))


def write_numbers(path: str | os.PathLike[str], numbers: dict[str, Any]) -> Path:
    """``numbers`` as JSON (non-finite floats become null), written atomically."""
    path = Path(path)
    atomic_write_text(path, json.dumps(_json_safe(numbers), indent=1))
    return path


def example_indices(labels: Tensor | None, n: int, count: int) -> list[int]:
    """Up to ``count`` of ``n`` image indices, in order, taking one image per class first
    where the labels are known (so the examples show many classes)."""
    if labels is None:
        return list(range(min(n, count)))
    first: dict[int, int] = {}
    for i, y in enumerate(labels.tolist()):
        first.setdefault(int(y), i)
    chosen = set(list(first.values())[:count])
    for i in range(n):
        if len(chosen) >= count:
            break
        chosen.add(i)
    return sorted(chosen)


def training_sections(run_dir: str | os.PathLike[str]) -> list[Section]:
    """The training part of a run directory's report, from the files the trainer leaves there:
    the headline numbers of ``report.json``, ``curves.png`` and ``confusion_*.png``. Missing
    files are left out."""
    run = Path(run_dir)
    items: list[str | Figure | Table] = []
    report_path = run / "report.json"
    if report_path.is_file():
        try:
            report = json.loads(report_path.read_text())
        except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
            raise VitkitError(f"{report_path}: unreadable run report ({e})") from None
        if not isinstance(report, dict):
            raise VitkitError(f"{report_path}: a run report is a JSON object, not {report!r:.40}")
        rows: list[list[object]] = []
        for split in ("test", "val"):
            for key in ("top1", "top5", "loss"):
                value = report.get(f"{split}_{key}")
                if isinstance(value, (int, float)):
                    shown = f"{100 * value:.2f}%" if key != "loss" else value
                    rows.append([f"{split} {key.replace('top', 'top-')}", shown])
        labels = {
            "dataset": "dataset",
            "steps": "optimizer steps",
            "epochs": "epochs",
            "precision": "precision",
        }
        rows += [[label, report[k]] for k, label in labels.items() if k in report]
        if isinstance(report.get("wall_s"), (int, float)):
            rows.append(["wall time", f"{report['wall_s']:.0f} s"])
        if isinstance(report.get("train_images_per_s"), (int, float)):
            rows.append(["training throughput", f"{report['train_images_per_s']:.0f} images/s"])
        items.append(Table(["", ""], rows))
    if (run / "curves.png").is_file():
        items.append(Figure(run / "curves.png", "Training curves (metrics.jsonl)."))
    for split in ("test", "val"):
        png = run / f"confusion_{split}.png"
        if png.is_file():
            items.append(Figure(png, f"Confusion matrix on the {split} split, row-normalised."))
            break
    return [Section("Training", items)] if items else []


def write_report(
    path: str | os.PathLike[str],
    model: VisionTransformer,
    result: AnalysisResult,
    *,
    source: str = "",
    run_dir: str | os.PathLike[str] | None = None,
    title: str | None = None,
) -> Path:
    """The self-contained HTML report: the model, the training run (if ``run_dir``) and the
    analysis sections of ``result``."""
    sections = [Section("Model", [model_table(model, source=source)])]
    if run_dir is not None:
        sections += training_sections(run_dir)
    sections += result.sections
    title = title or f"{model.cfg.short_name}: inside the Vision Transformer"
    return write_html(path, title, sections, subtitle=source)


def format_numbers(numbers: dict[str, Any]) -> str:
    """The headline numbers of an analysis (``AnalysisResult.numbers``), a few lines of text."""
    lines = []
    ps = numbers.get("position_similarity")
    if ps:
        lines.append(
            f"position embeddings, mean cosine: adjacent {ps['adjacent']:.3f}, same row/column "
            f"{ps['same_row_or_column']:.3f}, far {ps['far']:.3f}, all pairs {ps['other']:.3f}"
        )
    ad = numbers.get("attention_distance")
    if ad:
        shown = " ".join(f"{d:.1f}" for d in ad["per_layer_mean"])
        lowest = " ".join(f"{d:.1f}" for d in ad["per_layer_min"])
        highest = " ".join(f"{d:.1f}" for d in ad["per_layer_max"])
        lines.append(
            f"mean attention distance (px) by layer: {shown} "
            f"(uniform attention: {ad['uniform_attention']:.1f})"
        )
        lines.append(f"    lowest head: {lowest}\n    highest head: {highest}")
    rb = numbers.get("rollout_in_box")
    if rb:
        lines.append(
            f"rollout mass inside the object box {rb['mass_inside_box']:.3f} vs box area "
            f"{rb['box_area_share']:.3f}: ratio {rb['ratio']:.2f} (control with another "
            f"image's box {rb['control_ratio_other_images_box']:.2f})"
        )
    for name, share in (numbers.get("prefix_tokens") or {}).items():
        if name != "patches":
            layers = " ".join(f"{s:.3f}" for s in share["attention_share_per_layer"])
            lines.append(
                f"attention share on the {name} by layer: {layers} "
                f"(rollout: {share['rollout_share']:.3f})"
            )
    if "sample_top1" in numbers:
        lines.append(f"top-1 on the analysed images: {100 * numbers['sample_top1']:.1f}%")
    return "\n".join(lines)
