"""CPU inference, every path side by side in one run: fp32, bf16, compiled, int8, three engines.

For each model (random weights, the same in every path; timm gets vitkit's weights through
vitkit's converter) it times, at batch 1 (latency) and ``--batch`` (throughput):

- timm fp32 eager; vitkit fp32 eager (as ``vitkit eval`` / ``predict`` run it: Linear layers
  on oneDNN, vitkit.engines.onednn); vitkit ``torch.compile`` (fp32);
- only where bf16 is native (an emulated bf16 matmul runs at a few GFLOP/s and would take the
  run hours): timm and vitkit with bf16 autocast; "vitkit bf16", what ``predict --precision
  bf16`` runs (the weights converted to bf16 once, vitkit.engines.bf16), also compiled by
  inductor; OpenVINO at its bf16 inference precision;
- vitkit's ONNX export under ONNX Runtime fp32 and under OpenVINO fp32;
- the int8 models ``vitkit export --int8`` writes (vitkit.engines.int8): ONNX Runtime dynamic
  (``quantize_dynamic``), ONNX Runtime static QDQ and OpenVINO + NNCF, calibrated on random
  images (the weights are random too; accuracy is measured on a trained model with
  ``vitkit eval``, not here).

Each measurement is repeated ``--rounds`` times in an order shuffled every round (the host is
noisy: ratios within one run are what to compare); the median is reported. Beside each figure:
its fraction of the machine's measured matmul ceiling at that precision (fp32, bf16, int8 =
ONNX Runtime's MatMulInteger u8 x s8; fp32 the higher of MKL's torch.mm and oneDNN's;
analytic FLOPs, vitkit.registry.counts) and the peak memory of one
call (glibc malloc, bench/speed.py's PeakMemory: PyTorch and ONNX Runtime allocate through it,
OpenVINO partly not).

    python bench/cpu_inference.py                 # mnist,Ti/16,S/16,B/16, batch 1 and 32, 2 rounds
    python bench/cpu_inference.py --models B/16 --rounds 5
    python bench/cpu_inference.py --models B/16 --skip batch1,fp32-only --paths ''  # bf16 paths
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import io
import json
import random
import statistics
import sys
import tempfile
import time
import warnings
from collections.abc import Callable
from pathlib import Path

import numpy as np
import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(ROOT / "bench"))

from ceilings import bf16_ceilings  # noqa: E402
from references import import_reference  # noqa: E402
from speed import PeakMemory, matmul_ceiling, model_cfg  # noqa: E402

import vitkit  # noqa: E402
from vitkit.checkpoints.timm import vision_transformer as timm_conv  # noqa: E402
from vitkit.engines import backends as engines  # noqa: E402
from vitkit.engines import int8  # noqa: E402
from vitkit.engines.onednn import onednn_available, onednn_linears  # noqa: E402
from vitkit.engines.onnx_export import export_onnx  # noqa: E402
from vitkit.hardware import cpu_name, native_bf16  # noqa: E402
from vitkit.registry.counts import count_flops  # noqa: E402

PRECISION = {  # the ceiling each path is measured against
    "timm fp32": "fp32",
    "vitkit fp32": "fp32",
    "timm bf16 autocast": "bf16",
    "vitkit bf16 autocast": "bf16",
    "vitkit bf16": "bf16",
    "vitkit bf16 compiled": "bf16",
    "OpenVINO bf16": "bf16",
    "vitkit compiled": "fp32",
    "ORT fp32": "fp32",
    "OpenVINO fp32": "fp32",
    "ORT int8 dynamic": "int8",
    "ORT int8 static": "int8",
    "ORT int8 dynamic, fc2 fp32": "int8",
    "OpenVINO int8": "int8",
    "OpenVINO int8, fc2 fp32": "int8",
}


def int8_ceiling(n: int = 2048, reps: int = 5) -> float:
    """Op/s of ONNX Runtime's MatMulInteger (uint8 x int8 -> int32), n x n x n."""
    import onnx
    import onnxruntime as ort
    from onnx import TensorProto, helper

    def vi(name: str, t: int) -> onnx.ValueInfoProto:
        return helper.make_tensor_value_info(name, t, [n, n])

    g = helper.make_graph(
        [helper.make_node("MatMulInteger", ["A", "B"], ["Y"])],
        "mm",
        [vi("A", TensorProto.UINT8), vi("B", TensorProto.INT8)],
        [vi("Y", TensorProto.INT32)],
    )
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 8
    so = ort.SessionOptions()
    so.intra_op_num_threads = torch.get_num_threads()
    s = ort.InferenceSession(m.SerializeToString(), so, providers=["CPUExecutionProvider"])
    rng = np.random.default_rng(0)
    feed = {
        "A": rng.integers(0, 255, (n, n), dtype=np.uint8),
        "B": rng.integers(-128, 127, (n, n), dtype=np.int8),
    }
    best = float("inf")
    for _ in range(reps + 1):
        t = time.perf_counter()
        s.run(None, feed)
        best = min(best, time.perf_counter() - t)
    return 2 * n**3 / best


def onednn_fp32_ceiling(n: int = 2048, reps: int = 5) -> float:
    """FLOP/s of an n x n x n fp32 product through oneDNN (vitkit.engines.onednn's call): on an AMD
    CPU about twice MKL's ``torch.mm``, so the machine's fp32 ceiling is the higher of the two."""
    a, w = torch.randn(n, n), torch.randn(n, n)
    best = float("inf")
    with torch.inference_mode():
        for _ in range(reps + 1):
            t = time.perf_counter()
            torch.ops.mkldnn._linear_pointwise(a, w, None, "none", [], "")
            best = min(best, time.perf_counter() - t)
    return 2 * n**3 / best


def build_paths(name: str, batches: list[int], tmp: Path, args) -> tuple[dict, dict]:
    """{path: {batch: fn}} for one model, and the time each preparation took."""
    cfg = model_cfg(name)
    torch.manual_seed(0)
    ours = vitkit.create_model(cfg).eval()
    with torch.no_grad():
        for p in ours.parameters():
            p.add_(torch.randn_like(p) * 0.02)
    timm = import_reference("timm")
    t = timm.create_model("vit_base_patch16_224", **timm_conv.timm_model_args(cfg)).eval()
    t.load_state_dict(timm_conv.state_dict_to_timm(ours.state_dict(), cfg))
    xs = {b: torch.randn(b, cfg.in_chans, *cfg.image_size) for b in batches}
    prep: dict[str, float] = {}

    def torch_fns(model: torch.nn.Module, bf16: bool = False) -> dict:
        def fn(b: int) -> Callable[[], object]:
            def run() -> object:
                with torch.inference_mode(), torch.autocast("cpu", torch.bfloat16, enabled=bf16):
                    return model(xs[b])

            return run

        return {b: fn(b) for b in batches}

    fast = copy.deepcopy(ours)
    onednn_linears(fast)  # what vitkit eval / predict run: fp32 Linear layers on oneDNN
    paths = {"timm fp32": torch_fns(t), "vitkit fp32": torch_fns(fast)}
    if native_bf16(torch.device("cpu")):
        paths["timm bf16 autocast"] = torch_fns(t, bf16=True)
        paths["vitkit bf16 autocast"] = torch_fns(ours, bf16=True)
        # what predict / serve --precision bf16 run: the weights in bf16, converted once
        bf16 = engines.engine_model(copy.deepcopy(ours), "torch", "bf16")
        paths["vitkit bf16"] = {b: (lambda b=b: bf16(xs[b])) for b in batches}
        if "compiled" in args.paths:
            s = time.perf_counter()
            comp = engines.engine_model(copy.deepcopy(ours), "torch", "bf16", compiled=True)
            for b in batches:
                comp(xs[b])  # compile (one graph per batch size)
            paths["vitkit bf16 compiled"] = {b: (lambda b=b: comp(xs[b])) for b in batches}
            prep["vitkit bf16 compiled"] = time.perf_counter() - s
        if engines.available("openvino"):
            s = time.perf_counter()
            ov = engines.engine_model(copy.deepcopy(ours), "openvino", "bf16")
            paths["OpenVINO bf16"] = {b: (lambda b=b: ov(xs[b])) for b in batches}
            prep["OpenVINO bf16"] = time.perf_counter() - s
    if "fp32-only" in args.skip:
        return paths, prep
    if "compiled" in args.paths:
        s = time.perf_counter()
        compiled = torch.compile(ours)
        fns = torch_fns(compiled)
        for b in batches:
            fns[b]()  # compile (one graph per batch size)
        paths["vitkit compiled"] = fns
        prep["vitkit compiled"] = time.perf_counter() - s
    fp32 = export_onnx(ours, tmp / "fp32.onnx")
    calib = torch.randn(args.calib_images, cfg.in_chans, *cfg.image_size)
    files: dict[str, tuple[str, Path]] = {
        "ORT fp32": ("onnxruntime", fp32),
        "OpenVINO fp32": ("openvino", fp32),
    }
    with contextlib.redirect_stdout(io.StringIO()), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for label, engine, quant in (
            ("ORT int8 dynamic", "onnxruntime", lambda o: int8.quantize_onnxruntime(fp32, o, None)),
            ("ORT int8 static", "onnxruntime", lambda o: int8.quantize_onnxruntime(fp32, o, calib)),
            (
                "ORT int8 dynamic, fc2 fp32",
                "onnxruntime",  # export --int8 --keep-fp32 mlp.fc2
                lambda o: int8.quantize_onnxruntime(fp32, o, None, ("mlp.fc2",)),
            ),
            ("OpenVINO int8", "openvino", lambda o: int8.quantize_openvino(fp32, o, calib)),
            (
                "OpenVINO int8, fc2 fp32",
                "openvino",  # export --int8 --engine openvino --keep-fp32 mlp.fc2
                lambda o: int8.quantize_openvino(fp32, o, calib, ("mlp.fc2",)),
            ),
        ):
            if not engines.available(engine):
                continue
            s = time.perf_counter()
            out = tmp / f"{label.replace(' ', '_')}.{'xml' if engine == 'openvino' else 'onnx'}"
            quant(out)
            prep[label] = time.perf_counter() - s
            files[label] = (engine, out)
    for label, (engine, path) in files.items():
        if not engines.available(engine):
            continue
        paths[label] = engine_fns(engines.RUNNERS[engine](path, torch.get_num_threads()), xs)
    return paths, prep


def engine_fns(run: Callable, xs: dict[int, torch.Tensor]) -> dict:
    arrays = {b: x.numpy() for b, x in xs.items()}
    return {b: (lambda b=b: run(arrays[b])) for b in xs}


def time_call(fn: Callable[[], object], min_s: float) -> float:
    """Seconds per call: one warm-up call, then calls until ``min_s`` has passed (at least 1)."""
    fn()
    n, start = 0, time.perf_counter()
    while True:
        fn()
        n += 1
        if time.perf_counter() - start >= min_s:
            return (time.perf_counter() - start) / n


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", default="mnist,Ti/16,S/16,B/16")
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--min-s", type=float, default=0.5, help="timing per measurement (s)")
    ap.add_argument("--calib-images", type=int, default=16)
    ap.add_argument("--paths", default="compiled", help="'compiled' or '' (skip torch.compile)")
    ap.add_argument(
        "--skip",
        default="",
        help="comma-separated: 'batch1' (only --batch), 'fp32-only' (no compiled fp32, ONNX "
        "Runtime, OpenVINO fp32 or int8 path: timm and vitkit eager fp32 and the bf16 paths)",
    )
    ap.add_argument("--out", default=str(ROOT / "bench/results/cpu_inference"))
    args = ap.parse_args()
    warnings.filterwarnings("ignore")
    batches = [args.batch] if "batch1" in args.skip else [1, args.batch]
    cpu = torch.device("cpu")
    ceilings = {"fp32 MKL": matmul_ceiling(torch.float32, cpu)}
    if onednn_available():
        ceilings["fp32 oneDNN"] = onednn_fp32_ceiling()
    ceilings["fp32"] = max(ceilings.values())  # what 'of ceiling' divides fp32 paths by
    ceilings["int8"] = int8_ceiling()
    if native_bf16(cpu):  # the best of torch.mm, packed oneDNN and OpenVINO (bench/ceilings.py)
        ceilings.update(bf16_ceilings())
    else:
        ceilings["bf16 (emulated)"] = matmul_ceiling(torch.bfloat16, cpu, n=512, reps=1)
    print({k: f"{v / 1e9:.1f} GFLOP/s" for k, v in ceilings.items()}, flush=True)
    rows = []
    for name in args.models.split(","):
        with tempfile.TemporaryDirectory(prefix="vitkit-cpu-bench-") as tmp:
            paths, prep = build_paths(name, batches, Path(tmp), args)
            flops = count_flops(model_cfg(name))
            times: dict[tuple[str, int], list[float]] = {}
            peaks: dict[tuple[str, int], int | None] = {}
            for key in [(p, b) for p in paths for b in batches]:  # peak memory, once each
                with PeakMemory(cpu) as pm:
                    paths[key[0]][key[1]]()
                peaks[key] = pm.peak
            rng = random.Random(0)
            for _ in range(args.rounds):
                keys = [(p, b) for p in paths for b in batches]
                rng.shuffle(keys)
                for key in keys:
                    times.setdefault(key, []).append(time_call(paths[key[0]][key[1]], args.min_s))
            for (p, b), ts in times.items():
                sec = statistics.median(ts)
                ceiling = ceilings.get(PRECISION[p])
                rows.append(
                    {
                        "model": name,
                        "path": p,
                        "batch": b,
                        "img_s": b / sec,
                        "latency_ms": 1e3 * sec,
                        "fraction_of_ceiling": flops * b / sec / ceiling if ceiling else None,
                        "flop_s": flops * b / sec,
                        "peak_mib": None if peaks[(p, b)] is None else peaks[(p, b)] / 2**20,
                        "prepare_s": prep.get(p),
                        "times_s": ts,
                    }
                )
            for row in rows[-len(times) :]:
                print(
                    f"{name:6} b{row['batch']:<3} {row['path']:18} {row['img_s']:9.1f} img/s "
                    f"{row['latency_ms']:9.1f} ms",
                    flush=True,
                )
    if "bf16" in ceilings:  # again after the paths: a shared host's noise only lowers a rate
        ceilings["bf16 before"] = ceilings["bf16"]
        ceilings["bf16 after"] = bf16_ceilings()["bf16"]
        ceilings["bf16"] = max(ceilings["bf16 before"], ceilings["bf16 after"])
        for row in rows:
            if PRECISION[row["path"]] == "bf16":
                row["fraction_of_ceiling"] = row["flop_s"] / ceilings["bf16"]
    write(rows, ceilings, args)


def write(rows: list[dict], ceilings: dict[str, float], args: argparse.Namespace) -> None:
    command = "python bench/cpu_inference.py " + " ".join(sys.argv[1:])
    out = Path(args.out)
    meta = {
        "cpu": cpu_name(),
        "command": command.strip(),
        "torch": torch.__version__,
        "rounds": args.rounds,
        "ceilings_gflop_s": {k: v / 1e9 for k, v in ceilings.items()},
    }
    for mod in ("onnxruntime", "openvino", "nncf", "timm"):
        with contextlib.suppress(ImportError):
            meta[mod] = __import__(mod).__version__
    out.with_suffix(".json").write_text(json.dumps({**meta, "rows": rows}, indent=1))
    lines = [
        "# CPU inference: every path side by side",
        "",
        f"CPU: {meta['cpu']}. torch {meta['torch']}, onnxruntime {meta.get('onnxruntime')}, "
        f"openvino {meta.get('openvino')}, nncf {meta.get('nncf')}, timm {meta.get('timm')}.",
        f"Command: `{meta['command']}` ({args.rounds} rounds, median; random weights).",
        "Matmul ceilings measured in the run: "
        + ", ".join(f"{k} {v:.1f} GFLOP/s" for k, v in meta["ceilings_gflop_s"].items())
        + ". 'of ceiling': analytic FLOPs / time over the ceiling at the path's precision.",
        "",
    ]
    for name in dict.fromkeys(r["model"] for r in rows):
        base = {
            r["batch"]: r["img_s"] for r in rows if r["model"] == name and r["path"] == "timm fp32"
        }
        base16 = {
            r["batch"]: r["img_s"]
            for r in rows
            if r["model"] == name and r["path"] == "timm bf16 autocast"
        }
        lines += [
            f"## {name}",
            "",
            "| path | batch | img/s | latency ms | x timm fp32 | x timm bf16 autocast "
            "| of ceiling | peak MiB | prepare s |",
            "|---|---|---|---|---|---|---|---|---|",
        ]
        for r in sorted(
            (r for r in rows if r["model"] == name), key=lambda r: (r["batch"], -r["img_s"])
        ):
            frac, peak, prep = r["fraction_of_ceiling"], r["peak_mib"], r["prepare_s"]
            vs16 = f"{r['img_s'] / base16[r['batch']]:.2f}" if r["batch"] in base16 else ""
            lines.append(
                f"| {r['path']} | {r['batch']} | {r['img_s']:.1f} | {r['latency_ms']:.1f} | "
                f"{r['img_s'] / base[r['batch']]:.2f} | "
                f"{vs16} | "
                f"{'' if frac is None else f'{100 * frac:.0f} %'} | "
                f"{'' if peak is None else f'{peak:.0f}'} | "
                f"{'' if prep is None else f'{prep:.0f}'} |"
            )
        lines.append("")
    out.with_suffix(".md").write_text("\n".join(lines))
    print(f"wrote {out.with_suffix('.json')} and {out.with_suffix('.md')}")


if __name__ == "__main__":
    main()
