"""Which test-time augmentation, chosen on validation: the mnist-best runs' final weights on
their own val splits under sets of views (shifts, diagonal and 2-pixel shifts, rotations,
zooms), each view's probabilities computed once and averaged per set.

Errors are counted over the runs' val images (each run holds out its own 5,000); "fixed" and
"broke" count the images a set gets right / wrong that the plain image did not, so the
comparison is paired (same images, same weights). Writes JSON and a markdown table.

    python bench/mnist_tta.py RUN_DIR [RUN_DIR ...]    # a few minutes per run on 2 cores
"""

from __future__ import annotations

import argparse
import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from torch import Tensor  # noqa: E402

from vitkit.checkpoints import load_model  # noqa: E402
from vitkit.data.transforms import to_model_input  # noqa: E402
from vitkit.eval.checkpoint_eval import checkpoint_dataset  # noqa: E402
from vitkit.eval.tta import jitter_views, shifted_views  # noqa: E402
from vitkit.hardware import cpu_name  # noqa: E402


def moved(x: torch.Tensor, dy: int, dx: int) -> torch.Tensor:
    """``x`` with its content moved ``dy`` px down and ``dx`` px right, edges repeated (as
    ``shifted_views``, for the diagonal moves that the recipe's views do not have)."""
    s = max(abs(dy), abs(dx))
    h, w = x.shape[-2:]
    padded = F.pad(x, (s, s, s, s), mode="replicate")
    return padded[..., s - dy : s - dy + h, s - dx : s - dx + w]


def views(x: torch.Tensor) -> dict[str, torch.Tensor]:
    out = dict(zip(("id", "right", "left", "down", "up"), jitter_views(x, shift=1)))
    out.update({f"diag{dy},{dx}": moved(x, dy, dx) for dy in (1, -1) for dx in (1, -1)})
    out.update(zip(("right2", "left2", "down2", "up2"), shifted_views(x, 2)[1:]))
    out.update(zip(("rot+8", "rot-8"), jitter_views(x, rotate=8.0)[1:]))
    out.update(zip(("zoom1.08", "zoom0.92"), jitter_views(x, zoom=0.08)[1:]))
    return out


SHIFT1 = ["id", "right", "left", "down", "up"]
SETS = {
    "none": ["id"],
    "1-px shifts (5)": SHIFT1,
    "+ diagonal shifts (9)": SHIFT1 + ["diag1,1", "diag1,-1", "diag-1,1", "diag-1,-1"],
    "+ 2-px shifts (9)": SHIFT1 + ["right2", "left2", "down2", "up2"],
    "+ rotations +-8 deg (7)": SHIFT1 + ["rot+8", "rot-8"],
    "+ zooms 1 +- 0.08 (7)": SHIFT1 + ["zoom1.08", "zoom0.92"],
    "+ rotations and zooms (9)": SHIFT1 + ["rot+8", "rot-8", "zoom1.08", "zoom0.92"],
    "all 17": None,  # every view
}


def model_inputs(run: str, split: str) -> tuple[torch.nn.Module, Any, Any, Iterator[Tensor]]:
    """A run's final model, checkpoint and ``split`` of MNIST (the run's own val partition),
    and that split's model inputs in batches of 500."""
    model, ckpt = load_model(run)
    ds = checkpoint_dataset(ckpt, "mnist", split, None)
    pre = ckpt.preprocess
    batches = (
        to_model_input(
            ds.images[i : i + 500],
            pre.image_size,
            pre.channels,
            pre.mean,
            pre.std,
            pre.rescale_factor,
        )
        for i in range(0, len(ds.labels), 500)
    )
    return model, ckpt, ds, batches


def study(run: str, split: str) -> dict:
    model, ckpt, ds, batches = model_inputs(run, split)
    probs: dict[str, list[torch.Tensor]] = {}
    with torch.inference_mode():
        for x in batches:
            for k, v in views(x).items():
                probs.setdefault(k, []).append(model(v).float().softmax(-1))
    p = {k: torch.cat(v) for k, v in probs.items()}
    y = ds.labels
    plain = p["id"].argmax(-1) == y
    rows = {}
    for name, keys in SETS.items():
        mean = torch.stack([p[k] for k in (keys or list(p))]).mean(0)
        ok = mean.argmax(-1) == y
        nll = -mean.clamp_min(1e-12).log().gather(1, y[:, None]).mean()
        rows[name] = {
            "errors": int((~ok).sum()),
            "nll": round(float(nll), 5),
            "fixed": int((ok & ~plain).sum()),
            "broke": int((~ok & plain).sum()),
        }
    seed = ckpt.meta.get("train_config", {}).get("seed")
    return {"run": run, "seed": seed, "images": len(y), "sets": rows}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("runs", nargs="+", help="mnist-best run directories")
    ap.add_argument("--split", default="val", choices=["val", "test"])
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--out", default="bench/results/mnist_tta")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    results = []
    for run in args.runs:
        results.append(study(run, args.split))
        print(run, {k: v["errors"] for k, v in results[-1]["sets"].items()}, flush=True)
    out = Path(args.out)
    meta = {"cpu": cpu_name(), "torch": torch.__version__, "split": args.split}
    meta["command"] = "python bench/mnist_tta.py " + " ".join(args.runs) + f" --split {args.split}"
    out.with_suffix(".json").write_text(json.dumps({"meta": meta, "runs": results}, indent=1))
    total = sum(r["images"] for r in results)
    lines = [
        f"Test-time augmentation views on the {args.split} split of {len(results)} mnist-best "
        f"run(s), {total:,} images in all. Command: `{meta['command']}`.",
        "",
        "| views | "
        + " | ".join(f"{Path(r['run']).name} errors" for r in results)
        + " | errors in all | fixed / broke vs none |",
        "| --- | " + " | ".join("---:" for _ in results) + " | ---: | ---: |",
    ]
    for name in SETS:
        each = [r["sets"][name] for r in results]
        fixed, broke = sum(e["fixed"] for e in each), sum(e["broke"] for e in each)
        lines.append(
            f"| {name} | "
            + " | ".join(str(e["errors"]) for e in each)
            + f" | {sum(e['errors'] for e in each)} | {fixed} / {broke} |"
        )
    out.with_suffix(".md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
