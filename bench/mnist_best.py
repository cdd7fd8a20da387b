"""Time to accuracy on MNIST: ``--recipe mnist-best`` over seeds beside ``mnist-long``.

Runs each job as a user would (``python -m vitkit.cli train --recipe R --seed S``: start-up,
data, training, per-epoch validation, the one test evaluation at the end, report), one after the
other on this machine, timing the whole command. A job whose run directory already holds a
finished run of this bench (``bench_wall.json`` beside its ``report.json``) is read, not run
again, so a long bench that was stopped goes on where it was. Writes JSON and a markdown table
(the CPU, the exact commands, test top-1 and wall time per run, each seed's wall time as a
fraction of mnist-long's) and a plot of validation accuracy
against training wall time (``elapsed_s`` of the epoch records).

    python bench/mnist_best.py          # ~1.5 h on 2 AVX512-BF16 cores, ~4.5 h on 2 AVX2 ones
    python bench/mnist_best.py --jobs mnist-long,mnist-best:1 --work runs/bench-mnist-best
    python bench/mnist_best.py --smoke --out runs/mb                # seconds: the plumbing only
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

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

from vitkit.hardware import cpu_name  # noqa: E402
from vitkit.plotting.canvas import new_figure, save_png  # noqa: E402


def command(recipe: str, seed: int | None, out: Path, smoke: bool) -> list[str]:
    cmd = [sys.executable, "-m", "vitkit.cli", "train", "--recipe", recipe, "--no-progress"]
    if seed is not None:
        cmd += ["--seed", str(seed)]
    if smoke:
        cmd += ["--smoke", "--data", "digits"]
    return [*cmd, "--out-dir", str(out)]


def run_job(recipe: str, seed: int | None, out: Path, smoke: bool) -> dict:
    cmd = command(recipe, seed, out, smoke)
    shown = "vitkit " + " ".join(cmd[3:])
    marker = out / "bench_wall.json"
    if marker.exists() and (out / "report.json").exists():
        print(f"reading the finished run {out}", file=sys.stderr)
        wall = json.loads(marker.read_text())["command_wall_s"]
    else:
        if out.exists():
            sys.exit(f"{out}: a run directory this bench did not finish; move it away first")
        print(f"$ {shown}", file=sys.stderr, flush=True)
        env = {**os.environ, "PYTHONPATH": str(ROOT / "src"), "OMP_WAIT_POLICY": "PASSIVE"}
        t = time.perf_counter()
        proc = subprocess.Popen(cmd, env=env, cwd=ROOT)
        load = []  # the 1-minute load average each minute: well above 2, the run was shared
        while proc.poll() is None:
            load.append(os.getloadavg()[0])
            for _ in range(60):
                if proc.poll() is not None:
                    break
                time.sleep(1)
        wall = time.perf_counter() - t
        if proc.returncode:
            sys.exit(f"{shown}: exited with {proc.returncode}")
        info = {"command_wall_s": wall, "command": shown, "cpu": cpu_name()}
        info |= {"date": time.strftime("%Y-%m-%d %H:%M"), "load_1min_each_minute": load}
        marker.write_text(json.dumps(info))
    marked = json.loads(marker.read_text())
    report = json.loads((out / "report.json").read_text())
    records = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines() if x]
    curve = [
        (r["elapsed_s"], r["val_top1"]) for r in records if "val_top1" in r and "elapsed_s" in r
    ]
    return {
        "recipe": recipe,
        "seed": seed,
        "command": shown,
        "wall_s": wall,
        "cpu": marked.get("cpu"),
        "finished_at": marked.get("date"),
        "max_load_1min": max(marked.get("load_1min_each_minute") or [0.0]),
        "train_wall_s": report["wall_s"],
        "test_top1": report["test_top1"],
        "epochs": report["epochs"],
        "num_params": report["num_params"],
        "model": report["model"],
        "train_images_per_s": report.get("train_images_per_s"),
        "curve_elapsed_s_val_top1": curve,
    }


def plot(runs: list[dict], path: Path) -> None:
    fig = new_figure((7.0, 4.2))
    ax = fig.add_subplot(1, 1, 1)
    for r in runs:
        if not r["curve_elapsed_s_val_top1"]:
            continue
        t, acc = zip(*r["curve_elapsed_s_val_top1"])
        label = r["recipe"] + (f" seed {r['seed']}" if r["seed"] is not None else "")
        ax.plot([x / 60 for x in t], [100 * a for a in acc], marker=".", label=label)
    ax.set_xlabel("training wall time (min)")
    ax.set_ylabel("validation top-1 (%)")
    ax.set_ylim(98.0, 100.0)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8, loc="lower right")
    ax.set_title("MNIST: validation accuracy against wall time")
    save_png(fig, path)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument(
        "--jobs",
        default="mnist,mnist-long,mnist-best:1,mnist-best:2,mnist-best:3",  # seed 0 chose it
        help="RECIPE[:SEED],... run in this order (mnist: the default job, for its curve)",
    )
    ap.add_argument("--work", default=str(ROOT / "runs" / "bench-mnist-best"))
    ap.add_argument("--out", default=str(ROOT / "bench" / "results" / "mnist_best"))
    ap.add_argument("--plot", default=str(ROOT / "docs" / "images" / "mnist_best_curve.png"))
    ap.add_argument("--smoke", action="store_true", help="each job's --smoke (plumbing only)")
    ap.add_argument(
        "--replot", action="store_true", help="only redraw --plot from the results in --out.json"
    )
    args = ap.parse_args()
    if args.replot:  # the figure from the measured curves, without training again
        plot(json.loads(Path(args.out).with_suffix(".json").read_text())["runs"], Path(args.plot))
        return
    work = Path(args.work)
    if args.smoke and args.work == ap.get_default("work"):
        work = Path(args.out).parent / "mnist_best_smoke_runs"
    runs = []
    for job in args.jobs.split(","):
        recipe, _, seed = job.partition(":")
        name = recipe + (f"-seed{seed}" if seed else "")
        runs.append(run_job(recipe, int(seed) if seed else None, work / name, args.smoke))
    best = [r for r in runs if r["recipe"] == "mnist-best"]
    long = next((r for r in runs if r["recipe"] == "mnist-long"), None)
    long_wall = long["wall_s"] if long else None
    for r in best:  # a ratio only between runs on the same kind of CPU (a stopped bench
        # may have finished in another invocation, on another host)
        same = long is not None and r["cpu"] == long["cpu"]
        r["wall_ratio_to_mnist_long"] = r["wall_s"] / long_wall if long_wall and same else None
    mean = statistics.mean(r["test_top1"] for r in best) if best else None
    result = {
        "cpu": cpu_name(),
        "torch": torch.__version__,
        "date": time.strftime("%Y-%m-%d"),
        "smoke": args.smoke,
        "runs": runs,
        "mnist_long_wall_s": long_wall,
        "mnist_best_mean_test_top1": mean,
    }
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.with_suffix(".json").write_text(json.dumps(result, indent=1) + "\n")
    lines = [
        f"MNIST time to accuracy on {result['cpu']}, torch {result['torch']}, {result['date']}; "
        "jobs run one after the other, whole command timed"
        + (" (SMOKE: plumbing only, not a result)" if args.smoke else ""),
        "",
        "| recipe | seed | model | epochs | wall time | / mnist-long | test top-1 | train img/s | "
        "finished | max load |",
        "| --- | ---: | --- | ---: | ---: | ---: | ---: | ---: | --- | ---: |",
    ]
    for r in runs:
        ratio = r.get("wall_ratio_to_mnist_long")
        lines.append(
            f"| {r['recipe']} | {'' if r['seed'] is None else r['seed']} | {r['model']} | "
            f"{r['epochs']} | {r['wall_s'] / 60:.1f} min | "
            f"{'' if ratio is None else f'{ratio:.2f}x'} | {100 * r['test_top1']:.2f} % | "
            f"{r['train_images_per_s'] or 0:.0f} | {r['finished_at']} | {r['max_load_1min']:.1f} |"
        )
    lines += [
        "",
        "max load: the highest 1-minute load average, sampled each minute of the run (the run's "
        "own two threads give up to about 2; more means the machine was shared). train img/s "
        "shows whether runs finished at different times had hosts of the same speed.",
    ]
    cpus = sorted({str(r["cpu"]) for r in runs})
    if len(cpus) > 1:
        lines += ["", "Runs on different CPUs (no ratio across them): " + "; ".join(cpus)]
    if mean is not None:
        lines += ["", f"mnist-best mean test top-1 over {len(best)} seed(s): {100 * mean:.3f} %"]
        if len(best) < 3:
            lines += [f"({len(best)} of the 3 seeds run: a mean over fewer seeds than 3)"]
    lines += ["", "Commands:", "", *(f"    {r['command']}" for r in runs)]
    out.with_suffix(".md").write_text("\n".join(lines) + "\n")
    plot(runs, Path(args.plot) if not args.smoke else out.with_suffix(".png"))
    print("\n".join(lines))


if __name__ == "__main__":
    main()
