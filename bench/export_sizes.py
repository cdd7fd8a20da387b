"""Exports at any image size: exactness at many sizes, and the speed of the exported paths.

Exactness: each model (random weights, built by its reference library and read by vitkit) is
exported once with ``--dynamic-size`` (ONNX fp32; int8 by ONNX Runtime's dynamic quantization;
for B/16 also the AOTInductor .pt2 package) and run at ``--sizes`` sizes (square and not, 112 to
518 px): the largest relative error max |out - ref| / max |ref| against vitkit's PyTorch model
and against the reference library (timm, transformers) at the same size; for int8 the top-1
agreement with fp32 PyTorch on the same random images. OpenVINO (where installed): its CPU
plugin running the dynamic-size ONNX graph at f32 and, on a CPU with native bf16, at bf16 (as
``export --engine openvino`` and ``--precision bf16`` directories run), with bf16's top-1
agreement beside its error.

Speed: B/16 at 224 (and 384), batch 1 and 32: vitkit eager, ``torch.compile``, the ONNX export
of the checkpoint's size, the dynamic-size ONNX export, OpenVINO fp32 / bf16 (fixed and
dynamic size), the .pt2 package; and the features
export (4 blocks, NCHW) against timm's ``forward_intermediates`` eager. Interleaved: each round
runs every path once in turn; the figure is the median of the rounds.

    python bench/export_sizes.py --out bench/results/export_sizes

A reduced run: ``--paths openvino`` measures only the paths so named (eager PyTorch still timed,
the baseline); ``--merge-into PREFIX`` adds its rows to an earlier run's PREFIX.json and
rewrites PREFIX.md, each row naming the run (command, load averages) that measured it.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import statistics
import sys
import tempfile
import time
import warnings
from pathlib import Path
from typing import Any

import numpy as np
import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))  # the torchvision-op shim for importing timm
from references import import_reference  # noqa: E402

from vitkit.checkpoints import load_model  # noqa: E402
from vitkit.engines.dynamic_size import SizeRange, relative_error  # noqa: E402
from vitkit.engines.exports import export_file  # noqa: E402
from vitkit.hardware import cpu_name  # noqa: E402


def sizes_for(step: int, n: int, lo: int = 112, hi: int = 518) -> list[tuple[int, int]]:
    """``n`` sizes, multiples of ``step`` in [lo, hi]: squares and non-squares, spread."""
    sides = list(range((lo + step - 1) // step * step, hi // step * step + 1, step))
    rng = np.random.default_rng(step)
    found = [(sides[0], sides[0]), (sides[-1], sides[-1])]
    while len(found) < n:
        h = int(rng.choice(sides))
        w = h if len(found) % 3 == 0 else int(rng.choice(sides))
        if (h, w) not in found:
            found.append((h, w))
    return found


def perturb(model: torch.nn.Module) -> torch.nn.Module:
    g = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn(p.shape, generator=g) * 0.02)
    return model.eval()


BUILT: dict[str, Any] = {}  # B/16's folder, reference and .pt2, reused by the speed part


def timm_vit(name: str, folder: Path) -> tuple[Any, Path]:
    timm = import_reference("timm")
    from timm.models._hub import save_for_hf

    ref = perturb(timm.create_model(name, pretrained=False, dynamic_img_size=True))
    save_for_hf(ref, str(folder), safe_serialization=True)
    return ref, folder


def hf_model(kind: str, folder: Path) -> tuple[Any, Path]:
    transformers = import_reference("transformers")
    torch.manual_seed(0)
    if kind == "dinov2reg":  # ViT-S/14 with 4 registers (DINOv2's small)
        cfg = transformers.Dinov2WithRegistersConfig(
            hidden_size=384, num_hidden_layers=12, num_attention_heads=6, patch_size=14,
            image_size=518, num_register_tokens=4,
        )  # fmt: skip
        ref = transformers.Dinov2WithRegistersModel(cfg)
    else:  # DINOv3 ViT-S/16 (RoPE, 4 registers)
        cfg = transformers.DINOv3ViTConfig(
            hidden_size=384, intermediate_size=1536, num_hidden_layers=12, num_attention_heads=6,
            patch_size=16, image_size=224, num_register_tokens=4,
        )  # fmt: skip
        ref = transformers.DINOv3ViTModel(cfg)
    perturb(ref)
    ref.save_pretrained(folder)

    class Pooled(torch.nn.Module):
        def __init__(self, m: Any) -> None:
            super().__init__()
            self.m = m

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.m(pixel_values=x).pooler_output

    return Pooled(ref).eval(), folder


def quiet() -> Any:
    return contextlib.redirect_stdout(io.StringIO())


def wanted(key: str, only: list[str] | None) -> bool:
    """Whether path ``key`` is measured (``--paths``: names containing one of ``only``)."""
    return only is None or any(o in key for o in only)


def exactness(
    name: str, ref: Any, folder: Path, tmp: Path, n: int, pt2: bool, only: list[str] | None = None
) -> dict[str, Any]:
    import onnxruntime as ort

    from vitkit.engines.int8 import quantize_onnxruntime

    model, ckpt = load_model(folder)
    cfg = ckpt.model_config
    step = cfg.patch_size[0]
    sizes = sizes_for(step, n)
    rng = SizeRange(step, min(min(s) for s in sizes), max(max(s) for s in sizes))
    t0 = time.perf_counter()
    with quiet():
        path, info = export_file(model, ckpt, tmp / f"{name}.onnx", sizes=rng, overwrite=True)
    paths: dict[str, Any] = {"onnx fp32": ort.InferenceSession(str(path))}
    times = {"onnx fp32": time.perf_counter() - t0}
    if wanted("onnx int8 (ORT dynamic)", only):
        q = tmp / f"{name}.int8.onnx"
        quantize_onnxruntime(path, q, None)
        paths["onnx int8 (ORT dynamic)"] = ort.InferenceSession(str(q))
    paths.update(openvino_paths(path))
    paths = {k: v for k, v in paths.items() if wanted(k, only)}
    if pt2 and wanted("pt2", only):
        t0 = time.perf_counter()
        with quiet():
            p2, _ = export_file(model, ckpt, tmp / f"{name}.pt2", fmt="pt2", sizes=rng)
        times["pt2"] = time.perf_counter() - t0
        BUILT.update(ref=ref, folder=folder, pt2=p2)
        import torch._inductor as inductor

        paths["pt2"] = inductor.aoti_load_package(str(p2))
    rows: dict[str, dict[str, Any]] = {k: {"vitkit": 0.0, "ref": 0.0, "agree": []} for k in paths}
    g = torch.Generator().manual_seed(0)
    for h, w in sizes:
        x = torch.randn(2, 3, h, w, generator=g)
        with torch.inference_mode():
            ours = model(x).numpy()
            theirs = ref(x).numpy()
        for key, run in paths.items():
            if key == "pt2":
                with torch.inference_mode():
                    out = run(x).numpy()
            elif key.startswith("openvino"):
                out = run(x.numpy())[0]
            else:
                out = run.run(None, {"pixel_values": x.numpy()})[0]
            r = rows[key]
            if "bf16" in key:  # (the reference too: bf16's rounding, not the export's)
                r["agree"].append(float((out.argmax(-1) == ours.argmax(-1)).mean()))
            if "int8" in key:
                r["agree"].append(float((out.argmax(-1) == ours.argmax(-1)).mean()))
                r["vitkit"] = max(r["vitkit"], relative_error(out, ours))
            else:
                r["vitkit"] = max(r["vitkit"], relative_error(out, ours))
                r["ref"] = max(r["ref"], relative_error(out, theirs))
    vk_ref = 0.0
    for h, w in sizes:  # vitkit itself against the reference, the same sizes
        x = torch.randn(1, 3, h, w, generator=g)
        with torch.inference_mode():
            vk_ref = max(vk_ref, relative_error(model(x).numpy(), ref(x).numpy()))
    for r in rows.values():
        r["agree"] = float(np.mean(r["agree"])) if r["agree"] else None
    return {
        "model": name,
        "kernel": getattr(cfg, "pos_resample", None)
        if getattr(cfg, "abs_pos_embed", True)
        else "rope (no table)",
        "sizes": [f"{h}x{w}" for h, w in sizes],
        "export_check": info["check"],
        "vitkit_vs_reference": vk_ref,
        "paths": rows,
        "export_seconds": times,
    }


def openvino_paths(onnx: Path) -> dict[str, Any]:
    """OpenVINO's CPU plugin running the dynamic-size ONNX graph, as an engine directory of
    ``export --engine openvino`` (fp32) and ``--precision bf16`` runs it (vitkit's runner:
    numpy in, [outputs] out); none where OpenVINO is not installed, bf16 only where this CPU
    has it natively."""
    from vitkit.engines.backends import available, openvino_runner
    from vitkit.hardware import native_bf16

    if not available("openvino"):
        return {}
    found = {"openvino fp32": openvino_runner(onnx, torch.get_num_threads(), "fp32")}
    if native_bf16(torch.device("cpu")):
        found["openvino bf16"] = openvino_runner(onnx, torch.get_num_threads(), "bf16")
    return found


def timed(fn: Any, x: torch.Tensor) -> float:
    t = time.perf_counter()
    fn(x)
    return time.perf_counter() - t


def speed(
    tmp: Path, rounds: int, shapes: list[tuple[int, int]], only: list[str] | None = None
) -> list[dict[str, Any]]:
    import onnxruntime as ort

    if BUILT:
        ref, folder = BUILT["ref"], BUILT["folder"]
    else:
        ref, folder = timm_vit("vit_base_patch16_224", tmp / "b16s")
    model, ckpt = load_model(folder)
    fixed_too = any(size == 224 for size, _ in shapes) and wanted("fixed 224", only)
    with quiet():
        if fixed_too:
            fixed, _ = export_file(model, ckpt, tmp / "fixed.onnx", check=False, overwrite=True)
        rng = SizeRange(16, 112, 512)
        dyn, _ = export_file(model, ckpt, tmp / "dyn.onnx", sizes=rng, overwrite=True)
        feats = {"indices": 4, "output_fmt": "NCHW", "norm": False, "prefix_tokens": False}
        if wanted("features onnx (4 blocks)", only):
            fdyn, _ = export_file(
                model, ckpt, tmp / "f.onnx", sizes=rng, features=feats, overwrite=True
            )
        if BUILT:
            p2 = BUILT["pt2"]
        elif wanted("pt2 (dynamic size)", only):
            p2, _ = export_file(model, ckpt, tmp / "b16.pt2", fmt="pt2", sizes=rng)
    import torch._inductor as inductor

    threads = torch.get_num_threads()
    so = ort.SessionOptions()
    so.intra_op_num_threads = threads
    so.add_session_config_entry("session.intra_op.allow_spinning", "0")
    s_fixed = ort.InferenceSession(str(fixed), so) if fixed_too else None
    s_dyn = ort.InferenceSession(str(dyn), so)
    s_feat = ort.InferenceSession(str(fdyn), so) if wanted("features onnx", only) else None
    package = inductor.aoti_load_package(str(p2)) if wanted("pt2 (dynamic size)", only) else None
    compiled = torch.compile(model, dynamic=False)
    ov = {f"{k} dynamic size": v for k, v in openvino_paths(dyn).items()}
    ov_fixed = openvino_paths(fixed).get("openvino fp32") if fixed_too else None

    def eager(x: torch.Tensor) -> Any:
        with torch.inference_mode():
            return model(x)

    def comp(x: torch.Tensor) -> Any:
        with torch.inference_mode():
            return compiled(x)

    def pt2(x: torch.Tensor) -> Any:
        with torch.inference_mode():
            return package(x)

    def timm_feats(x: torch.Tensor) -> Any:
        with torch.inference_mode():
            return ref.forward_intermediates(x, indices=4, intermediates_only=True)

    rows = []
    for size, batch in shapes:
        x = torch.randn(batch, 3, size, size)
        paths: dict[str, Any] = {
            "vitkit eager": eager,
            "torch.compile": comp,
            "pt2 (dynamic size)": pt2,
            "onnx dynamic size": lambda x: s_dyn.run(None, {"pixel_values": x.numpy()}),
            "features onnx (4 blocks)": lambda x: s_feat.run(None, {"pixel_values": x.numpy()}),
            "timm forward_intermediates eager": timm_feats,
        }
        for k, run in ov.items():
            paths[k] = lambda x, run=run: run(x.numpy())
        if size == 224:
            paths["onnx fixed 224"] = lambda x: s_fixed.run(None, {"pixel_values": x.numpy()})
            if ov_fixed is not None:
                paths["openvino fp32 fixed 224"] = lambda x: ov_fixed(x.numpy())
        paths = {k: f for k, f in paths.items() if k == "vitkit eager" or wanted(k, only)}
        for fn in paths.values():  # warm-up (compiles torch.compile at this shape)
            fn(x)
        got: dict[str, list[float]] = {k: [] for k in paths}
        for _ in range(rounds):
            for k, fn in paths.items():
                got[k].append(timed(fn, x))
        med = {k: statistics.median(v) for k, v in got.items()}
        rows.append({"size": size, "batch": batch, "seconds": med,
                     "img_per_s": {k: batch / v for k, v in med.items()}})  # fmt: skip
        print(json.dumps(rows[-1]), flush=True)
    return rows


def run_lines(res: dict[str, Any]) -> list[str]:
    """The command(s), the CPU and the load averages (one line per run of a merged file)."""
    cpu = f"CPU: {res['cpu']}, {res['threads']} threads"
    note = "(a host shared with other jobs: speed figures are ratios within one interleaved run)"
    if not res.get("runs"):
        return [
            f"Command: `{res['command']}`  ",
            f"{cpu}; load average at the start {res['load_start']}, at the end "
            f"{res['load_end']} {note}.",
        ]
    lines = [f'{cpu}; {note[1:-1]}. The runs (a table\'s "run N" names the one):', ""]
    for i, r in enumerate(res["runs"], 1):
        lines.append(
            f"{i}. `{r['command']}`: load average at the start {r['load_start']}, at the end "
            f"{r['load_end']}"
        )
    return lines


def run_of(res: dict[str, Any], row: dict[str, Any]) -> str:
    """ " (run N)" in a merged file's tables (which command measured the row), else ""."""
    return f" (run {row.get('run', 1)})" if res.get("runs") else ""


def write_md(out: Path, res: dict[str, Any]) -> None:
    lines = [
        "# Exports at any image size: exactness and speed",
        "",
        *run_lines(res),
        "",
        "## Exactness: max relative error over the sizes",
        "",
        "Each model exported once with `--dynamic-size` and run at every size; error = max "
        "|out - ref| / max |ref| over a batch of 2 random images, worst size. int8 and bf16: top-1 "
        "agreement with fp32 vitkit on the same random inputs (random weights: a stress of the "
        "ordering, not an accuracy).",
        "",
        "| model | E_pos kernel | sizes | path | vs vitkit PyTorch | vs reference | "
        "int8 / bf16 top-1 agreement |",
        "| --- | --- | --- | --- | --- | --- | --- |",
    ]
    for m in res["exactness"]:
        span = f"{len(m['sizes'])} ({m['sizes'][0]} .. {m['sizes'][1]})"
        lines.append(
            f"| {m['model']}{run_of(res, m)} | {m['kernel']} | {span} | vitkit PyTorch | - | "
            f"{m['vitkit_vs_reference']:.1e} | |"
        )
        for k, r in m["paths"].items():
            agree = f"{r['agree']:.3f}" if r["agree"] is not None else ""
            ref = f"{r['ref']:.1e}" if "int8" not in k else "-"
            lines.append(f"| {m['model']} | | | {k} | {r['vitkit']:.1e} | {ref} | {agree} |")
    lines += ["", f"OpenVINO: {res['openvino']}.", ""]
    if res.get("speed"):
        lines += [
            "## Speed: B/16, images/s (median of the interleaved rounds)",
            "",
            "| size | batch | path | img/s | x eager |",
            "| --- | --- | --- | --- | --- |",
        ]
        for row in res["speed"]:
            base = row["img_per_s"]["vitkit eager"]
            for k, v in row["img_per_s"].items():
                lines.append(
                    f"| {row['size']} | {row['batch']} | {k}{run_of(res, row)} | {v:.2f} | "
                    f"{v / base:.2f} |"
                )
        lines += ["", "Export and compile times (s): " + json.dumps(res.get("export_seconds", {}))]
    out.with_suffix(".md").write_text("\n".join(lines) + "\n")


def merged(old: dict[str, Any], new: dict[str, Any]) -> dict[str, Any]:
    """An earlier run's results with this run's models and speed rows added: each run keeps
    its command, load averages and seconds (runs: one entry per run)."""
    runs = old.get("runs") or [{k: old[k] for k in ("command", "load_start", "load_end")}]
    this = {k: new[k] for k in ("command", "load_start", "load_end")}
    for m in new["exactness"]:
        m["run"] = len(runs) + 1
    for row in new["speed"]:
        row["run"] = len(runs) + 1
    return {
        **old,
        "runs": [*runs, this],
        "exactness": [*old["exactness"], *new["exactness"]],
        "speed": [*old.get("speed", []), *new["speed"]],
        "export_seconds": {**old.get("export_seconds", {}), **new["export_seconds"]},
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default="bench/results/export_sizes")
    ap.add_argument("--sizes", type=int, default=20)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--models", default="Ti/16,B/16,dinov2reg,dinov3")
    ap.add_argument("--speed", default="224x1,224x32,384x1,384x32")
    ap.add_argument(
        "--paths",
        default=None,
        help="measure only the paths whose names contain one of these (comma-separated, "
        "e.g. openvino); vitkit eager is always timed (the speed baseline)",
    )
    ap.add_argument(
        "--merge-into",
        default=None,
        metavar="PREFIX",
        help="add this run's rows to PREFIX.json (its models and speed rows, its command listed "
        "beside the earlier ones) and write PREFIX.md from the whole",
    )
    args = ap.parse_args()
    only = args.paths.split(",") if args.paths else None
    warnings.filterwarnings("ignore")
    res: dict[str, Any] = {
        "command": "python bench/export_sizes.py " + " ".join(sys.argv[1:]),
        "cpu": cpu_name(),
        "threads": torch.get_num_threads(),
        "load_start": [round(v, 2) for v in os.getloadavg()],
        "torch": torch.__version__,
        "exactness": [],
    }
    try:
        import openvino

        res["openvino"] = f"{openvino.__version__.split('-')[0]}, its CPU plugin"
    except ImportError:
        res["openvino"] = "not installed in this environment: no OpenVINO rows"
    out = Path(args.out)
    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        for name in args.models.split(","):
            print(f"exactness: {name}", flush=True)
            if name in ("Ti/16", "B/16"):
                timm_name = {"Ti/16": "vit_tiny_patch16_224", "B/16": "vit_base_patch16_224"}
                ref, folder = timm_vit(timm_name[name], tmp / name.replace("/", ""))
                label = f"{name} (timm folder, 224)"
            else:
                ref, folder = hf_model(name, tmp / name)
                label = {"dinov2reg": "DINOv2-S/14 + 4 registers (transformers)",
                         "dinov3": "DINOv3-S/16, RoPE (transformers)"}[name]  # fmt: skip
            row = exactness(label, ref, folder, tmp, args.sizes, name == "B/16", only)
            res["exactness"].append(row)
            print(json.dumps(row)[:400], flush=True)
        shapes = [(int(s.split("x")[0]), int(s.split("x")[1])) for s in args.speed.split(",") if s]
        res["speed"] = speed(tmp, args.rounds, shapes, only) if shapes else []
    res["load_end"] = [round(v, 2) for v in os.getloadavg()]
    res["export_seconds"] = {m["model"]: m["export_seconds"] for m in res["exactness"]}
    if args.merge_into:
        out = Path(args.merge_into)
        res = merged(json.loads(out.with_suffix(".json").read_text()), res)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.with_suffix(".json").write_text(json.dumps(res, indent=1))
    write_md(out, res)
    print(out.with_suffix(".md").read_text())


if __name__ == "__main__":
    main()
