"""The paper's recipe in miniature (issue 4, docs/experiments.md): pre-train on MNIST at 28 px,
then on scikit-learn's digits

1. transfer: fine-tune at 56 px (paper-finetune scaled down: SGD, zero head, pre-logits dropped,
   2-D interpolated position embeddings) vs. the same model trained from scratch at 56 px;
2. few-shot: 1/5/10/25-shot linear probes of the MNIST-pre-trained features vs. random init;
3. resolution: fine-tuning with interpolated vs. freshly initialised position embeddings.

Accuracies are mean ± std over seeds on the digits test set (360 images).

    vitkit train --recipe mnist-pretrain --out-dir runs/mnist-pretrain
    python bench/transfer_experiments.py --pretrained runs/mnist-pretrain --seeds 3
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import time
from pathlib import Path

import numpy as np
import torch

from vitkit.checkpoints import read_checkpoint, write_checkpoint
from vitkit.data import load_dataset, to_model_input
from vitkit.eval.fewshot import extract_features, fewshot_evaluate
from vitkit.models.vit import VisionTransformer
from vitkit.train.recipes import DIGITS_FINETUNE, MNIST
from vitkit.train.trainer import TrainConfig, Trainer


def mean_std(values: list[float]) -> str:
    return f"{100 * np.mean(values):.2f} ± {100 * np.std(values, ddof=1):.2f}"


def run(cfg: TrainConfig) -> float:
    report_file = Path(cfg.out_dir) / "report.json"
    if report_file.is_file():  # finished earlier: reuse (the runs are deterministic)
        return float(json.loads(report_file.read_text())["test_top1"])
    return float(Trainer(cfg).fit()["test_top1"])


def features(model: torch.nn.Module, split: str, size: tuple[int, int]) -> tuple:
    data = load_dataset("digits", split, image_size=size)
    batches = [
        data.get_batch(torch.arange(i, min(i + 256, len(data)))) + (0,)
        for i in range(0, len(data), 256)
    ]
    return extract_features(model, batches, lambda x: to_model_input(x, size, 1))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--pretrained", required=True)
    ap.add_argument("--seeds", type=int, default=3)
    ap.add_argument("--out", default="runs/transfer")
    ap.add_argument("--epochs", type=int, default=DIGITS_FINETUNE.epochs)
    args = ap.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    results: dict = {"pretrained": args.pretrained, "seeds": args.seeds, "epochs": args.epochs}
    t0 = time.perf_counter()

    # 1. Transfer vs. scratch, both at 56 px on digits.
    pre = read_checkpoint(args.pretrained)
    ft = dataclasses.replace(
        DIGITS_FINETUNE, init_from=args.pretrained, epochs=args.epochs, progress=False
    )
    arch = {k: getattr(pre.model_config, k) for k in ("width", "depth", "num_heads", "mlp_dim")}
    scratch = dataclasses.replace(
        MNIST,
        data="digits",
        image_size=56,
        model_overrides=arch,
        epochs=args.epochs,
        batch_size=64,
        warmup_epochs=1.0,
        progress=False,
    )  # the MNIST recipe's from-scratch optimiser (AdamW 3e-3), same data, size and epochs
    acc: dict[str, list[float]] = {"finetune": [], "scratch": [], "finetune_fresh_posemb": []}
    for seed in range(args.seeds):
        acc["finetune"].append(
            run(dataclasses.replace(ft, seed=seed, out_dir=str(out / f"ft-s{seed}")))
        )
        acc["scratch"].append(
            run(dataclasses.replace(scratch, seed=seed, out_dir=str(out / f"scratch-s{seed}")))
        )
    t1 = time.perf_counter()

    # 3. The same fine-tuning with the position embeddings re-initialised at 56 px.
    fresh = read_checkpoint(args.pretrained, image_size=56)
    g = torch.Generator().manual_seed(0)
    pos = fresh.state_dict["pos_embed"]
    fresh.state_dict["pos_embed"] = torch.randn(pos.shape, generator=g) * 0.02
    write_checkpoint(fresh, out / "pretrained-fresh-posemb", "vitkit")
    ft_fresh = dataclasses.replace(ft, init_from=str(out / "pretrained-fresh-posemb"))
    for seed in range(args.seeds):
        acc["finetune_fresh_posemb"].append(
            run(dataclasses.replace(ft_fresh, seed=seed, out_dir=str(out / f"ftfresh-s{seed}")))
        )
    t2 = time.perf_counter()

    # 2. Few-shot linear probes: pre-trained vs. random-init features (28 px, as pre-trained).
    model = VisionTransformer(pre.model_config)
    model.load_state_dict(pre.state_dict)
    torch.manual_seed(0)
    random_model = VisionTransformer(pre.model_config)
    size = pre.model_config.image_size
    fewshot = {}
    for name, m in (("pretrained", model), ("random_init", random_model)):
        res = fewshot_evaluate(
            features(m, "train", size), features(m, "test", size), 10, (1, 5, 10, 25), args.seeds
        )
        fewshot[name] = {r.shots: r.accuracies for r in res}
    t3 = time.perf_counter()

    results.update(
        accuracy=acc,
        fewshot=fewshot,
        wall_s={"transfer": t1 - t0, "fresh_posemb": t2 - t1, "fewshot": t3 - t2},
    )
    (out / "results.json").write_text(json.dumps(results, indent=1))
    lines = [
        f"Digits test top-1 (%), mean ± std over {args.seeds} seeds, {args.epochs} epochs, 56 px:",
        "",
        "| start | test top-1 |",
        "| --- | ---: |",
        f"| MNIST-pre-trained, fine-tuned (interpolated position embeddings) | "
        f"{mean_std(acc['finetune'])} |",
        f"| MNIST-pre-trained, fine-tuned (fresh position embeddings) | "
        f"{mean_std(acc['finetune_fresh_posemb'])} |",
        f"| from scratch | {mean_std(acc['scratch'])} |",
        "",
        "Few-shot linear probe on digits (%), frozen features at 28 px:",
        "",
        "| features | 1-shot | 5-shot | 10-shot | 25-shot |",
        "| --- | ---: | ---: | ---: | ---: |",
    ]
    for name in ("pretrained", "random_init"):
        cells = " | ".join(mean_std(fewshot[name][n]) for n in (1, 5, 10, 25))
        lines.append(f"| {name} | {cells} |")
    lines += [
        "",
        f"wall time: transfer {t1 - t0:.0f} s, fresh-posemb {t2 - t1:.0f} s, "
        f"few-shot {t3 - t2:.0f} s",
    ]
    (out / "results.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
