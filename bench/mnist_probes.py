"""One change to mnist-best against the base run of the same seed, image by image on their
shared validation split (the seed chooses the partition, so both runs hold out the same 5,000).

Per pair: both runs' final weights on those images (the plain image, no TTA), the errors of each,
the images the change fixed and broke, and the exact two-sided sign-test (McNemar) p-value of
fixed vs broke, pooled over the pairs too. The runs' own final val and test top-1 (as each run
printed it, with the recipe's TTA) are listed beside. The test split is not read here.

    python bench/mnist_probes.py BASE:PROBE [BASE:PROBE ...] --out bench/results/NAME
"""

from __future__ import annotations

import argparse
import json
import math
import os
from pathlib import Path

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import torch  # noqa: E402
from mnist_tta import model_inputs  # noqa: E402  (bench/, beside this script)

from vitkit.hardware import cpu_name  # noqa: E402


def sign_test(fixed: int, broke: int) -> float:
    """Exact two-sided binomial p-value of ``fixed`` vs ``broke`` under p = 1/2."""
    n, k = fixed + broke, min(fixed, broke)
    if n == 0:
        return 1.0
    tail = sum(math.comb(n, i) for i in range(k + 1)) / 2**n
    return min(1.0, 2 * tail)


def correct(run: str, split: str) -> tuple[torch.Tensor, dict]:
    model, ckpt, ds, batches = model_inputs(run, split)
    with torch.inference_mode():
        preds = [model(x).argmax(-1) for x in batches]
    return torch.cat(preds) == ds.labels, ckpt.meta.get("train_config", {})


def run_summary(run: str) -> dict:
    d = Path(run)
    vals = [json.loads(line) for line in (d / "metrics.jsonl").read_text().splitlines()]
    vals = [v["val_top1"] for v in vals if "val_top1" in v]
    report = json.loads((d / "report.json").read_text())
    return {
        "final_val_top1": vals[-1],
        "best_val_top1_last7": max(vals[-7:]),
        "test_top1": report["test_top1"],
        "epochs": len(vals),
    }


def differences(base: dict, probe: dict) -> str:
    """The config fields the probe changed (model overrides one by one)."""
    skip = {"out_dir", "threads", "progress", "resume", "model_overrides"}
    keys = sorted(k for k in set(base) | set(probe) if k not in skip)
    out = [f"{k}={probe.get(k)}" for k in keys if base.get(k) != probe.get(k)]
    mb, mp = base.get("model_overrides", {}), probe.get("model_overrides", {})
    out += [f"-o {k}={mp.get(k)}" for k in sorted(set(mb) | set(mp)) if mb.get(k) != mp.get(k)]
    return ", ".join(out) or "none"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("pairs", nargs="+", help="BASE_RUN:PROBE_RUN, same seed")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--out", default="bench/results/mnist_best_probes")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    rows = []
    for pair in args.pairs:
        base, probe = pair.split(":")
        ok_b, cfg_b = correct(base, "val")
        ok_p, cfg_p = correct(probe, "val")
        if cfg_b.get("seed") != cfg_p.get("seed") or len(ok_b) != len(ok_p):
            raise SystemExit(f"{pair}: not the same seed, so not the same val images")
        fixed, broke = int((ok_p & ~ok_b).sum()), int((~ok_p & ok_b).sum())
        rows.append(
            {
                "base": base,
                "probe": probe,
                "seed": cfg_p.get("seed"),
                "change": differences(cfg_b, cfg_p),
                "images": len(ok_b),
                "base_errors": int((~ok_b).sum()),
                "probe_errors": int((~ok_p).sum()),
                "fixed": fixed,
                "broke": broke,
                "p_value": sign_test(fixed, broke),
                "base_run": run_summary(base),
                "probe_run": run_summary(probe),
            }
        )
        print(pair, {k: rows[-1][k] for k in ("base_errors", "probe_errors", "fixed", "broke")})
    pooled = {}  # per change, over its seeds
    for change in dict.fromkeys(r["change"] for r in rows):
        same = [r for r in rows if r["change"] == change]
        fixed, broke = sum(r["fixed"] for r in same), sum(r["broke"] for r in same)
        pooled[change] = {
            "seeds": [r["seed"] for r in same],
            "fixed": fixed,
            "broke": broke,
            "p_value": sign_test(fixed, broke),
        }
    meta = {
        "cpu": cpu_name(),
        "torch": torch.__version__,
        "command": "python bench/mnist_probes.py " + " ".join(args.pairs) + f" --out {args.out}",
        "pooled": pooled,
    }
    out = Path(args.out)
    out.with_suffix(".json").write_text(json.dumps({"meta": meta, "pairs": rows}, indent=1))
    pct = lambda v: f"{100 * v:.2f} %"  # noqa: E731
    lines = [
        "Paired probes of mnist-best: each change against the base run of the same seed, on "
        f"their shared val split (final weights, no TTA). {meta['cpu']}, torch "
        f"{meta['torch']}. Command: `{meta['command']}`.",
        "",
        "| seed | change | val errors base → probe | fixed / broke (p) | final val base → probe "
        "| test top-1 (run's TTA) base → probe |",
        "| ---: | --- | ---: | ---: | ---: | ---: |",
    ]
    for r in rows:
        b, p = r["base_run"], r["probe_run"]
        lines.append(
            f"| {r['seed']} | {r['change']} | {r['base_errors']} → {r['probe_errors']} "
            f"(of {r['images']:,}) | {r['fixed']} / {r['broke']} ({r['p_value']:.2f}) | "
            f"{pct(b['final_val_top1'])} → {pct(p['final_val_top1'])} | "
            f"{pct(b['test_top1'])} → {pct(p['test_top1'])} |"
        )
    lines += ["", "Pooled over the seeds of each change (two-sided sign test):", ""]
    for change, v in pooled.items():
        lines.append(
            f"- {change} (seeds {', '.join(map(str, v['seeds']))}): fixed {v['fixed']}, broke "
            f"{v['broke']}, p = {v['p_value']:.3f}"
        )
    lines += [
        "",
        "The test column is each run's own end-of-run figure; the choice is made on val.",
    ]
    out.with_suffix(".md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
