"""Fixed-size vs any-size ONNX exports under ONNX Runtime: optimised graphs and speed.

One checkpoint (random weights, timm's antialiased E_pos kernel) exported twice, at its own
size and with ``--dynamic-size``. For each, ONNX Runtime's optimised graph at the basic and the
full optimisation level is saved and its nodes counted by type (do the fused MatMul, GELU and
LayerNorm nodes survive in the graph of any size?). Then three runners, the fixed graph,
the graph of any size, and the graph of any size with its height and width fixed when the
runner is made (``add_free_dimension_override_by_name``), run one batch of the checkpoint's
size, interleaved, ``--rounds`` times each (medians).

    python bench/onnx_dynamic_gap.py --model B/16 --batch 32 --rounds 5
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import io
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

import vitkit  # noqa: E402
from vitkit.checkpoints import save_checkpoint  # noqa: E402
from vitkit.cli import main as vitkit_main  # noqa: E402
from vitkit.hardware import cpu_name  # noqa: E402


def runner(path: Path, threads: int, overrides: dict[str, int] | None = None) -> Any:
    import onnxruntime as ort

    so = ort.SessionOptions()
    so.intra_op_num_threads = threads
    for name, value in (overrides or {}).items():
        so.add_free_dimension_override_by_name(name, value)
    return ort.InferenceSession(str(path), so, providers=["CPUExecutionProvider"])


def optimised_counts(path: Path, level: str, tmp: Path) -> dict[str, int]:
    import onnx
    import onnxruntime as ort

    so = ort.SessionOptions()
    so.graph_optimization_level = getattr(ort.GraphOptimizationLevel, level)
    so.optimized_model_filepath = str(tmp / f"{path.stem}-{level}.onnx")
    so.log_severity_level = 3  # (its note that a full-level graph is for this machine only)
    ort.InferenceSession(str(path), so, providers=["CPUExecutionProvider"])
    nodes = onnx.load(so.optimized_model_filepath, load_external_data=False).graph.node
    counts = collections.Counter(n.op_type for n in nodes)
    return {"total": len(nodes), **dict(sorted(counts.items(), key=lambda kv: (-kv[1], kv[0])))}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="B/16")
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--out", default="bench/results/onnx_dynamic_gap")
    args = ap.parse_args()
    threads = torch.get_num_threads()
    res: dict[str, Any] = {
        "command": "python bench/onnx_dynamic_gap.py " + " ".join(sys.argv[1:]),
        "cpu": cpu_name(),
        "threads": threads,
        "load_start": [round(v, 2) for v in os.getloadavg()],
    }
    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        torch.manual_seed(0)
        m = vitkit.create_model(args.model, pos_resample="bicubic-antialias")
        with torch.no_grad():  # (the zero-initialised head would give all-zero logits)
            for p in m.parameters():
                p.add_(torch.randn_like(p) * 0.02)
        save_checkpoint(tmp / "ck", m, meta={})
        size = int(m.cfg.image_size[0])
        paths = {"fixed": tmp / "fixed.onnx", "dynamic": tmp / "dynamic.onnx"}
        for name, path in paths.items():
            extra = ["--dynamic-size"] if name == "dynamic" else []
            with contextlib.redirect_stdout(io.StringIO()):
                assert vitkit_main(["export", str(tmp / "ck"), str(path), *extra]) == 0
        import onnx

        dims = onnx.load(str(paths["dynamic"]), load_external_data=False).graph.input[0]
        names = [x.dim_param for x in dims.type.tensor_type.shape.dim]
        res["graphs"] = {
            f"{name} {level}": optimised_counts(path, level, tmp)
            for name, path in paths.items()
            for level in ("ORT_ENABLE_BASIC", "ORT_ENABLE_ALL")
        }
        runners = {
            "fixed": runner(paths["fixed"], threads),
            "dynamic": runner(paths["dynamic"], threads),
            "dynamic, H and W fixed at load": runner(
                paths["dynamic"], threads, {names[2]: size, names[3]: size}
            ),
        }
        x = np.random.default_rng(0).standard_normal((args.batch, 3, size, size), np.float32)
        outs = {k: s.run(None, {"pixel_values": x})[0] for k, s in runners.items()}  # warm-up
        res["same_outputs"] = {
            k: float(np.abs(v - outs["fixed"]).max() / np.abs(outs["fixed"]).max())
            for k, v in outs.items()
        }
        times: dict[str, list[float]] = {k: [] for k in runners}
        for _ in range(args.rounds):
            for k, s in runners.items():
                t = time.perf_counter()
                s.run(None, {"pixel_values": x})
                times[k].append(time.perf_counter() - t)
        base = statistics.median(times["fixed"])
        res["speed"] = {
            k: {
                "median_s": statistics.median(v),
                "img_per_s": args.batch / statistics.median(v),
                "x_fixed": base / statistics.median(v),
                "runs_s": v,
            }
            for k, v in times.items()
        }
    res["load_end"] = [round(v, 2) for v in os.getloadavg()]
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.with_suffix(".json").write_text(json.dumps(res, indent=1))
    lines = [
        "# Fixed-size vs any-size ONNX exports under ONNX Runtime",
        "",
        f"Command: `{res['command']}`  ",
        f"CPU: {res['cpu']}, {threads} threads; load average at the start {res['load_start']}, "
        f"at the end {res['load_end']} (a shared host: the figures are ratios within one "
        "interleaved run).",
        "",
        f"## {args.model} at {size} px, batch {args.batch}: median of {args.rounds} "
        "interleaved runs",
        "",
        "| runner | s / batch | img/s | x fixed | max rel. diff. vs fixed |",
        "| --- | --- | --- | --- | --- |",
    ]
    for k, v in res["speed"].items():
        lines.append(
            f"| {k} | {v['median_s']:.2f} | {v['img_per_s']:.2f} | {v['x_fixed']:.2f} | "
            f"{res['same_outputs'][k]:.1e} |"
        )
    lines += ["", "## ONNX Runtime's optimised graphs: nodes by type", ""]
    for k, counts in res["graphs"].items():
        lines.append(f"- {k}: " + ", ".join(f"{op} {n}" for op, n in counts.items()))
    out.with_suffix(".md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
