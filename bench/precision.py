"""bf16 against fp32 on this machine's CPU: matmuls and training steps, interleaved.

bf16 autocast only pays where the CPU multiplies bf16 natively (AVX512-BF16 or AMX; oneDNN's
``torch.ops.mkldnn._is_mkldnn_bf16_supported()``). Elsewhere PyTorch emulates it. This script
records what the host has and measures, alternating fp32 and bf16 round by round (a shared
machine's noise hits both alike): matmuls of the shapes a small ViT runs, and whole training
steps (forward, backward, AdamW) of the default recipe's model. It backs ``precision="auto"``
(vitkit.hardware): bf16 exactly where it is native.

    python bench/precision.py                 # writes bench/results/precision.{json,md}
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import torch
import torch.nn.functional as F

from vitkit.hardware import native_bf16
from vitkit.models.vit import VisionTransformer
from vitkit.registry.model_config import model_config
from vitkit.train.recipes import RECIPES

ROOT = Path(__file__).resolve().parents[1]
SHAPES = [(4352, 64, 192), (4352, 64, 128), (4352, 128, 64), (1024, 512, 512)]


def _time(fn: object, reps: int) -> float:
    assert callable(fn)
    fn()  # warm-up
    t = time.perf_counter()
    for _ in range(reps):
        fn()
    return (time.perf_counter() - t) / reps


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--out", default=str(ROOT / "bench" / "results" / "precision"))
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    cpu = torch.device("cpu")
    times: dict[str, dict[str, list[float]]] = {}
    recipe = RECIPES["mnist"].config
    overrides = {"image_size": 28, "in_chans": 1, "num_classes": 10, **recipe.model_overrides}
    cfg = model_config(recipe.model, **overrides)  # MNIST's input, as the recipe trains it
    model = VisionTransformer(cfg)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    x = torch.randn(args.batch, cfg.in_chans, *cfg.image_size)
    y = torch.randint(0, cfg.num_classes, (args.batch,))

    def step(bf16: bool) -> None:
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
            loss = F.cross_entropy(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()

    for r in range(args.rounds):
        for m, k, n in SHAPES:
            name = f"matmul {m}x{k} @ {k}x{n}"
            for prec, dt in (("fp32", torch.float32), ("bf16", torch.bfloat16)):
                a, b = torch.randn(m, k, dtype=dt), torch.randn(k, n, dtype=dt)
                t = _time(lambda a=a, b=b: a @ b, 3)
                times.setdefault(name, {}).setdefault(prec, []).append(t)
                print(f"  {name} {prec}: {t * 1e3:.1f} ms", flush=True)
        name = f"training step, {cfg.short_name}, batch {args.batch}"
        for prec in ("fp32", "bf16"):
            t = _time(lambda p=prec: step(p == "bf16"), 2)
            times.setdefault(name, {}).setdefault(prec, []).append(t)
            print(f"  {name} {prec}: {t * 1e3:.1f} ms", flush=True)
        print(f"round {r + 1}/{args.rounds} done", flush=True)
    rows = []
    for name, by in times.items():
        f32, b16 = statistics.median(by["fp32"]), statistics.median(by["bf16"])
        rows.append(
            {"what": name, "fp32_ms": f32 * 1e3, "bf16_ms": b16 * 1e3, "bf16_over_fp32": b16 / f32}
        )
    result = {
        "native_bf16": native_bf16(cpu),
        "cpu_capability": torch.backends.cpu.get_cpu_capability(),
        "torch": torch.__version__,
        "threads": args.threads,
        "rounds": args.rounds,
        "rows": rows,
    }
    out = Path(args.out)
    out.with_suffix(".json").write_text(json.dumps(result, indent=2) + "\n")
    lines = [
        f"bf16 vs fp32 on this CPU: native bf16 {result['native_bf16']}, capability "
        f"{result['cpu_capability']}, torch {result['torch']}, {args.threads} thread(s), median of "
        f"{args.rounds} interleaved rounds",
        "",
        "| what | fp32 ms | bf16 ms | bf16 time / fp32 time |",
        "| --- | ---: | ---: | ---: |",
    ]
    lines += [
        f"| {r['what']} | {r['fp32_ms']:.2f} | {r['bf16_ms']:.2f} | {r['bf16_over_fp32']:.1f}x |"
        for r in rows
    ]
    out.with_suffix(".md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
