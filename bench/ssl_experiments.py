"""Does self-supervised pre-training help here? (issue 9, docs/experiments.md)

Encoders pre-trained on MNIST images without their labels (``vitkit pretrain``, masked patch
prediction and/or MAE) against random init, on the same labelled subsets:

1. fine-tuning with 1 % and 10 % of MNIST's labels (stratified subsets chosen by the seed), the
   same recipe (``mnist-few-labels``: AdamW 3e-3, warmup + cosine, affine augmentation, bf16)
   from scratch and from each encoder (new zero head): test top-1, mean ± std over seeds;
2. few-shot linear probes (the paper's closed-form ridge, l2 chosen off the test set) of the
   frozen features: the class token (what ``vitkit fewshot`` uses) and the mean of the patch
   tokens, 1/5/10/25 shots per class, mean ± std over seeds.

    vitkit pretrain --objective mpp --out-dir runs/ssl/mnist-mpp
    vitkit pretrain --objective mae --out-dir runs/ssl/mnist-mae
    python bench/ssl_experiments.py --init mpp=runs/ssl/mnist-mpp --init mae=runs/ssl/mnist-mae

Runs already finished under ``--out`` are reused (they are deterministic), so the script can be
stopped and started again. Results: ``--out``/results.{json,md} and bench/results/ssl_experiments.*
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import time
from pathlib import Path

import numpy as np
import torch

from vitkit.checkpoints import read_checkpoint
from vitkit.data import load_dataset, to_model_input
from vitkit.eval.fewshot import fewshot_evaluate
from vitkit.models.vit import VisionTransformer
from vitkit.train.recipes import MNIST_FEW_LABELS
from vitkit.train.trainer import Trainer

# (fraction of the labels, batch size, epochs): 450 and 230 optimizer steps (about 100 s each
# on the shared 2-vCPU machine).
FRACTIONS = ((0.01, 64, 50), (0.1, 128, 5))
SHOTS = (1, 5, 10, 25)
RESULTS = Path(__file__).resolve().parent / "results"


def mean_std(values: list[float]) -> str:
    if len(values) < 2:
        return f"{100 * values[0]:.2f}" if values else "-"
    return f"{100 * np.mean(values):.2f} ± {100 * np.std(values, ddof=1):.2f}"


def finetune(init: str | None, fraction: float, batch: int, epochs: int, seed: int, out: Path):
    report_file = out / "report.json"
    if report_file.is_file():
        return json.loads(report_file.read_text())
    cfg = dataclasses.replace(
        MNIST_FEW_LABELS,
        train_size=fraction,
        batch_size=batch,
        epochs=epochs,
        init_from=init,
        seed=seed,
        out_dir=str(out),
        progress=False,
        resume=(out / "checkpoints" / "LATEST").is_file(),  # a stopped run continues exactly
    )
    return Trainer(cfg).fit()


@torch.no_grad()
def features(model: VisionTransformer, split: str) -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
    """Class-token and patch-mean features of a split of MNIST (bf16 autocast)."""
    data = load_dataset("mnist", split, val_size=0)
    model.eval()
    cls, mean, labels = [], [], []
    prefix = model.cfg.num_prefix_tokens
    for i in range(0, len(data), 512):
        images, y = data.get_batch(torch.arange(i, min(i + 512, len(data))))
        x = to_model_input(images, model.cfg.image_size, 1)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            tokens = model.forward_features(x)
        cls.append(model.forward_head(tokens.float(), pre_logits=True).double())
        mean.append(tokens[:, prefix:].float().mean(1).double())
        labels.append(y)
    y = torch.cat(labels)
    return {"class token": (torch.cat(cls), y), "patch mean": (torch.cat(mean), y)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--init", action="append", default=[], metavar="NAME=CKPT")
    ap.add_argument("--seeds", type=int, default=3)
    ap.add_argument("--out", default="runs/ssl")
    ap.add_argument("--skip-fewshot", action="store_true")
    args = ap.parse_args()
    inits: dict[str, str | None] = {"scratch": None}
    for item in args.init:
        name, _, path = item.partition("=")
        inits[name] = path
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    results: dict = {"inits": inits, "seeds": args.seeds, "fractions": FRACTIONS}

    # 1. Fine-tuning on few labels; seed-major so that a stopped run has balanced partial results.
    t0 = time.perf_counter()
    acc: dict[str, dict[str, list[float]]] = {n: {} for n in inits}
    wall: dict[str, dict[str, list[float]]] = {n: {} for n in inits}
    for seed in range(args.seeds):
        for fraction, batch, epochs in FRACTIONS:
            for name, init in inits.items():
                run_dir = out / "ft" / f"{name}-{fraction:g}-s{seed}"
                report = finetune(init, fraction, batch, epochs, seed, run_dir)
                acc[name].setdefault(f"{fraction:g}", []).append(report["test_top1"])
                wall[name].setdefault(f"{fraction:g}", []).append(report["wall_s"])
                print(f"{name} {fraction:g} seed {seed}: {100 * report['test_top1']:.2f} %")
    t1 = time.perf_counter()
    results.update(finetune_top1=acc, finetune_wall_s=wall)

    # 2. Few-shot probes of the frozen features (random init: the same architecture, seed 0).
    fewshot: dict[str, dict[str, dict[int, list[float]]]] = {}
    if not args.skip_fewshot:
        models: dict[str, VisionTransformer] = {}
        for name, init in inits.items():
            if init is None:
                continue
            ckpt = read_checkpoint(init)
            m = VisionTransformer(ckpt.model_config)
            m.load_state_dict(ckpt.state_dict)
            models[name] = m
            arch = ckpt.model_config
        torch.manual_seed(0)
        models = {"random init": VisionTransformer(arch), **models}
        for name, m in models.items():
            train, test = features(m, "train"), features(m, "test")
            fewshot[name] = {}
            for kind in train:
                res = fewshot_evaluate(train[kind], test[kind], 10, SHOTS, args.seeds)
                fewshot[name][kind] = {r.shots: r.accuracies for r in res}
                print(name, kind, [f"{100 * r.mean:.1f}" for r in res])
    t2 = time.perf_counter()
    results.update(fewshot=fewshot, wall_s={"finetune": t1 - t0, "fewshot": t2 - t1})

    lines = [
        f"MNIST test top-1 (%), mean ± std over {args.seeds} seeds (recipe mnist-few-labels):",
        "",
        "| start | 1 % labels (600) | 10 % labels (6,000) |",
        "| --- | ---: | ---: |",
    ]
    for name in inits:
        cells = " | ".join(mean_std(acc[name].get(f"{f:g}", [])) for f, _, _ in FRACTIONS)
        lines.append(f"| {name} | {cells} |")
    if fewshot:
        lines += [
            "",
            f"Few-shot linear probe on MNIST (%), frozen features, {args.seeds} seeds:",
            "",
            "| encoder | features | " + " | ".join(f"{n}-shot" for n in SHOTS) + " |",
            "| --- | --- |" + " ---: |" * len(SHOTS),
        ]
        for name, kinds in fewshot.items():
            for kind, by_shot in kinds.items():
                cells = " | ".join(mean_std(by_shot[n]) for n in SHOTS)
                lines.append(f"| {name} | {kind} | {cells} |")
    ft_wall = {n: {f: float(np.mean(v)) for f, v in w.items()} for n, w in wall.items()}
    lines += [
        "",
        f"wall time: fine-tuning {t1 - t0:.0f} s in this invocation (mean per run: "
        + "; ".join(
            f"{n} " + ", ".join(f"{f}: {s:.0f} s" for f, s in w.items()) for n, w in ft_wall.items()
        )
        + f"), few-shot {t2 - t1:.0f} s",
    ]
    text = "\n".join(lines) + "\n"
    (out / "results.json").write_text(json.dumps(results, indent=1))
    (out / "results.md").write_text(text)
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "ssl_experiments.json").write_text(json.dumps(results, indent=1))
    (RESULTS / "ssl_experiments.md").write_text(text)
    print(text)


if __name__ == "__main__":
    main()
