"""Inside the model (the paper's Figures 6 and 7), measured over several seeds.

"Some heads attend to most of the image already in the lowest layers ... Other attention heads
have consistently small attention distances in the low layers ... the attention distance
increases with network depth" (Sec. 4.5, Fig. 7 right); "closer patches tend to have more
similar position embeddings. Further, the row-column structure appears; patches in the same
row/column have similar embeddings" (Fig. 7 centre); the first principal components of the patch
embedding filters "resemble plausible basis functions" (Fig. 7 left).

:func:`run_inside` trains one ViT per seed on 64 px ``shapes`` (4x4 patches: a 16 x 16 grid of
256 tokens, so that "local" and "global" are many patches apart), each an ordinary run in
``OUT/runs/<model>/inside/seed<k>`` reused once finished, and measures each trained model with
`vitkit.analysis` on test images (``inside.json`` beside the run's report, also reused):

- mean attention distance per layer and head (:func:`vitkit.analysis.mean_attention_distance`);
- the **uniform distance** U: the distance of a head that attends to every patch equally (the
  mean distance between patch centres), the most "global" a head can be on average;
- a head is **global** when its distance is at least ``GLOBAL_SHARE`` (1/2) of U, **local**
  when it is below ``LOCAL_SHARE`` (1/4) of U; the share of global and local heads in the lowest
  layer answers "do some heads attend globally already in the lowest layers";
- "distance grows with depth": Spearman's correlation of depth with every head's distance;
- position-embedding similarity (:func:`vitkit.analysis.similarity_by_distance`) and its
  row/column structure (:func:`vitkit.analysis.row_column_structure`: same-row/column pairs
  against other pairs at the same distance);
- the patch-embedding filters' principal components (their explained-variance shares).

:func:`write_inside` writes ``results.json`` (every seed, the summary, ``verdict_inputs``),
``inside.md``, ``attention_distance.png`` (every head of every seed against depth),
``position_similarity.png`` and ``filters.png`` (seed 0).

The full-size study (3 seeds; minutes on one GPU, hours on a CPU)::

    vitkit study inside --seeds 3 --device cuda --out-dir runs/study-inside

(the recipe ``study-inside``: width 128, depth 8, 8 heads, 4x4 patches at 64 px, AdamW lr 1e-3,
100 epochs). ``--smoke`` shrinks it to a seconds-long run for the tests.
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from vitkit.checkpoints import atomic_write_text
from vitkit.errors import VitkitError
from vitkit.studies.common import ModelSpec, RunResult, RunSpec, run_all
from vitkit.studies.measures import json_ready, mean_std, percent, spearman
from vitkit.studies.runs import loss_change, weights_of
from vitkit.train.train_config import TrainConfig

GLOBAL_SHARE = 0.5  # a head is "global" at >= this share of the uniform-attention distance
LOCAL_SHARE = 0.25  # and "local" below this share
GROUP = "inside"


def inside_specs(base: TrainConfig, model: ModelSpec, seeds: int) -> list[RunSpec]:
    if seeds < 1:
        raise VitkitError(f"the inside study needs at least one seed, got {seeds}")
    return [RunSpec(base, model, GROUP, seed) for seed in range(seeds)]


def measure_model(run_dir: str | Path, num_images: int, device: str = "cpu") -> dict[str, Any]:
    """The numbers of one trained model (see the module docstring), as a JSON-ready dict."""
    from vitkit.analysis import (
        embedding_filter_pca,
        mean_attention_distance,
        patch_distances,
        position_embedding_similarity,
        row_column_structure,
        sample_dataset,
        similarity_by_distance,
    )
    from vitkit.analysis.attention import require_attention
    from vitkit.checkpoints import load_model
    from vitkit.data import load_dataset

    loaded, ckpt = load_model(weights_of(run_dir))
    model = require_attention(loaded)
    trained_on = (ckpt.meta or {}).get("train_config") or {}
    if not trained_on.get("data"):
        raise VitkitError(f"{run_dir}: the checkpoint does not say which dataset it was trained on")
    test = load_dataset(
        trained_on["data"],
        "test",
        image_size=model.cfg.image_size,
        root=trained_on.get("data_root"),
    )
    data = sample_dataset(test, num_images, ckpt.preprocess)
    model.to(device)
    distance = mean_attention_distance(model, data.images.to(device)).double()  # [L, heads]
    model.cpu()
    uniform = float(patch_distances(model.cfg).mean())
    sim = position_embedding_similarity(model)
    # A hybrid's patch embedding filters ResNet features, not pixels: no filter picture.
    pca = None if model.cfg.is_hybrid else embedding_filter_pca(model, k=28)
    return {
        "images": int(data.images.shape[0]),
        "uniform_distance_px": uniform,
        "distance_px": distance.tolist(),
        "depth_spearman": depth_spearman(distance),
        "lowest_layer": head_shares(distance[0].tolist(), uniform),
        "posemb": similarity_by_distance(sim).to_dict(),
        "row_column": row_column_structure(sim).to_dict(),
        "filters_explained_variance": [] if pca is None else pca.explained_variance_ratio.tolist(),
    }


def head_shares(distances: Sequence[float], uniform: float) -> dict[str, float]:
    """The share of heads that are global (>= GLOBAL_SHARE x uniform) and local (< LOCAL_SHARE
    x uniform), and the shortest and longest distance relative to the uniform one."""
    if not distances or uniform <= 0:
        raise VitkitError("head shares need at least one head and a positive uniform distance")
    n = len(distances)
    return {
        "global_share": sum(d >= GLOBAL_SHARE * uniform for d in distances) / n,
        "local_share": sum(d < LOCAL_SHARE * uniform for d in distances) / n,
        "min_relative": min(distances) / uniform,
        "max_relative": max(distances) / uniform,
    }


def depth_spearman(distance: Tensor) -> float:
    """Spearman's correlation of layer index with each head's distance ([L, heads])."""
    layers, heads = distance.shape
    depth = [float(layer) for layer in range(layers) for _ in range(heads)]
    return spearman(depth, distance.reshape(-1).tolist())


def run_inside(
    base: TrainConfig,
    model: ModelSpec,
    seeds: int,
    out_dir: str | Path,
    *,
    num_images: int = 512,
) -> tuple[list[RunResult], list[dict[str, Any]]]:
    """Train (or reuse) one model per seed and measure each; (runs, measurements)."""
    from vitkit.registry.model_config import ViTConfig, model_config

    if not isinstance(model_config(model.name, **model.overrides), ViTConfig):
        raise VitkitError(f"{model.label} is not a Vision Transformer: it has no attention")
    results = run_all(inside_specs(base, model, seeds), out_dir)
    measured = []
    for r in results:
        path = Path(r.out_dir) / "inside.json"
        numbers = json.loads(path.read_text()) if path.is_file() else None
        # Measured again when the run was (re)trained now or the sample size changed.
        if r.trained or numbers is None or numbers.get("requested_images") != num_images:
            numbers = measure_model(r.out_dir, num_images, base.device)
            numbers["requested_images"] = num_images
            atomic_write_text(path, json.dumps(numbers, indent=1))
        measured.append(numbers)
    return results, measured


def _ms(values: Sequence[float]) -> dict[str, float]:
    clean = [v for v in values if not math.isnan(v)]
    mean, std = mean_std(clean) if clean else (math.nan, math.nan)
    return {"mean": mean, "std": std, "n": len(clean)}


def summarize_inside(results: Sequence[RunResult], measured: Sequence[dict]) -> dict[str, Any]:
    """Per-layer distance mean ± std over seeds, and the verdict inputs."""
    if not measured:
        raise VitkitError("no trained models to summarise")
    dist = [torch.tensor(m["distance_px"], dtype=torch.float64) for m in measured]
    if len({tuple(d.shape) for d in dist}) != 1:
        raise VitkitError("the seeds' models differ in depth or heads: one model per study")
    uniform = measured[0]["uniform_distance_px"]
    stacked = torch.stack(dist)  # [seeds, L, heads]
    layers = []
    for i in range(stacked.shape[1]):
        per_seed = stacked[:, i].mean(dim=1).tolist()
        layers.append(
            {
                "layer": i + 1,
                **{f"mean_px_{k}": v for k, v in _ms(per_seed).items() if k != "n"},
                "min_head_px": float(stacked[:, i].min()),
                "max_head_px": float(stacked[:, i].max()),
            }
        )
    low = [m["lowest_layer"] for m in measured]
    rc = [m["row_column"] for m in measured]
    pe = [m["posemb"] for m in measured]
    plateau = [loss_change(r) for r in results]
    verdict = {
        "seeds": len(measured),
        "test_top1": _ms([r.test_top1 for r in results]),
        # Relative change of the training loss over the last 20 % of steps (about 0: flat).
        "train_loss_rel_change_last_20pct": _ms(plateau),
        "uniform_distance_px": uniform,
        "global_threshold_px": GLOBAL_SHARE * uniform,
        "local_threshold_px": LOCAL_SHARE * uniform,
        "lowest_layer_global_share": _ms([x["global_share"] for x in low]),
        "lowest_layer_local_share": _ms([x["local_share"] for x in low]),
        "lowest_layer_min_relative": _ms([x["min_relative"] for x in low]),
        "lowest_layer_max_relative": _ms([x["max_relative"] for x in low]),
        "first_layer_mean_px": layers[0]["mean_px_mean"],
        "last_layer_mean_px": layers[-1]["mean_px_mean"],
        "depth_spearman": _ms([m["depth_spearman"] for m in measured]),
        "posemb_adjacent": _ms([x["adjacent"] for x in pe]),
        "posemb_far": _ms([x["far"] for x in pe]),
        "posemb_same_row": _ms([x["same_row"] for x in rc]),
        "posemb_same_column": _ms([x["same_column"] for x in rc]),
        "posemb_other": _ms([x["other"] for x in rc]),
        "posemb_line_excess_at_distance": _ms([x["line_excess_at_distance"] for x in rc]),
        "filters_top3_variance": _ms([sum(m["filters_explained_variance"][:3]) for m in measured]),
    }
    return {"layers": layers, "verdict_inputs": verdict}


def reading(verdict: dict[str, Any]) -> str:
    """One line: what the numbers say, for the md."""
    g = verdict["lowest_layer_global_share"]
    loc = verdict["lowest_layer_local_share"]
    rho = verdict["depth_spearman"]
    line = verdict["posemb_line_excess_at_distance"]
    return (
        f"Lowest layer: {100 * g['mean']:.0f} ± {100 * g['std']:.0f} % of heads global "
        f"(>= {GLOBAL_SHARE:g} x uniform distance), {100 * loc['mean']:.0f} % local; distance vs "
        f"depth: Spearman {rho['mean']:+.2f} ± {rho['std']:.2f} "
        f"({verdict['first_layer_mean_px']:.1f} px in layer 1, "
        f"{verdict['last_layer_mean_px']:.1f} px in the last; uniform "
        f"{verdict['uniform_distance_px']:.1f} px); position embeddings: same row/column vs other "
        f"pairs at equal distance {line['mean']:+.3f} ± {line['std']:.3f} cosine."
    )


def markdown(summary: dict[str, Any], results: Sequence[RunResult]) -> str:
    v = summary["verdict_inputs"]
    acc = v["test_top1"]
    lines = [
        f"Model: {results[0].short_name} ({results[0].params:,} parameters), {v['seeds']} "
        f"seed(s), test top-1 {100 * acc['mean']:.2f} ± {100 * acc['std']:.2f} %; training loss "
        f"over the last 20 % of steps: "
        f"{percent(v['train_loss_rel_change_last_20pct']['mean'], signed=True)} "
        "(about 0: flattened).",
        "",
        "| layer | mean distance (px), mean ± std over seeds | shortest head | longest head |",
        "| ---: | ---: | ---: | ---: |",
    ]
    for row in summary["layers"]:
        lines.append(
            f"| {row['layer']} | {row['mean_px_mean']:.2f} ± {row['mean_px_std']:.2f} | "
            f"{row['min_head_px']:.2f} | {row['max_head_px']:.2f} |"
        )
    lines += [
        "",
        f"Uniform attention: {v['uniform_distance_px']:.2f} px; global head: >= "
        f"{v['global_threshold_px']:.2f} px; local head: < {v['local_threshold_px']:.2f} px.",
        "",
        "| position-embedding pairs | mean cosine (± std over seeds) |",
        "| --- | ---: |",
    ]
    for key, name in (
        ("posemb_adjacent", "adjacent"),
        ("posemb_same_row", "same row"),
        ("posemb_same_column", "same column"),
        ("posemb_other", "neither"),
        ("posemb_far", "far (>= half the grid apart)"),
        ("posemb_line_excess_at_distance", "same row/column minus other, at equal distance"),
    ):
        lines.append(f"| {name} | {v[key]['mean']:+.3f} ± {v[key]['std']:.3f} |")
    lines += ["", f"Reading: {reading(v)}"]
    return "\n".join(lines)


def write_inside(
    results: Sequence[RunResult], measured: Sequence[dict[str, Any]], out_dir: str | Path
) -> dict[str, Path]:
    """``results.json``, ``inside.md`` and the three figures in ``out_dir``."""
    from vitkit.analysis import (
        embedding_filter_pca,
        plot_embedding_filters,
        plot_position_similarity,
        position_embedding_similarity,
    )
    from vitkit.checkpoints import load_model
    from vitkit.plotting.paper import plot_distance_by_depth

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    summary = summarize_inside(results, measured)
    paths = {
        "results": out / "results.json",
        "table": out / "inside.md",
        "plot": out / "attention_distance.png",
        "posemb": out / "position_similarity.png",
        "filters": out / "filters.png",
    }
    body = {
        "runs": [r.to_dict() for r in results],
        "measured": list(measured),
        "trained_runs": sum(r.trained for r in results),
        **summary,
    }
    atomic_write_text(paths["results"], json.dumps(json_ready(body), indent=1))
    title = "Inside the model (paper Fig. 7)"
    atomic_write_text(paths["table"], f"# {title}\n\n{markdown(summary, results)}\n")
    distances = [torch.tensor(m["distance_px"]) for m in measured]
    v = summary["verdict_inputs"]
    plot_distance_by_depth(
        distances,
        paths["plot"],
        uniform=v["uniform_distance_px"],
        thresholds=(v["global_threshold_px"], v["local_threshold_px"]),
        title=f"{results[0].short_name}: mean attention distance, {len(distances)} seed(s)",
    )
    from vitkit.analysis.attention import require_attention

    model = require_attention(load_model(weights_of(results[0].out_dir))[0])
    plot_position_similarity(
        position_embedding_similarity(model),
        paths["posemb"],
        title=f"Position embedding similarity (seed {results[0].seed})",
    )
    if model.cfg.is_hybrid:
        del paths["filters"]
    else:
        plot_embedding_filters(embedding_filter_pca(model, k=28), paths["filters"])
    return paths
