"""glibc malloc settings and CPU speed: glibc's defaults vs vitkit.engines.allocator vs the
variables.

Each setting runs in its own fresh process (malloc is configured before PyTorch loads), the
settings interleaved round by round so that machine noise hits all alike; the figure of a
process is the median of its timed calls after a warm-up call. Workloads: ViT-B/16 inference at
batch 32 (timm fp32, vitkit fp32 as `vitkit eval` runs it, vitkit bf16 where native) and the
mnist-best recipe's training step (batch 128, bf16 where native), whose activations are small.

    python bench/malloc.py --rounds 3 --out bench/results/malloc
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

SETTINGS = {
    "glibc defaults": {},
    "vitkit (mallopt at start)": {},  # the child calls vitkit.engines.allocator.keep_freed_memory()
    "MALLOC_MMAP_THRESHOLD_=1 GiB (env)": {"MALLOC_MMAP_THRESHOLD_": "1073741824"},
}


def child(setting: str, calls: int) -> None:
    if setting.startswith("vitkit"):
        from vitkit.engines.allocator import keep_freed_memory

        assert keep_freed_memory()
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    import copy

    import torch
    import torch.nn.functional as F

    root = Path(__file__).resolve().parent.parent
    sys.path[:0] = [str(root / "tests"), str(root / "bench")]  # the timm import shim, speed.py
    from references import import_reference
    from speed import model_cfg

    import vitkit
    from vitkit.checkpoints.timm import vision_transformer as timm_conv
    from vitkit.engines.onednn import onednn_linears
    from vitkit.hardware import native_bf16
    from vitkit.registry.model_config import model_config
    from vitkit.train.optim import build_optimizer
    from vitkit.train.recipes import get_recipe

    bf16 = native_bf16(torch.device("cpu"))
    cfg = model_cfg("B/16")
    torch.manual_seed(0)
    ours = vitkit.create_model(cfg).eval()
    timm = import_reference("timm")
    t = timm.create_model("vit_base_patch16_224", **timm_conv.timm_model_args(cfg)).eval()
    t.load_state_dict(timm_conv.state_dict_to_timm(ours.state_dict(), cfg))
    fast = copy.deepcopy(ours)
    onednn_linears(fast)
    x = torch.randn(32, 3, 224, 224)

    def infer(model: torch.nn.Module, autocast: bool):
        def run() -> None:
            with torch.inference_mode(), torch.autocast("cpu", torch.bfloat16, enabled=autocast):
                model(x)

        return run

    recipe = get_recipe("mnist-best").config
    mcfg = model_config(
        recipe.model, num_classes=10, in_chans=1, image_size=28, **recipe.model_overrides
    )
    mnist = vitkit.VisionTransformer(mcfg)
    opt = build_optimizer(mnist, "adamw", 1e-3, 0.05)
    mx, my = torch.randn(128, 1, 28, 28), torch.randint(0, 10, (128,))

    def train_steps() -> None:
        for _ in range(10):
            with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
                loss = F.cross_entropy(mnist(mx).float(), my)
            loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)

    work = {
        "B/16 b32 timm fp32": (infer(t, False), 32),
        "B/16 b32 vitkit fp32": (infer(fast, False), 32),
    }
    if bf16:
        work["B/16 b32 vitkit bf16"] = (infer(ours, True), 32)
    work[f"mnist-best train step b128 {'bf16' if bf16 else 'fp32'}"] = (train_steps, 1280)
    out = {}
    for name, (fn, images) in work.items():
        fn()
        times = []
        for _ in range(calls):
            s = time.perf_counter()
            fn()
            times.append(time.perf_counter() - s)
        out[name] = images / statistics.median(times)
    print(json.dumps(out))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--calls", type=int, default=3, help="timed calls per workload and process")
    ap.add_argument("--out", default="bench/results/malloc")
    ap.add_argument("--child", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        child(args.child, args.calls)
        return
    from vitkit.hardware import cpu_name

    base_env = {k: v for k, v in os.environ.items() if not k.startswith(("MALLOC_", "VITKIT_"))}
    results: dict[str, list[dict[str, float]]] = {s: [] for s in SETTINGS}
    for r in range(args.rounds):
        for setting, env in SETTINGS.items():
            proc = subprocess.run(
                [sys.executable, __file__, "--child", setting, "--calls", str(args.calls)],
                env={**base_env, **env},  # only the vitkit setting's child calls mallopt
                capture_output=True,
                text=True,
                check=True,
            )
            results[setting].append(json.loads(proc.stdout.strip().splitlines()[-1]))
            print(f"round {r + 1}: {setting}: {results[setting][-1]}", flush=True)
    workloads = list(results["glibc defaults"][0])
    med = {
        s: {w: statistics.median(run[w] for run in runs) for w in workloads}
        for s, runs in results.items()
    }
    import torch

    command = "python bench/malloc.py " + " ".join(sys.argv[1:])
    meta = {
        "cpu": cpu_name(),
        "torch": torch.__version__,
        "command": command,
        "rounds": args.rounds,
    }
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.with_suffix(".json").write_text(
        json.dumps({**meta, "images_per_s": results, "median": med}, indent=1)
    )
    lines = [
        f"glibc malloc settings, {meta['cpu']}, torch {meta['torch']}: images/s, median of "
        f"{args.rounds} processes per setting (interleaved), each the median of {args.calls} calls",
        "",
        "| workload | " + " | ".join(SETTINGS) + " |",
        "| --- |" + " ---: |" * len(SETTINGS),
    ]
    base = med["glibc defaults"]
    for w in workloads:
        cells = [
            f"{med[s][w]:.1f}" + ("" if s == "glibc defaults" else f" ({med[s][w] / base[w]:.2f}x)")
            for s in SETTINGS
        ]
        lines.append(f"| {w} | " + " | ".join(cells) + " |")
    lines += ["", f"Command: `{command}`"]
    out.with_suffix(".md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
