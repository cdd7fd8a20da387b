"""The default job (``vitkit train``, recipe ``mnist``) now against its first version.

Checks out the first version of the default recipe (commit ``--baseline``, the foundation's
measured default job) into a temporary git worktree, then runs each version's default job as a
user would (``python -m vitkit.cli train --out-dir ...``: start-up, data, training, compile,
per-epoch validation, test and report), one after the other (``--order`` chooses), timing the
whole command. Reports wall time, the speed-up and both test accuracies; writes JSON and a
markdown table.

    python bench/mnist_default.py                     # ~12 min on 2 cores
    python bench/mnist_default.py --order current,baseline --threads 2
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from vitkit.hardware import cpu_name

ROOT = Path(__file__).resolve().parents[1]
BASELINE = "e09383d"  # "Measured: default job 98.65 % in 7m54s from a fresh clone"


def run_job(src: Path, out: Path, threads: int | None) -> dict:
    env = {**os.environ, "PYTHONPATH": str(src), "OMP_WAIT_POLICY": "PASSIVE"}
    cmd = [sys.executable, "-m", "vitkit.cli", "train", "--out-dir", str(out), "--no-progress"]
    if threads:
        cmd += ["--threads", str(threads)]
    print("$ " + " ".join(cmd), f"(PYTHONPATH={src})", file=sys.stderr, flush=True)
    t = time.perf_counter()
    subprocess.run(cmd, env=env, check=True, cwd=src.parent)
    wall = time.perf_counter() - t
    report = json.loads((out / "report.json").read_text())
    config = json.loads((out / "train_config.json").read_text())
    return {
        "command_wall_s": wall,
        "test_top1": report["test_top1"],
        "steps": report["steps"],
        "epochs": report["epochs"],
        "batch_size": config["batch_size"],
        "train_images_per_s": report.get("train_images_per_s"),
        "model_config": report["model_config"],
        "compile": config.get("compile"),  # (the first version has no such setting)
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--baseline", default=BASELINE, help="commit of the first version")
    ap.add_argument("--label", default="first version", help="what the baseline commit is")
    ap.add_argument("--order", default="baseline,current")
    ap.add_argument("--threads", type=int, help="torch threads for both (default: torch's)")
    ap.add_argument("--out", default=str(ROOT / "bench" / "results" / "mnist_default"))
    args = ap.parse_args()
    results: dict[str, dict] = {}
    with tempfile.TemporaryDirectory(prefix="vitkit-baseline-") as tmp:
        tree = Path(tmp) / "tree"
        subprocess.run(
            ["git", "-C", str(ROOT), "worktree", "add", "--detach", str(tree), args.baseline],
            check=True,
            capture_output=True,
        )
        try:
            for which in args.order.split(","):
                src = tree / "src" if which == "baseline" else ROOT / "src"
                results[which] = run_job(src, Path(tmp) / f"run-{which}", args.threads)
        finally:
            subprocess.run(["git", "-C", str(ROOT), "worktree", "remove", "--force", str(tree)])
    base, cur = results["baseline"], results["current"]
    speedup = base["command_wall_s"] / cur["command_wall_s"]
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    meta = {
        "baseline_commit": args.baseline,
        "baseline_label": args.label,
        "order": args.order,
        "threads": args.threads,
        "cpu": cpu_name(),
        "command": "python " + " ".join(sys.argv),
    }
    out.with_suffix(".json").write_text(
        json.dumps({"meta": meta, "speedup": speedup, **results}, indent=1)
    )

    def row(name: str, r: dict) -> str:
        m = r["model_config"]
        return (
            f"| {name} | patch {m['patch_size'][0]}, width {m['width']}, depth {m['depth']} | "
            f"{r['batch_size']} | {r['epochs']} | {r['compile'] or 'eager'} | "
            f"{r['command_wall_s'] / 60:.2f} min | {100 * r['test_top1']:.2f} % |"
        )

    lines = [
        f"Default job (`vitkit train`), {args.label} ({args.baseline}) vs now, run one after "
        f"the other ({args.order}); whole command timed",
        "",
        "| version | model | batch | epochs | mode | wall time | test top-1 |",
        "| --- | --- | ---: | ---: | --- | ---: | ---: |",
        row(f"{args.label} ({args.baseline})", base),
        row("now", cur),
        "",
        f"Speed-up: **{speedup:.2f}x**; test top-1 change: "
        f"{100 * (cur['test_top1'] - base['test_top1']):+.2f} points.",
    ]
    out.with_suffix(".md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
