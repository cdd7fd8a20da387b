"""A check of bench/cpu_inference.py's shuffled order: every path of one model timed once, PyTorch's
first, ONNX Runtime's next, OpenVINO's last, in a fresh process.

Why: a PyTorch call made right after an OpenVINO call ran up to 30 % slower for a few calls
(B/16 bf16 at batch 32: 18.5 img/s alone, 12.4-15.9 right after OpenVINO; turning OpenVINO's CPU
pinning off changed nothing), so in the shuffled bench a PyTorch figure can be low. Here
nothing runs after an OpenVINO call but OpenVINO. Best of 2 calls after a warm-up call.

    python bench/cpu_inference_ordered.py --model B/16 --out bench/results/cpu_inference_ordered
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import sys
import tempfile
import time
import warnings
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import cpu_inference as ci  # noqa: E402

from vitkit.hardware import cpu_name  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="B/16")
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    warnings.filterwarnings("ignore")
    build = argparse.Namespace(paths="", calib_images=16)
    rows = {}
    with tempfile.TemporaryDirectory() as tmp:
        with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
            paths, _ = ci.build_paths(args.model, [args.batch], Path(tmp), build)
        order = sorted(paths, key=lambda p: (p.startswith("OpenVINO"), p.startswith("ORT")))
        for p in order:
            fn = paths[p][args.batch]
            fn()
            best = float("inf")
            for _ in range(2):
                t = time.perf_counter()
                fn()
                best = min(best, time.perf_counter() - t)
            rows[p] = args.batch / best
            print(f"{p:28} {rows[p]:8.2f} img/s", flush=True)
    base = rows["timm fp32"]
    command = "python bench/cpu_inference_ordered.py " + " ".join(sys.argv[1:])
    meta = {"cpu": cpu_name(), "torch": torch.__version__, "command": command}
    out = Path(args.out)
    out.with_suffix(".json").write_text(json.dumps({**meta, "img_s": rows}, indent=1))
    lines = [
        f"# {args.model} at batch {args.batch}, PyTorch first, OpenVINO last (one process)",
        "",
        f"CPU: {meta['cpu']}. torch {meta['torch']}. Command: `{command}`.",
        "",
        "| path (in the order run) | img/s | x timm fp32 |",
        "| --- | ---: | ---: |",
        *(f"| {p} | {v:.2f} | {v / base:.2f} |" for p, v in rows.items()),
        "",
    ]
    out.with_suffix(".md").write_text("\n".join(lines))
    print(f"wrote {out.with_suffix('.json')} and {out.with_suffix('.md')}")


if __name__ == "__main__":
    main()
