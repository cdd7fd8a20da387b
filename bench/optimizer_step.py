"""The optimizer step on the CPU: PyTorch's single-tensor, for-each and fused AdamW.

PyTorch defaults to for-each only on CUDA-like devices; on the CPU it runs one parameter at a
time. vitkit asks for for-each there, and for fused AdamW from 1 M parameters. This times one
AdamW step (with vitkit's two parameter groups and gradients in place) of the MNIST recipes'
models and of Ti/16 and S/16, each implementation interleaved round by round; medians. Writes
JSON and a markdown table.

    python bench/optimizer_step.py                # under a minute on 2 cores
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from pathlib import Path

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import torch  # noqa: E402

from vitkit.hardware import cpu_name  # noqa: E402
from vitkit.models.vit import VisionTransformer  # noqa: E402
from vitkit.registry.model_config import model_config  # noqa: E402
from vitkit.train.optim import param_groups  # noqa: E402
from vitkit.train.recipes import get_recipe  # noqa: E402

IMPLS = {
    "single-tensor": {"foreach": False},
    "for-each": {"foreach": True},
    "fused": {"fused": True},
}


def models() -> dict[str, VisionTransformer]:
    out = {}
    for name in ("mnist", "mnist-best", "mnist-long"):
        r = get_recipe(name).config
        cfg = model_config(r.model, num_classes=10, in_chans=1, image_size=28, **r.model_overrides)
        out[f"{name} recipe"] = VisionTransformer(cfg)
    for name in ("Ti/16", "S/16"):
        out[name] = VisionTransformer(model_config(name, num_classes=1000))
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--out", default="bench/results/optimizer_step")
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    rows = []
    for name, model in models().items():
        for q in model.parameters():
            q.grad = torch.randn_like(q)
        opts = {
            k: torch.optim.AdamW(param_groups(model, 0.05), lr=1e-4, **kw)
            for k, kw in IMPLS.items()
        }
        ms: dict[str, list[float]] = {}
        for _ in range(args.rounds):
            for impl, opt in opts.items():
                opt.step()
                t = time.perf_counter()
                for _ in range(args.steps):
                    opt.step()
                ms.setdefault(impl, []).append(1e3 * (time.perf_counter() - t) / args.steps)
        n = sum(q.numel() for q in model.parameters())
        tensors = len(list(model.parameters()))
        rows.append(
            {"model": name, "parameters": n, "tensors": tensors}
            | {impl: statistics.median(v) for impl, v in ms.items()}
        )
    meta = {
        "cpu": cpu_name(),
        "threads": args.threads,
        "torch": torch.__version__,
        "rounds": args.rounds,
    }
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.with_suffix(".json").write_text(json.dumps({"meta": meta, "rows": rows}, indent=1))
    lines = [
        "# AdamW step on the CPU (ms per step; lower is faster)",
        "",
        f"CPU: {meta['cpu']} ({args.threads} threads), torch {torch.__version__}, medians of "
        f"{args.rounds} interleaved rounds of {args.steps} steps. Command: `python "
        f"bench/optimizer_step.py --rounds {args.rounds}`. vitkit uses for-each on the CPU, "
        "fused AdamW from 1 M parameters (vitkit.train.optim).",
        "",
        "| model | parameters | tensors | single-tensor (CPU default) | for-each | fused |",
        "| --- | ---: | ---: | ---: | ---: | ---: |",
    ]
    for r in rows:
        lines.append(
            f"| {r['model']} | {r['parameters']:,} | {r['tensors']} | {r['single-tensor']:.2f} | "
            f"{r['for-each']:.2f} | {r['fused']:.2f} |"
        )
    out.with_suffix(".md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
