"""Speed of vitkit against timm and Hugging Face transformers, side by side in one run.

For each model (identical configuration and weights in all three libraries: vitkit's weights are
converted with vitkit's own converters), precision (fp32, bf16 autocast) and mode (eager,
``torch.compile``), it times

- inference at batch 1 (latency) and at ``--batch`` (throughput), under ``torch.inference_mode``;
- a training step at ``--batch``: forward + backward + AdamW step;
- vitkit's ONNX export (``vitkit export``) under onnxruntime: fp32 inference (``--no-onnx``: off).

Every measurement is repeated ``--rounds`` times, interleaved across libraries and settings in an
order shuffled every round, so machine noise hits all alike; medians are reported, with vitkit/timm
and vitkit/HF ratios (> 1: vitkit is faster; the median of ratios taken round by round). MFU is
analytic FLOPs (``vitkit.registry.counts.count_flops``: the matmuls, which hook-based counters miss
inside fused attention; training = 3x forward) over time, against the matmul ceiling measured on
this machine at the same precision. Peak memory is what the call held at once beyond what was held
before it: on CUDA the allocator's peak; on the CPU the bytes malloc had handed out (glibc
``mallinfo2``), sampled every millisecond by a thread.

Levers on vitkit (CUDA), each an impl of its own beside plain ``vitkit``: ``vitkit+cudnn``
(cuDNN's fused attention, ``vitkit.models.sdpa_backend``), ``vitkit+fp8`` (float8 matmuls in
the Linear layers of at least 2**20 weights, tensorwise scales, ``vitkit.train.float8``),
``vitkit+fp8all`` (every Linear whose sides are multiples of 16), ``vitkit+fp8mlp`` (only the
MLP's), ``vitkit+fp8r`` (rowwise scales), combined with ``+``: ``vitkit+fp8+cudnn``; for
inference only, ``vitkit+fp8infer`` (``--precision fp8`` inference: float8 weights cast once,
bench/speed_fp8_inference.py, with its top-1 agreement with vitkit's bf16). The
levers' rows go to a table of their own, each against timm and plain vitkit in the same rounds.

    python bench/speed.py                                   # MNIST model + Ti/16, quick
    python bench/speed.py --models mnist,Ti/16,S/16,B/16 --modes eager,compiled --rounds 5
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import json
import random
import statistics
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))  # the torchvision-op shim for importing timm

from references import import_reference  # noqa: E402
from speed_fp8_inference import INFER_LEVERS, agreement_with_bf16, fp8_inference_model  # noqa: E402

import vitkit  # noqa: E402
from vitkit.checkpoints.hf import vit_model as hf_conv  # noqa: E402
from vitkit.checkpoints.timm import vision_transformer as timm_conv  # noqa: E402
from vitkit.hardware import cpu_name  # noqa: E402
from vitkit.models.sdpa_backend import sdpa_backend, set_attention_backend  # noqa: E402
from vitkit.registry.counts import count_flops  # noqa: E402
from vitkit.train.float8 import FP8_MIN_PARAMS, check_fp8_device, convert_to_fp8  # noqa: E402
from vitkit.train.recipes import MNIST  # noqa: E402

# lever -> (fp8 recipe or None, fp8 min_params, attention backend or None)
LEVERS: dict[str, tuple[str | None, int, str | None]] = {
    "cudnn": (None, 0, "cudnn"),
    "flash": (None, 0, "flash"),
    "fp8": ("tensorwise", FP8_MIN_PARAMS, None),
    "fp8all": ("tensorwise", 0, None),
    "fp8mlp": ("tensorwise", 2 * FP8_MIN_PARAMS, None),
    "fp8r": ("rowwise", FP8_MIN_PARAMS, None),
}


def task_kind(task: str) -> str:
    """``infer_b1``, ``infer`` (at the batch) or ``train``: what ``--tasks`` names."""
    return task if task in ("infer_b1", "train") else "infer"


def split_impl(impl: str) -> tuple[str, list[str]]:
    """``vitkit+fp8+cudnn`` -> ("vitkit", ["fp8", "cudnn"]); levers apply to vitkit only."""
    base, *levers = impl.split("+")
    unknown = [lever for lever in levers if lever not in LEVERS and lever not in INFER_LEVERS]
    alone = set(levers) & set(INFER_LEVERS) and len(levers) > 1  # (a float8 inference lever)
    if unknown or alone or (levers and base != "vitkit"):
        names = ", ".join([*LEVERS, *INFER_LEVERS])
        raise SystemExit(f"speed.py: unknown impl {impl!r} (levers: {names})")
    return base, levers


def lever_model(model: torch.nn.Module, levers: list[str], device) -> tuple:
    """A copy of vitkit's model with the impl's float8 layers, and its attention backend."""
    import copy

    if set(levers) & set(INFER_LEVERS):  # (inference only: its own weights, its own wrapper)
        return fp8_inference_model(model, levers, device), "auto"
    fp8 = [LEVERS[lever] for lever in levers if LEVERS[lever][0]]
    attention = next((LEVERS[lever][2] for lever in levers if LEVERS[lever][2]), "auto")
    if not levers:
        return model, attention
    if fp8:
        check_fp8_device(device)
    # a model of its own: torch.compile reuses a model's graph whatever context is around it
    model = copy.deepcopy(model)
    n = set_attention_backend(model, attention)
    if attention != "auto":
        print(f"{'+'.join(levers)}: {n} attention layers on {attention}", file=sys.stderr)
    if fp8:
        recipe, min_params, _ = fp8[0]
        layers = convert_to_fp8(model, recipe, min_params)
        print(f"{'+'.join(levers)}: {len(layers)} Linear layers in float8 ({recipe})",
              file=sys.stderr)  # fmt: skip
    return model, attention


def model_cfg(name: str) -> vitkit.ViTConfig:
    if name == "mnist":  # the default recipe's model, in the libraries' common GELU
        return vitkit.model_config(
            MNIST.model,
            image_size=28,
            in_chans=1,
            num_classes=10,
            gelu="none",
            **MNIST.model_overrides,
        )
    return vitkit.model_config(name, image_size=224, num_classes=1000, gelu="none")


def build(name: str, device: torch.device, impls: set[str]) -> dict[str, torch.nn.Module]:
    """The same network and weights in vitkit, timm and transformers (those in ``impls``)."""
    cfg = model_cfg(name)
    torch.manual_seed(0)
    ours = vitkit.create_model(cfg)
    with torch.no_grad():
        for p in ours.parameters():
            p.add_(torch.randn_like(p) * 0.02)
    models = {"vitkit": ours}
    if "timm" in impls:
        timm = import_reference("timm")
        t = timm.create_model("vit_base_patch16_224", **timm_conv.timm_model_args(cfg))
        t.load_state_dict(timm_conv.state_dict_to_timm(ours.state_dict(), cfg))
        models["timm"] = t
    if "hf" not in impls:
        return {k: m.to(device).eval() for k, m in models.items()}
    transformers = import_reference("transformers")
    arch, hsd = hf_conv.state_dict_to_hf(ours.state_dict(), cfg, "5")
    hc = transformers.ViTConfig(
        **{
            k: v
            for k, v in hf_conv.vit_to_hf_config(cfg, arch).items()
            if k not in ("architectures", "model_type")
        }
    )
    h = transformers.ViTForImageClassification(hc)
    h.load_state_dict(hsd)
    models["hf"] = h
    return {k: m.to(device).eval() for k, m in models.items()}


def logits_of(impl: str, model: torch.nn.Module, x: torch.Tensor) -> torch.Tensor:
    return model(x).logits if impl == "hf" else model(x)


def matmul_ceiling(
    dtype: torch.dtype, device: torch.device, n: int | None = None, reps: int = 5
) -> float:
    """FLOP/s of a large square matmul at ``dtype`` (the best of ``reps``), on random data.

    On CUDA the product is 8192^3 and ten run back to back per timing: a 2048^3 one lasts tens of
    microseconds there, so the host's clock and the synchronization would halve the ceiling."""
    cuda = device.type == "cuda"
    n, inner = n or (8192 if cuda else 2048), 10 if cuda else 1
    a = torch.randn(n, n, device=device).to(dtype)
    b = torch.randn(n, n, device=device).to(dtype)
    best = float("inf")
    for _ in range(reps + 1):
        sync(device)
        t = time.perf_counter()
        for _ in range(inner):
            a @ b
        sync(device)
        best = min(best, (time.perf_counter() - t) / inner)
    return 2 * n**3 / best


class _MallInfo2(ctypes.Structure):
    _fields_ = [
        (name, ctypes.c_size_t)
        for name in "arena ordblks smblks hblks hblkhd usmblks fsmblks uordblks fordblks "
        "keepcost".split()
    ]


try:  # glibc >= 2.33; elsewhere CPU peak memory is not reported
    _LIBC = ctypes.CDLL("libc.so.6")
    _LIBC.mallinfo2.restype = _MallInfo2
except (OSError, AttributeError):
    _LIBC = None


class PeakMemory:
    """Peak memory a call holds beyond what was held when it started (bytes)."""

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self.peak: int | None = None
        self.tracked = device.type == "cuda" or _LIBC is not None

    @staticmethod
    def _live() -> int:
        """Bytes malloc has handed out and not had back (glibc ``mallinfo2``: every arena, plus
        mmapped blocks), unlike the resident size, which keeps freed memory."""
        info = _LIBC.mallinfo2()
        return info.uordblks + info.hblkhd

    def __enter__(self) -> PeakMemory:
        if self.device.type == "cuda":
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats(self.device)
            self.base = torch.cuda.memory_allocated(self.device)
            return self
        if not self.tracked:
            return self
        self.base = self._live()
        self.top = self.base
        self.stop = threading.Event()

        def sample() -> None:
            while not self.stop.wait(0.001):
                self.top = max(self.top, self._live())

        self.thread = threading.Thread(target=sample, daemon=True)
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize()
            self.peak = torch.cuda.max_memory_allocated(self.device) - self.base
            return
        if not self.tracked:
            return
        self.top = max(self.top, self._live())
        self.stop.set()
        self.thread.join()
        self.peak = self.top - self.base


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", default="mnist,Ti/16")
    ap.add_argument(
        "--impls", default="vitkit,timm,hf", help="libraries, and vitkit with levers (above)"
    )
    ap.add_argument("--tasks", default="infer_b1,infer,train", help="what to time")
    ap.add_argument("--precisions", default="fp32,bf16")
    ap.add_argument("--modes", default="eager", help="eager and/or compiled")
    ap.add_argument("--batch", type=int, default=32, help="batch for throughput and training")
    ap.add_argument("--mnist-batch", type=int, default=MNIST.batch_size)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--threads", type=int, help="torch threads (default: torch's)")
    ap.add_argument("--device", default="cpu")
    ap.add_argument(
        "--no-onnx", dest="onnx", action="store_false", help="skip onnxruntime (fp32 inference)"
    )
    ap.add_argument("--tf32", action="store_true", help="CUDA: fp32 matmuls and convs in TF32")
    ap.add_argument("--compiled-impls", help="the impls also timed compiled (default: all)")
    ap.add_argument(
        "--compile-mode",
        help="torch.compile mode for every compiled impl (default: inductor's default), e.g. "
        "max-autotune-no-cudagraphs, max-autotune, reduce-overhead",
    )
    ap.add_argument(
        "--no-compiled-b1",
        dest="compiled_b1",
        action="store_false",
        help="compiled mode: skip batch-1 latency (one compilation fewer per impl and precision)",
    )
    ap.add_argument("--out", default=str(ROOT / "bench" / "results" / "speed"))
    args = ap.parse_args()
    if args.tf32:
        torch.backends.cuda.matmul.allow_tf32 = True
        torch.backends.cudnn.allow_tf32 = True
    if args.threads:
        torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    precisions = args.precisions.split(",")
    ceilings = {
        p: matmul_ceiling(torch.float32 if p == "fp32" else torch.bfloat16, device)
        for p in precisions
    }
    compiled_impls = (args.compiled_impls or args.impls).split(",")
    rows: list[dict] = []
    failed: list[dict] = []
    agreement: list[dict] = []  # float8 inference against vitkit's bf16, same inputs
    for name in args.models.split(","):
        models = build(name, device, {split_impl(i)[0] for i in args.impls.split(",")})
        cfg = model_cfg(name)
        batch = args.mnist_batch if name == "mnist" else args.batch
        fns: dict[tuple[str, str, str, str], Callable[[], None]] = {}
        for impl in args.impls.split(","):
            for prec in precisions:
                for mode in args.modes.split(","):
                    if mode == "compiled" and impl not in compiled_impls:
                        continue
                    base, levers = split_impl(impl)
                    try:
                        model, attention = lever_model(models[base], levers, device)
                        more = make_fns(impl, model, cfg, prec, mode, batch, device, args,
                                        attention)  # fmt: skip
                        if set(levers) & set(INFER_LEVERS):  # (no training: weights are cast)
                            more = {k: f for k, f in more.items() if k[3] != "train"}
                            x = torch.randn(batch, cfg.in_chans, *cfg.image_size, device=device)
                            agree = agreement_with_bf16(models[base], model, x)
                            agreement.append({"model": name, "impl": impl, **agree})
                    except Exception as err:
                        failed.append({"model": name, "key": [impl, prec, mode, "build"],
                                       "error": one_line(err)})  # fmt: skip
                        print(f"{name} {impl}: FAILED {one_line(err)}", file=sys.stderr)
                        continue
                    fns.update(more)
        if not args.compiled_b1:
            fns = {k: f for k, f in fns.items() if not (k[2] == "compiled" and k[3] == "infer_b1")}
        tasks = args.tasks.split(",")
        fns = {k: f for k, f in fns.items() if task_kind(k[3]) in tasks}
        first: dict[tuple[str, str, str, str], float] = {}
        if args.onnx and device.type == "cpu" and "fp32" in precisions:
            fns.update(onnx_fns(models["vitkit"], cfg, batch))
        times: dict[tuple[str, str, str, str], list[float]] = {k: [] for k in fns}
        peaks: dict[tuple[str, str, str, str], int] = {}
        for key, fn in list(fns.items()):  # warm up (and compile) everything first
            start = time.perf_counter()
            try:
                fn()
                sync(device)
            except Exception as err:  # a lever the card or library refuses: say so, go on
                failed.append({"model": name, "key": list(key), "error": one_line(err)})
                print(f"{name} {key}: FAILED {one_line(err)}", file=sys.stderr)
                del fns[key]
                continue
            first[key] = time.perf_counter() - start
            print(f"{name} {key}: first call {first[key]:.1f} s", file=sys.stderr)
            with PeakMemory(device) as mem:
                fn()
            peaks[key] = mem.peak
        for r in range(args.rounds):
            keys = list(fns)
            random.Random(r).shuffle(keys)  # no setting always follows the same one
            for key in keys:
                fn = fns[key]
                sync(device)
                t = time.perf_counter()
                fn()
                sync(device)
                times[key].append(time.perf_counter() - t)
        flops = count_flops(cfg)
        for (impl, prec, mode, task), ts in times.items():
            med = statistics.median(ts)
            n = 1 if task == "infer_b1" else batch
            work = flops * n * (3 if task == "train" else 1)
            rows.append(
                {
                    "model": name,
                    "impl": impl,
                    "precision": prec,
                    "mode": mode,
                    "task": task,
                    "batch": n,
                    "median_s": med,
                    "images_per_s": n / med,
                    "mfu": work / med / ceilings[prec],
                    "peak_memory_bytes": peaks[(impl, prec, mode, task)],
                    "first_call_s": first[(impl, prec, mode, task)],
                    "rounds": ts,
                }
            )
        print(f"{name}: done", file=sys.stderr)
    write(rows, ceilings, args, failed, agreement)


def make_fns(impl, model, cfg, prec, mode, batch, device, args, attention="auto") -> dict:
    # static shapes: each batch size gets its own graph, as a trainer at a fixed batch sees it
    net = (
        torch.compile(model, dynamic=False, mode=args.compile_mode) if mode == "compiled" else model
    )
    x1 = torch.randn(1, cfg.in_chans, *cfg.image_size, device=device)
    xb = torch.randn(batch, cfg.in_chans, *cfg.image_size, device=device)
    y = torch.randint(cfg.num_classes, (batch,), device=device)
    # fused AdamW on CUDA (what vitkit's trainer uses there), for every library alike
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=device.type == "cuda")

    def infer(x):
        def fn():
            with torch.inference_mode(), amp_ctx(), sdpa_backend(attention):
                logits_of(impl, net, x)

        return fn

    def amp_ctx():
        return (
            torch.autocast(device.type, dtype=torch.bfloat16)
            if prec == "bf16"
            else contextlib.nullcontext()
        )

    def train():
        model.train()
        with amp_ctx(), sdpa_backend(attention):
            loss = torch.nn.functional.cross_entropy(logits_of(impl, net, xb).float(), y)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        model.eval()

    return {
        (impl, prec, mode, "infer_b1"): infer(x1),
        (impl, prec, mode, f"infer_b{batch}"): infer(xb),
        (impl, prec, mode, "train"): train,
    }


def onnx_fns(model: torch.nn.Module, cfg, batch: int) -> dict:
    """vitkit's ONNX export (``vitkit export``) run by onnxruntime on the CPU, fp32 inference."""
    import tempfile

    import numpy as np
    import onnxruntime as ort

    from vitkit.engines.onnx_export import export_onnx

    path = Path(tempfile.mkdtemp(prefix="vitkit-speed-")) / "model.onnx"
    export_onnx(model, path)
    opts = ort.SessionOptions()
    opts.intra_op_num_threads = torch.get_num_threads()
    # Idle onnxruntime threads spin by default and would slow whatever is timed next.
    opts.add_session_config_entry("session.intra_op.allow_spinning", "0")
    session = ort.InferenceSession(str(path), opts, providers=["CPUExecutionProvider"])
    name = session.get_inputs()[0].name

    def infer(n: int) -> Callable[[], None]:
        x = np.random.default_rng(0).standard_normal(
            (n, cfg.in_chans, *cfg.image_size), dtype=np.float32
        )
        return lambda: session.run(None, {name: x})

    return {
        ("onnx", "fp32", "eager", "infer_b1"): infer(1),
        ("onnx", "fp32", "eager", f"infer_b{batch}"): infer(batch),
    }


def paired_ratio(ours: dict, other: dict) -> float:
    """Median over rounds of other's time / ours in the same round (> 1: ours is faster).

    Pairs taken in the same round share that round's machine state, so the ratio is steadier
    than the ratio of the two medians."""
    return statistics.median(o / v for v, o in zip(ours["rounds"], other["rounds"]))


def mfu_summary(rows: list[dict]) -> dict[str, dict[str, float]]:
    """Per model, vitkit's best bf16 MFU (fractions) over the modes measured: ``train_mfu``
    (a training step at the batch) and ``infer_mfu`` (inference at the batch)."""
    summary: dict[str, dict[str, float]] = {}
    for r in rows:
        if r["impl"] != "vitkit" or r["precision"] != "bf16" or r["task"] == "infer_b1":
            continue
        key = "train_mfu" if r["task"] == "train" else "infer_mfu"
        entry = summary.setdefault(r["model"], {})
        entry[key] = max(entry.get(key, 0.0), r["mfu"])
    return summary


def one_line(err: BaseException) -> str:
    text = f"{type(err).__name__}: {err}".strip().splitlines()
    return text[0][:300] if text else type(err).__name__


def write(
    rows: list[dict],
    ceilings: dict[str, float],
    args: argparse.Namespace,
    failed: list[dict],
    agreement: list[dict] | None = None,
) -> None:
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    device = torch.device(args.device)
    meta = {
        "torch": torch.__version__,
        "threads": torch.get_num_threads(),
        "device": args.device,
        "device_name": torch.cuda.get_device_name(device) if device.type == "cuda" else cpu_name(),
        "tf32": bool(args.tf32),
        "matmul_ceiling_flops": ceilings,
        "command": " ".join(sys.argv),
    }
    summary = mfu_summary(rows)
    out.with_suffix(".json").write_text(
        json.dumps(
            {
                "meta": meta,
                "summary": summary,
                "rows": rows,
                "failed": failed,
                "fp8_inference_vs_bf16": list(agreement),
            },
            indent=1,
        )  # fmt: skip
    )
    by = {(r["model"], r["impl"], r["precision"], r["mode"], r["task"]): r for r in rows}
    lines = [
        f"torch {torch.__version__}, {torch.get_num_threads()} threads, {args.device} "
        f"({meta['device_name']}); matmul "
        + ", ".join(f"{p} {c / 1e9:.0f} GFLOP/s" for p, c in ceilings.items()),
        "",
        "| model | precision | mode | task | vitkit img/s | timm img/s | HF img/s "
        "| vitkit/timm | vitkit/HF | vitkit MFU | peak MiB vitkit / timm / HF | ONNX img/s |",
        "| --- | --- | --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for (model, impl, prec, mode, task), r in by.items():
        if impl != "vitkit":
            continue
        t = by.get((model, "timm", prec, mode, task))
        h = by.get((model, "hf", prec, mode, task))
        o = by.get((model, "onnx", prec, "eager", task)) if mode == "eager" else None

        def ips(x):
            return f"{x['images_per_s']:.1f}" if x else "-"

        def ratio(x, r=r):
            return f"{paired_ratio(r, x):.2f}" if x else "-"

        def mib(x):
            if not x or x["peak_memory_bytes"] is None:
                return "-"
            return f"{x['peak_memory_bytes'] / 2**20:.0f}"

        lines.append(
            f"| {model} | {prec} | {mode} | {task} | {ips(r)} | {ips(t)} | {ips(h)} | "
            f"{ratio(t)} | {ratio(h)} | {100 * r['mfu']:.0f} % | "
            f"{mib(r)} / {mib(t)} / {mib(h)} | {ips(o)} |"
        )
    lines += lever_table(rows, by)
    lines += [
        f"\n{a['impl']} ({a['model']}): top-1 agreement with vitkit bf16 "
        f"{100 * a['top1_agreement']:.1f} % on {a['images']} random inputs, logits "
        f"{100 * a['logits_relative_difference']:.1f} % apart"
        for a in agreement
    ]
    lines += [f"\nFAILED {' '.join(f['key'])} ({f['model']}): {f['error']}" for f in failed]
    out.with_suffix(".md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


def lever_table(rows: list[dict], by: dict) -> list[str]:
    """The levers' rows: each against timm and plain vitkit in the same rounds."""
    levers = [r for r in rows if "+" in r["impl"]]
    if not levers:
        return []
    lines = [
        "",
        "| model | precision | mode | task | impl | img/s | vs timm | vs vitkit | MFU "
        "| peak MiB | first call s |",
        "| --- | --- | --- | --- | --- | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for r in levers:
        t, v = (by.get((r["model"], i, *(r[k] for k in ("precision", "mode", "task"))))
                for i in ("timm", "vitkit"))  # fmt: skip
        peak = r["peak_memory_bytes"]
        lines.append(
            f"| {r['model']} | {r['precision']} | {r['mode']} | {r['task']} | {r['impl']} | "
            f"{r['images_per_s']:.1f} | {f'{paired_ratio(r, t):.2f}' if t else '-'} | "
            f"{f'{paired_ratio(r, v):.2f}' if v else '-'} | {100 * r['mfu']:.0f} % | "
            f"{'-' if peak is None else f'{peak / 2**20:.0f}'} | {r['first_call_s']:.1f} |"
        )
    return lines


if __name__ == "__main__":
    main()
