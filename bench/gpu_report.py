"""One report of a GPU machine's runs from what `bench/gpu.sh` left in its result folders.

Reads every `gpu_speed_*.json` (one `bench/speed.py` run each), `env.txt`, `pytest_gpu.txt` and
`mnist/report.json` found in the folders given, and writes OUT.json and OUT.md: the speed rows
side by side (ratios are taken inside one run, round by round, never across runs), MFU against
the matmul ceiling measured in the same run and against the card's datasheet peak, the B/16
bf16 compiled figures (MFU, against timm), the CUDA tests' outcome and the MNIST default's time
to accuracy.

    python bench/gpu_report.py runs/gpu --out bench/results/gpu_speed
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from speed import paired_ratio  # noqa: E402

# dense bf16 tensor-core peaks from the datasheets (FLOP/s); MFU is also given against these
DATASHEET_BF16 = {"H100 80GB HBM3": 989.4e12, "H200": 989.4e12, "H100 PCIe": 756.5e12}


def datasheet_peak(device_name: str) -> float | None:
    return next((v for k, v in DATASHEET_BF16.items() if k in device_name), None)


def load_runs(folders: list[Path]) -> list[dict]:
    runs = []
    for folder in folders:
        for path in sorted(folder.glob("gpu_speed_*.json")):
            run = json.loads(path.read_text())
            run["file"] = str(path)
            runs.append(run)
    return runs


def speed_rows(runs: list[dict]) -> list[dict]:
    """vitkit's rows with the other libraries' figures of the same run beside them."""
    out = []
    for run in runs:
        by = {(r["model"], r["impl"], r["precision"], r["mode"], r["task"]): r for r in run["rows"]}
        peak = datasheet_peak(run["meta"]["device_name"])
        for (model, impl, prec, mode, task), r in by.items():
            if impl != "vitkit":
                continue
            row = {"model": model, "precision": prec, "mode": mode, "task": task}
            row["batch"] = r["batch"]
            for other in ("vitkit", "timm", "hf"):
                o = by.get((model, other, prec, mode, task))
                row[f"{other}_images_per_s"] = o["images_per_s"] if o else None
                row[f"{other}_peak_mib"] = o["peak_memory_bytes"] / 2**20 if o else None
                if other != "vitkit":
                    row[f"vitkit_over_{other}"] = paired_ratio(r, o) if o else None
            row["mfu_measured_ceiling"] = r["mfu"]
            ceiling = run["meta"]["matmul_ceiling_flops"][prec]
            row["mfu_datasheet"] = r["mfu"] * ceiling / peak if peak and prec == "bf16" else None
            row["command"] = run["meta"]["command"]
            out.append(row)
    return out


def headline(rows: list[dict]) -> dict:
    """The B/16 bf16 compiled figures: MFU (training, inference at batch 256), speed against
    timm (training)."""

    def find(mode: str, task: str) -> dict | None:
        return next(
            (
                r
                for r in rows
                if r["model"] == "B/16" and r["precision"] == "bf16"
                if r["mode"] == mode and r["task"] != "infer_b1" and r["task"].startswith(task)
            ),
            None,
        )

    train, infer = find("compiled", "train"), find("compiled", "infer")
    result: dict = {}
    if train:
        result["train_mfu"] = train["mfu_measured_ceiling"]
        result["train_vs_timm_compiled"] = train["vitkit_over_timm"]
    if infer:
        result["infer_mfu"] = infer["mfu_measured_ceiling"]
    return result


def side_results(folders: list[Path]) -> dict:
    """The environment, the CUDA tests' outcome and the MNIST default's time to accuracy."""
    side: dict = {}
    for folder in folders:
        env = folder / "env.txt"
        if env.is_file() and "torch" not in side:
            lines = env.read_text().splitlines()
            side["torch"] = next((x for x in lines if x.startswith("torch ")), None)
            side["packages"] = [
                " ".join(x.split()) for x in lines if re.match(r"^(timm|transformers|triton) ", x)
            ]
        tests = folder / "pytest_gpu.txt"
        if tests.is_file():
            text = tests.read_text().splitlines()
            side["tests"] = {
                "summary": text[-1].strip("= ") if text else "",
                "failed": [x.split(" ", 1)[1] for x in text if x.startswith("FAILED ")],
                "passed": [x.split(" ", 1)[1] for x in text if x.startswith("PASSED ")],
            }
        report = folder / "mnist" / "report.json"
        if report.is_file():
            r = json.loads(report.read_text())
            side["mnist_default"] = {
                k: r[k] for k in ("model", "epochs", "wall_s", "train_images_per_s", "test_top1")
            }
    return side


def markdown(rows: list[dict], runs: list[dict], figures: dict, side: dict) -> str:
    def f(x: float | None, fmt: str = "{:.0f}") -> str:
        return "-" if x is None else fmt.format(x)

    names = sorted({run["meta"]["device_name"] for run in runs})
    ceilings = [f"{run['meta']['matmul_ceiling_flops'].get('bf16', 0) / 1e12:.0f}" for run in runs]
    lines = [
        f"{', '.join(names)}; {side.get('torch', '')}; {', '.join(side.get('packages', []))}",
        f"bf16 matmul ceiling measured per run (8192^3, TFLOP/s): {', '.join(ceilings)}; "
        "MFU = analytic FLOPs (training 3x forward) / time / ceiling; 'sheet' uses the "
        "datasheet's dense bf16 peak instead. Ratios > 1: vitkit faster, round by round.",
        "",
        "| model | prec | mode | task | vitkit img/s | timm img/s | HF img/s | vitkit/timm "
        "| vitkit/HF | MFU | MFU sheet | peak MiB vitkit / timm / HF |",
        "| --- | --- | --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for r in rows:
        mib = " / ".join(f(r[f"{o}_peak_mib"]) for o in ("vitkit", "timm", "hf"))
        lines.append(
            f"| {r['model']} | {r['precision']} | {r['mode']} | {r['task']} "
            f"| {f(r['vitkit_images_per_s'])} | {f(r['timm_images_per_s'])} "
            f"| {f(r['hf_images_per_s'])} | {f(r['vitkit_over_timm'], '{:.2f}')} "
            f"| {f(r['vitkit_over_hf'], '{:.2f}')} | {100 * r['mfu_measured_ceiling']:.0f} % "
            f"| {f(r['mfu_datasheet'] and 100 * r['mfu_datasheet'], '{:.0f} %')} | {mib} |"
        )
    lines += ["", "B/16 bf16 (compiled, batch 256):", ""]
    lines += [f"- {k}: {v:.2f}" for k, v in figures.items()]
    if "tests" in side:
        t = side["tests"]
        lines += ["", f"CUDA tests (`pytest -m gpu tests/test_gpu.py`): {t['summary']}"]
        lines += [f"- failed: {x}" for x in t["failed"]]
    if "mnist_default" in side:
        m = side["mnist_default"]
        lines += [
            "",
            f"MNIST default (`vitkit train --device cuda`): {m['model']}, {m['epochs']} epochs, "
            f"test {100 * m['test_top1']:.2f} % after {m['wall_s']:.0f} s of training "
            f"({m['train_images_per_s']:.0f} images/s)",
        ]
    lines += ["", "Commands:", ""] + sorted({f"- `{r['command']}`" for r in rows})
    return "\n".join(lines) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("folders", nargs="+", type=Path, help="gpu.sh result folders ($RES)")
    ap.add_argument("--out", default="bench/results/gpu_speed")
    args = ap.parse_args()
    runs = load_runs(args.folders)
    if not runs:
        sys.exit(f"gpu_report: no gpu_speed_*.json in {', '.join(map(str, args.folders))}")
    rows = speed_rows(runs)
    figures = headline(rows)
    side = side_results(args.folders)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    result = {"devices": sorted({r["meta"]["device_name"] for r in runs}), "headline": figures}
    result |= {"side": side, "rows": rows, "runs": [r["meta"] | {"file": r["file"]} for r in runs]}
    out.with_suffix(".json").write_text(json.dumps(result, indent=1))
    text = markdown(rows, runs, figures, side)
    out.with_suffix(".md").write_text(text)
    print(text)


if __name__ == "__main__":
    main()
