"""Fine-tuning resolution and few-shot probes against fine-tuning (the paper's Sec. 3.2 and 4.1).

"It is often beneficial to fine-tune at higher resolution than pre-training ... we keep the patch
size the same, which results in a larger effective sequence length ... We therefore perform 2D
interpolation of the pre-trained position embeddings" (Sec. 3.2); and few-shot linear accuracy
is used "for fast on-the-fly evaluation where fine-tuning would be too costly" (Sec. 4.1), which
is only sound if the cheap probe ranks models as fine-tuning does. Here, per model of
``--models`` and per seed:

1. supervised pre-training on ``--pretrain-data`` (default MNIST, at its own 28 px) in
   ``OUT/runs/<model>/pretrain/seed<k>``, reused once finished;
2. fine-tuning on ``--data`` (default scikit-learn's digits) with one recipe (the training
   options; default ``study-resolution``: SGD, zero head, pre-logits dropped) and the same
   budget, **at the pre-training resolution** (group ``res<low>``) and **at ``--high-res``**
   (default twice it; group ``res<high>``, position embeddings interpolated in 2-D);
3. few-shot linear probes (the paper's closed-form ridge, :mod:`vitkit.eval.fewshot`) of the
   frozen pre-trained features on ``--data`` at the pre-training resolution, ``--shots`` per
   class (``OUT/runs/<model>/fewshot/seed<k>/fewshot.json``, reused).

The verdict inputs: the high-minus-low gain per model (paired by seed), and Spearman's rank
correlation across models between the probe's accuracy and the fine-tuned accuracy (at the
pre-training resolution): per seed (mean ± std) and of the means over seeds.

:func:`write_resolution` writes ``results.json``, ``resolution.md`` and ``resolution.png``.

The full-size study (4 models, 3 seeds; minutes on one GPU)::

    vitkit study resolution --seeds 3 --device cuda --out-dir runs/study-resolution

(the default ``--models``: :data:`DEFAULT_MODELS`, four ViTs with 4x4 patches, width 32 to
96, depth 2 to 6). ``--smoke`` shrinks every run to a few steps on ``digits``.
"""

from __future__ import annotations

import dataclasses
import json
import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Literal

from vitkit.checkpoints import atomic_write_text
from vitkit.errors import VitkitError
from vitkit.studies.common import ModelSpec, RunResult, RunSpec, check_labels, run_all
from vitkit.studies.measures import json_ready, mean_std, spearman
from vitkit.studies.runs import pretrain, weights_of
from vitkit.train.train_config import TrainConfig

DEFAULT_MODELS = (
    "Ti/4[width=32,depth=2,num_heads=2,mlp_dim=64,label=w32-d2],"
    "Ti/4[width=64,depth=4,num_heads=4,mlp_dim=128,label=w64-d4],"
    "Ti/4[width=64,depth=6,num_heads=4,mlp_dim=128,label=w64-d6],"
    "Ti/4[width=96,depth=6,num_heads=4,mlp_dim=192,label=w96-d6]"
)
SMOKE_MODELS = (
    "Ti/4[width=16,depth=1,num_heads=2,mlp_dim=32,label=small],"
    "Ti/4[width=32,depth=2,num_heads=2,mlp_dim=64,label=large]"
)


def pretrain_config(base: TrainConfig, data: str, *, epochs: int | None = None,
                    smoke: bool = False) -> TrainConfig:  # fmt: skip
    """Supervised pre-training on ``data`` at its own size (the first MNIST recipe), with the
    device, threads and precision of ``base``."""
    from vitkit.train.recipes import MNIST_V1
    from vitkit.train.recipes import smoke as shrink

    cfg = shrink(MNIST_V1) if smoke else MNIST_V1
    cfg = dataclasses.replace(
        cfg,
        data=data,
        data_root=base.data_root if data == base.data else None,
        image_size=None,
        device=base.device,
        threads=base.threads,
        precision=base.precision,
        progress=base.progress,
    )
    return cfg if epochs is None else dataclasses.replace(cfg, epochs=epochs)


def probe(
    run_dir: Path,
    data: str,
    shots: Sequence[int],
    probe_seeds: int,
    device: str = "cpu",
    data_root: str | None = None,
) -> dict[str, Any]:
    """Few-shot accuracies of a pre-trained model's frozen features on ``data`` at the model's
    own resolution (mean over ``probe_seeds`` draws of the support set, per number of shots)."""
    import torch

    from vitkit.checkpoints import load_model
    from vitkit.data import load_dataset, to_model_input
    from vitkit.data.arrays import ArrayDataset
    from vitkit.eval.fewshot import extract_features, fewshot_evaluate

    model, ckpt = load_model(weights_of(run_dir))
    model.to(device)
    size = ckpt.model_config.image_size
    pre = ckpt.preprocess

    def features(split: Literal["train", "test"]) -> tuple[torch.Tensor, torch.Tensor]:
        ds = load_dataset(data, split, image_size=size, val_size=0 if split == "train" else None,
                          root=data_root)  # fmt: skip
        if not isinstance(ds, ArrayDataset):
            raise VitkitError(f"{data}: the few-shot probe reads in-memory datasets (built-ins)")
        batches = [
            (*ds.get_batch(list(range(i, min(i + 256, len(ds))))), 0)
            for i in range(0, len(ds), 256)
        ]
        prep = lambda x: to_model_input(  # noqa: E731
            x, size, pre.channels, pre.mean, pre.std, pre.rescale_factor
        )
        return extract_features(model, batches, prep, device=device)

    train, test = features("train"), features("test")
    num_classes = int(max(train[1].max(), test[1].max())) + 1
    res = fewshot_evaluate(train, test, num_classes, shots, probe_seeds)
    return {"shots": {str(r.shots): r.to_json_dict() for r in res}}


def run_resolution(
    base: TrainConfig,
    models: Sequence[ModelSpec],
    pretrain_cfg: TrainConfig,
    seeds: int,
    out_dir: str | Path,
    *,
    high_res: int,
    shots: Sequence[int] = (5, 10, 25),
    probe_seeds: int = 3,
) -> tuple[list[RunResult], list[dict[str, Any]]]:
    """Pre-train every model, fine-tune it at both resolutions and probe it, seed-major;
    (fine-tuning results, probe records; ``pretrained_now`` says whether this call
    pre-trained the probe's model)."""
    if seeds < 1 or not models:
        raise VitkitError("a resolution study needs at least one model and one seed")
    check_labels(models)
    out = Path(out_dir)
    results: list[RunResult] = []
    probes: list[dict[str, Any]] = []
    for seed in range(seeds):
        specs = []
        for model in models:
            pre_dir = out / "runs" / model.label / "pretrain" / f"seed{seed}"
            report, trained = pretrain(dataclasses.replace(pretrain_cfg, seed=seed), model, pre_dir)
            low = int(report["model_config"]["image_size"][0])
            if high_res <= low:
                raise VitkitError(
                    f"--high-res {high_res} is not above the pre-training resolution {low}"
                )
            for res in (low, high_res):
                cfg = dataclasses.replace(base, init_from=str(weights_of(pre_dir)), image_size=res)
                spec = ModelSpec(model.name, {}, model.label)
                info = {"resolution": res, "arm": "low" if res == low else "high"}
                specs.append(RunSpec(cfg, spec, f"res{res}", seed, info=info))
            path = out / "runs" / model.label / "fewshot" / f"seed{seed}" / "fewshot.json"
            wanted = {"shots_asked": list(shots), "probe_seeds": probe_seeds}
            record = json.loads(path.read_text()) if path.is_file() else {}
            if trained or {k: record.get(k) for k in wanted} != wanted:
                record = {**probe(pre_dir, base.data, shots, probe_seeds, base.device,
                                  base.data_root), **wanted}  # fmt: skip
                path.parent.mkdir(parents=True, exist_ok=True)
                atomic_write_text(path, json.dumps(record, indent=1))
            probes.append({"model": model.label, "seed": seed, "pretrained_now": trained, **record})
        results += run_all(specs, out)
    return results, probes


# Accuracy differences within this are ties (float noise of sums of accuracies).
TIE = 1e-9


def _ms(values: Sequence[float]) -> dict[str, float]:
    clean = [v for v in values if not math.isnan(v)]
    mean, std = mean_std(clean) if clean else (math.nan, math.nan)
    return {"mean": mean, "std": std, "n": len(clean)}


def summarize_resolution(
    results: Sequence[RunResult], probes: Sequence[dict[str, Any]]
) -> dict[str, Any]:
    """Per model: fine-tuned accuracy at both resolutions, the paired gain, the probe; the
    rank correlations across models."""
    ft: dict[tuple[str, str], dict[int, float]] = {}
    res_of: dict[str, int] = {}
    for r in results:
        ft.setdefault((r.model, r.info["arm"]), {})[r.seed] = r.test_top1
        res_of[r.info["arm"]] = r.info["resolution"]
    shots_all = sorted({int(s) for p in probes for s in p["shots"]})
    fs: dict[tuple[str, int], dict[int, float]] = {}
    for p in probes:
        for s, v in p["shots"].items():
            fs.setdefault((p["model"], int(s)), {})[p["seed"]] = float(v["mean"])
    models = list(dict.fromkeys(r.model for r in results))
    rows = []
    for m in models:
        low, high = ft.get((m, "low"), {}), ft.get((m, "high"), {})
        row: dict[str, Any] = {
            "model": m,
            "low": _ms(list(low.values())),
            "high": _ms(list(high.values())),
            "gain": _ms([high[s] - low[s] for s in low if s in high]),
            "high_wins": sum(high[s] - low[s] > TIE for s in low if s in high),
            "fewshot": {str(n): _ms(list(fs.get((m, n), {}).values())) for n in shots_all},
        }
        rows.append(row)
    ranking: dict[str, Any] = {}
    seeds = sorted({r.seed for r in results})
    for n in shots_all:
        per_seed = []
        for s in seeds:
            xs = [fs.get((m, n), {}).get(s) for m in models]
            ys = [ft.get((m, "low"), {}).get(s) for m in models]
            pairs = [(x, y) for x, y in zip(xs, ys) if x is not None and y is not None]
            if len(pairs) >= 2:
                per_seed.append(spearman([x for x, _ in pairs], [y for _, y in pairs]))
        means = [(r["fewshot"][str(n)]["mean"], r["low"]["mean"]) for r in rows]
        ranking[str(n)] = {
            "per_seed": per_seed,
            "per_seed_ms": _ms(per_seed),
            "of_means": spearman([x for x, _ in means], [y for _, y in means])
            if len(means) >= 2
            else math.nan,
        }
    gains = [r["gain"]["mean"] for r in rows]
    verdict = {
        "models": models,
        "low_res": res_of.get("low"),
        "high_res": res_of.get("high"),
        "high_minus_low": {r["model"]: r["gain"] for r in rows},
        # a mean gain of float noise (3.7e-17 where the paired differences cancel) is a tie
        "models_where_high_wins_on_mean": sum(g > TIE for g in gains if not math.isnan(g)),
        "models_where_high_ties_on_mean": sum(abs(g) <= TIE for g in gains if not math.isnan(g)),
        "seed_pairs_where_high_wins": sum(r["high_wins"] for r in rows),
        "seed_pairs": sum(r["gain"]["n"] for r in rows),
        "spearman_probe_vs_finetune": ranking,
        "headline_shots": max(shots_all) if shots_all else None,
    }
    return {"rows": rows, "verdict_inputs": verdict}


def reading(verdict: dict[str, Any]) -> str:
    n = verdict["headline_shots"]
    rank = verdict["spearman_probe_vs_finetune"].get(str(n), {})
    ps = rank.get("per_seed_ms", {"mean": math.nan, "std": math.nan})
    return (
        f"Fine-tuning at {verdict['high_res']} px beat {verdict['low_res']} px on the mean for "
        f"{verdict['models_where_high_wins_on_mean']} of {len(verdict['models'])} models "
        f"and tied for {verdict['models_where_high_ties_on_mean']} "
        f"({verdict['seed_pairs_where_high_wins']} of {verdict['seed_pairs']} seed pairs); "
        f"{n}-shot probe vs fine-tuned ranking: Spearman {rank.get('of_means', math.nan):+.2f} "
        f"on the means, {ps['mean']:+.2f} ± {ps['std']:.2f} per seed."
    )


def markdown(summary: dict[str, Any], data: str, pretrain_data: str) -> str:
    v = summary["verdict_inputs"]
    shots = sorted(int(s) for s in summary["rows"][0]["fewshot"]) if summary["rows"] else []
    lines = [
        f"| model | fine-tuned at {v['low_res']} px | at {v['high_res']} px | gain | "
        + " | ".join(f"{n}-shot probe" for n in shots)
        + " |",
        "|---|---:|---:|---:|" + "---:|" * len(shots),
    ]

    def pm(x: dict[str, float]) -> str:
        return f"{100 * x['mean']:.2f} ± {100 * x['std']:.2f}"

    for r in summary["rows"]:
        cells = [pm(r["low"]), pm(r["high"]), pm(r["gain"])]
        cells += [pm(r["fewshot"][str(n)]) for n in shots]
        lines.append(f"| {r['model']} | " + " | ".join(cells) + " |")
    lines += [
        "",
        f"Test top-1 (%) on {data} after supervised pre-training on {pretrain_data}; mean ± "
        "sample std over seeds; probes on frozen pre-trained features at the pre-training "
        "resolution.",
        "",
        f"Reading: {reading(v)}",
    ]
    return "\n".join(lines)


def write_resolution(
    results: Sequence[RunResult],
    probes: Sequence[dict[str, Any]],
    out_dir: str | Path,
    *,
    data: str,
    pretrain_data: str,
) -> dict[str, Path]:
    """``results.json``, ``resolution.md`` and ``resolution.png`` in ``out_dir``."""
    from vitkit.plotting.paper import plot_resolution

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    summary = summarize_resolution(results, probes)
    paths = {
        "results": out / "results.json",
        "table": out / "resolution.md",
        "plot": out / "resolution.png",
    }
    body = {
        "data": data,
        "pretrain_data": pretrain_data,
        "runs": [r.to_dict() for r in results],
        "probes": list(probes),
        "trained_runs": sum(r.trained for r in results)
        + sum(bool(p.get("pretrained_now")) for p in probes),
        **summary,
    }
    atomic_write_text(paths["results"], json.dumps(json_ready(body), indent=1))
    title = f"Fine-tuning resolution and few-shot vs fine-tuning ({data})"
    atomic_write_text(paths["table"], f"# {title}\n\n{markdown(summary, data, pretrain_data)}\n")
    v = summary["verdict_inputs"]
    n = str(v["headline_shots"])
    arms = {
        r["model"]: {
            f"{v['low_res']} px": (r["low"]["mean"], r["low"]["std"]),
            f"{v['high_res']} px": (r["high"]["mean"], r["high"]["std"]),
        }
        for r in summary["rows"]
    }
    points = [
        {
            "model": r["model"],
            "fewshot_mean": r["fewshot"][n]["mean"],
            "fewshot_std": r["fewshot"][n]["std"],
            "finetune_mean": r["low"]["mean"],
            "finetune_std": r["low"]["std"],
        }
        for r in summary["rows"]
    ]
    rho = v["spearman_probe_vs_finetune"].get(n, {}).get("of_means", math.nan)
    plot_resolution(arms, points, paths["plot"], rho=rho, title=title)
    return paths
