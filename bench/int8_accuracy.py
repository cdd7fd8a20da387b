"""int8 and bf16 accuracy of a trained run, every path beside its fp32 source.

For each int8 path it runs `vitkit export RUN WORK/PATH --int8 ...` and `vitkit eval --from
WORK/PATH`, which evaluates the int8 model and its fp32 source on the same test images and records
the top-1 of both, the difference and the top-1 agreement (eval.json's `versus_source`). The bf16
paths: `vitkit eval RUN --precision bf16` (PyTorch, the weights in bf16) and `vitkit export RUN
WORK/PATH --precision bf16` (OpenVINO at bf16) + `eval --from`, recorded the same way. Writes
OUT.json and OUT.md, each path marked close to fp32 where it is (int8: loses <= 0.3 points and
agrees on >= 99 %; bf16: loses <= 0.1 points and agrees on >= 99.5 %).
The work folder is created by this command and refused if it exists (`--overwrite` replaces it).

    python bench/int8_accuracy.py runs/shapes-vit --out bench/results/int8_accuracy_shapes_vit
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import time
from pathlib import Path

from vitkit.cli import main as vitkit
from vitkit.hardware import cpu_name

PATHS = {  # name: (label, export options)
    "dynamic": ("ONNX Runtime int8 dynamic", []),
    "static": (
        "ONNX Runtime int8 static QDQ, blocks' MatMuls (128 calibration images)",
        ["--static"],
    ),
    "openvino": ("OpenVINO + NNCF int8 (128 calibration images)", ["--engine", "openvino"]),
    "dynamic-fc2": (
        "ONNX Runtime int8 dynamic, mlp.fc2 left fp32 (--keep-fp32 mlp.fc2)",
        ["--keep-fp32", "mlp.fc2"],
    ),
    "openvino-fc2": (
        "OpenVINO + NNCF int8, mlp.fc2 left fp32 (--keep-fp32 mlp.fc2)",
        ["--engine", "openvino", "--keep-fp32", "mlp.fc2"],
    ),
}
BF16_PATHS = {  # name: (label, export options; None: eval --precision bf16 of the run itself)
    "bf16": ("PyTorch bf16 weights (eval --precision bf16)", None),
    "openvino-bf16": ("OpenVINO bf16 (export --precision bf16)", ["--precision", "bf16"]),
}
CLOSE = {"max_loss_points": 0.3, "min_agreement_percent": 99.0}
BF16_CLOSE = {"max_loss_points": 0.1, "min_agreement_percent": 99.5}


def measure(run: Path, work: Path, name: str) -> dict:
    label, options = {**PATHS, **BF16_PATHS}[name]
    close = BF16_CLOSE if name in BF16_PATHS else CLOSE
    engine, evals = work / name, work / f"{name}-eval"
    start = time.perf_counter()
    if options is None:
        if vitkit(["eval", "--from", str(run), "--precision", "bf16", "--out", str(evals)]) != 0:
            return {"path": name, "label": label, "error": "eval failed (see above)"}
    else:
        kind = [] if name in BF16_PATHS else ["--int8"]
        if vitkit(["export", str(run), str(engine), *kind, *options]) != 0:
            return {"path": name, "label": label, "error": "export failed (see above)"}
        if vitkit(["eval", "--from", str(engine), "--out", str(evals)]) != 0:
            return {"path": name, "label": label, "error": "eval failed (see above)"}
    versus = json.loads((evals / "eval.json").read_text())["versus_source"]
    ok = (
        versus["top1_difference"] >= -close["max_loss_points"]
        and versus["top1_agreement"] >= close["min_agreement_percent"]
    )
    seconds = time.perf_counter() - start  # export (calibration included) and both evaluations
    return {"path": name, "label": label, **versus, "close": close, "close_to_fp32": ok,
            "seconds": seconds}  # fmt: skip


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("run", type=Path, help="a trained vitkit run (its checkpoint)")
    every = {**PATHS, **BF16_PATHS}
    ap.add_argument("--paths", default=",".join(every), help=f"of {', '.join(every)}")
    ap.add_argument("--work", type=Path, help="folder for the int8 models (default OUT_work)")
    ap.add_argument("--overwrite", action="store_true", help="replace an existing work folder")
    ap.add_argument("--out", default="bench/results/int8_accuracy")
    args = ap.parse_args()
    out = Path(args.out)
    work = args.work or out.with_name(out.name + "_work")
    unknown = [p for p in args.paths.split(",") if p not in every]
    if unknown:
        sys.exit(f"int8_accuracy: unknown path(s) {', '.join(unknown)} (of {', '.join(every)})")
    if not (args.run / "report.json").is_file():
        sys.exit(f"int8_accuracy: {args.run}: not a finished vitkit run (no report.json)")
    if work.exists():
        if not args.overwrite:
            sys.exit(f"int8_accuracy: {work} exists; pass --overwrite to replace it")
        shutil.rmtree(work)
    work.mkdir(parents=True)
    rows = [measure(args.run, work, name) for name in args.paths.split(",")]
    report = json.loads((args.run / "report.json").read_text())
    meta = {"cpu": cpu_name(), "run": str(args.run), "model": report.get("model"),
            "dataset": report.get("dataset"), "run_test_top1": report.get("test_top1"),
            "command": " ".join(sys.argv), "close_to_fp32": CLOSE,
            "bf16_close_to_fp32": BF16_CLOSE}  # fmt: skip
    out.parent.mkdir(parents=True, exist_ok=True)
    out.with_suffix(".json").write_text(json.dumps({"meta": meta, "rows": rows}, indent=1))
    lines = [
        f"# int8 and bf16 accuracy of {meta['model']} on {meta['dataset']} ({args.run})",
        "",
        f"{meta['cpu']}. Command: `{meta['command']}`. Close to fp32: loses <= 0.3 points of "
        "top-1 and agrees with fp32 on >= 99 % of the test images (bf16: <= 0.1 points, "
        ">= 99.5 %).",
        "",
        "| path | top-1 | fp32 top-1 | difference | agreement with fp32 | close to fp32 |",
        "| --- | ---: | ---: | ---: | ---: | --- |",
    ]
    for r in rows:
        if "error" in r:
            lines.append(f"| {r['label']} | {r['error']} | | | | |")
            continue
        lines.append(
            f"| {r['label']} | {r['top1']:.2f} % | {r['source_top1']:.2f} % "
            f"| {r['top1_difference']:+.2f} | {r['top1_agreement']:.2f} % "
            f"| {'yes' if r['close_to_fp32'] else 'no'} |"
        )
    text = "\n".join(lines) + "\n"
    out.with_suffix(".md").write_text(text)
    print(text)


if __name__ == "__main__":
    main()
