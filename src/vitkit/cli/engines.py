"""The inference engines on the command line: ``export --int8`` and ``--engine`` / ``--fast``
of ``eval`` and ``predict`` (vitkit.engines.backends, vitkit.engines.int8)."""

from __future__ import annotations

import argparse
from collections.abc import Callable
from pathlib import Path
from typing import Any

from vitkit.cli.options import (
    INFERENCE_PRECISION_HELP,
    add_fp8_options,
    add_precision,
    count,
    loading,
    positive_int,
)
from vitkit.errors import VitkitError

# What --fast picks (bench/results/cpu_inference.md): an exact fp32 path for a checkpoint, the
# fastest engine that runs the file for an int8 model. Never a lower precision than the model's.
# OpenVINO fp32 was the fastest for Ti/16-B/16 at batch 1 and 32 on an AVX-512 host (1.15-1.26x
# ONNX Runtime, more over vitkit's own oneDNN path) and 0.9-1.3x ONNX Runtime on an AVX2 one.
FAST_FP32 = ("openvino", "onnxruntime", "torch")
FAST_INT8 = ("onnxruntime", "openvino")
# --fast --precision bf16 (bench/results/cpu_inference_bf16.md, B/16 at batch 32, a quiet 2-vCPU
# AMD EPYC with AVX512-BF16): OpenVINO at its bf16 precision ran 1.32x PyTorch with bf16 weights,
# but first needs an ONNX export and a compilation (11 s for B/16) that PyTorch's path does not.
# A server (long-lived) takes OpenVINO; a command over a set of images (eval, predict) PyTorch,
# which finishes 128 B/16 images before OpenVINO has started.
FAST_BF16 = ("torch", "openvino")
FAST_BF16_LONG_LIVED = ("openvino", "torch")


def add_int8_options(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("int8 and bf16 engines (CPU inference; OUT is then a directory)")
    add_precision(
        g,
        default=None,
        help="bf16: OUT/engine.json + OpenVINO IR run at its bf16 inference precision (a CPU "
        "with native bf16; engine.json records top-1 against fp32 on the test split of the "
        "checkpoint's dataset or --calib-data's)",
    )
    g.add_argument(
        "--int8",
        action="store_true",
        help="quantize to int8 (onnxruntime: dynamic, no calibration unless --static; openvino: "
        "calibrated): OUT/engine.json + the engine's model file(s)",
    )
    g.add_argument(
        "--engine",
        choices=("openvino", "onnxruntime"),
        help="the engine the int8 model is for (default: onnxruntime, no calibration needed, "
        "the fastest int8 on an AVX2 CPU; its ONNX file OpenVINO also runs); openvino: "
        "0.8-2.6x onnxruntime's speed by model and batch on a CPU with AVX512-VNNI "
        "(1.04-1.8x for Ti/16 to B/16)",
    )
    g.add_argument(
        "--static",
        action="store_true",
        help="onnxruntime: static QDQ with calibrated activation scales (default: "
        "quantize_dynamic, activation scales per batch); openvino always calibrates",
    )
    g.add_argument(
        "--keep-fp32",
        metavar="MODULES",
        help="leave the matmuls of these modules in fp32, comma-separated paths or endings "
        "(mlp.fc2: every block's fc2); slower, closer to fp32",
    )
    g.add_argument(
        "--calib-data", help="calibration dataset (default: the checkpoint's own dataset)"
    )
    g.add_argument(
        "--calib-images",
        type=positive_int,
        default=128,
        help="calibration images, drawn from its training split (default 128)",
    )


def add_engine_options(
    p: argparse.ArgumentParser, *, fast: bool = False, precision: bool = False
) -> None:
    g = p.add_argument_group("engine")
    if precision:  # (eval has --precision in its compute group: the same definition)
        add_precision(g, default=None, help=INFERENCE_PRECISION_HELP, fp8=True)
    g.add_argument(
        "--engine",
        choices=("torch", "onnxruntime", "openvino"),
        help="what runs the model (default: torch for a checkpoint; for a model of "
        "'export --int8', the engine it was written for); onnxruntime/openvino run a "
        "checkpoint in fp32 through an ONNX export made on the fly",
    )
    if fast:
        g.add_argument(
            "--fast",
            action="store_true",
            help="the fastest installed engine at the model's own precision, or at "
            "--precision bf16 the fastest bf16 path (says which)",
        )
    add_fp8_options(g)


def cmd_export_int8(args: argparse.Namespace) -> int:
    from vitkit.checkpoints import load_model
    from vitkit.engines.backends import require
    from vitkit.engines.int8 import calibration_images, directory_size, export_int8, int8_files

    engine = args.engine or "onnxruntime"
    if args.static and engine != "onnxruntime":
        raise VitkitError("--static is onnxruntime's (openvino always calibrates)")
    keep = tuple(m.strip() for m in (args.keep_fp32 or "").split(",") if m.strip())
    require(engine)
    model, ckpt = load_model(args.ckpt, **loading(args))
    sizes = export_sizes(args, ckpt.model_config)  # refused before any calibration work
    from vitkit.output_files import check_destination

    names = int8_files(engine)  # refused before any calibration work
    check_destination(args.out, reads=[ckpt.path], writes=names, overwrite=args.overwrite)
    calib = None
    how: dict[str, Any] = {"method": "dynamic"}
    if engine == "openvino" or args.static:
        data = args.calib_data or ckpt.meta.get("dataset")
        calib = calibration_images(ckpt, data, args.calib_images)
        how = {"method": "static", "data": data, "split": "train", "images": len(calib)}
        print(f"calibrating on {len(calib)} images of {data} (train split)")
    out = export_int8(
        model, ckpt, args.out, engine=engine, calib=calib, calibration=how, keep_fp32=keep,
        overwrite=args.overwrite, sizes=sizes,
    )  # fmt: skip
    size = directory_size(out, names) / 1e6
    print(f"wrote {out} ({engine}, int8, {size:.1f} MB): {', '.join(names)}")
    print(f"accuracy beside the fp32 source: vitkit eval --from {out}")
    return 0


def export_sizes(args: argparse.Namespace, cfg: Any) -> Any:
    """The size range ``--dynamic-size`` asks for (None without it; the bounds alone are
    refused: they would change nothing)."""
    from vitkit.engines.dynamic_size import size_range

    if not getattr(args, "dynamic_size", False):
        if getattr(args, "min_size", None) or getattr(args, "max_size", None):
            raise VitkitError("--min-size and --max-size bound --dynamic-size: add it")
        return None
    return size_range(cfg, args.min_size, args.max_size)


def fast_choice(
    precision: str, long_lived: bool, installed: Callable[[str], bool]
) -> tuple[str, str]:
    """The engine ``--fast`` picks for a checkpoint at ``precision`` among those ``installed``
    says are there (torch always is), and the words that say why."""
    order: tuple[str, ...]
    if precision == "bf16":
        order = FAST_BF16_LONG_LIVED if long_lived else FAST_BF16
        why = "--fast: the fastest bf16 path installed on this CPU" + (
            " for a server" if long_lived else ""
        )
    else:
        order, why = FAST_FP32, "--fast: the fastest exact fp32 path installed"
    return next(e for e in order if e == "torch" or installed(e)), why


def load_for_inference(
    args: argparse.Namespace,
    path: str,
    *,
    batch: int | None = None,
    precision: str | None = None,
    long_lived: bool = False,
) -> tuple[Any, Any, str]:
    """The model of ``path`` run by ``--engine`` (or what ``--fast`` picks) at ``precision``
    (None: fp32 for a checkpoint, an engine directory's own), its checkpoint, and the one line
    saying which engine and precision run it. ``long_lived`` (a server): ``--fast`` may pick an
    engine that takes longer to start and runs faster."""
    if path.endswith(".pt2"):  # (before the engines' imports: vitkit's model code stays out)
        return _pt2_for_inference(args, path, precision)
    from vitkit.engines.backends import available, engine_model, is_engine_dir, load_engine_dir

    threads = getattr(args, "threads", None)
    fast = getattr(args, "fast", False)
    engine = args.engine
    check_fp8_options(args)
    if is_engine_dir(path):
        from vitkit.engines.backends import read_engine_dir

        info, _ = read_engine_dir(path)
        own = str(info.get("precision", "int8"))
        if precision is not None and precision != own:
            raise VitkitError(
                f"{path}: an exported {own} model runs at {own} only; for --precision "
                f"{precision}, give the checkpoint it was exported from"
            )
        if engine is None and fast:
            files = info.get("files", {})
            engine = next((e for e in FAST_INT8 if e in files and available(e)), None)
        em, ckpt = load_engine_dir(path, engine, threads)
        why = "--fast" if fast and args.engine is None else "as written"
        return em, ckpt, f"engine: {em.engine}, {em.precision} ({why})"
    from vitkit.checkpoints import load_model

    if precision == "fp8":
        return _fp8_for_inference(args, path, engine)
    precision = precision or "fp32"
    if precision == "bf16":
        from vitkit.engines.bf16 import check_bf16_cpu

        check_bf16_cpu()  # before any weights are read
    model, ckpt = load_model(path, **loading(args))
    compiled = False
    if engine is None and fast:
        engine, why = fast_choice(precision, long_lived, available)
    else:
        why = "as asked" if engine else "default"
        engine = engine or "torch"
    if engine != "torch" or precision == "bf16":
        from vitkit.eval.checkpoint_eval import check_finite_weights

        check_finite_weights(model, ckpt)
        model = engine_model(model, engine, precision, threads, compiled=compiled)
        if engine == "torch":
            why += "; bf16 weights"
    else:
        from vitkit.engines.onednn import onednn_linears

        if onednn_linears(model):  # fp32 CPU inference as fast as ONNX Runtime's (onednn.py)
            why += "; Linear layers on oneDNN"
    return model, ckpt, f"engine: {engine}, {precision} ({why})"


def _pt2_for_inference(
    args: argparse.Namespace, path: str, precision: str | None
) -> tuple[Any, Any, str]:
    """A package of ``export --format pt2`` run by PyTorch alone (vitkit.engines.pt2_package):
    the engine and precision it was compiled with, any other refused in one line."""
    from vitkit.engines.pt2_package import load_pt2

    if getattr(args, "engine", None) not in (None, "torch") or precision not in (None, "fp32"):
        raise VitkitError(
            f"{path}: a .pt2 package runs as compiled (fp32, AOTInductor); for another engine "
            "or precision, give the checkpoint it was exported from"
        )
    model, src = load_pt2(path)
    return model, src, "engine: pt2 (AOTInductor), fp32 (as compiled)"


def check_fp8_options(args: argparse.Namespace) -> None:
    """``--fp8-recipe`` and ``--fp8-min-params`` set how ``--precision fp8`` runs: refused in
    one line at any other precision (they would change nothing)."""
    given = [
        option
        for option, key in (("--fp8-recipe", "fp8_recipe"), ("--fp8-min-params", "fp8_min_params"))
        if getattr(args, key, None) is not None
    ]
    precision = getattr(args, "precision", None)
    if given and precision != "fp8":
        raise VitkitError(
            f"{' and '.join(given)} {'set' if len(given) > 1 else 'sets'} how --precision fp8 "
            f"runs; this run's precision is {precision or 'the default'}: add --precision fp8 "
            "or leave them out"
        )


def fp8_device(args: argparse.Namespace) -> str:
    """Where ``--precision fp8`` runs: ``--device`` where the command has it (eval), else the
    first visible CUDA GPU (predict, serve), else the CPU (then refused, saying why)."""
    import torch

    given = getattr(args, "device", None)
    if given is not None:
        return str(given)
    return "cuda" if torch.cuda.is_available() else "cpu"


def _fp8_for_inference(
    args: argparse.Namespace, path: str, engine: str | None
) -> tuple[Any, Any, str]:
    """The checkpoint at ``path`` in bf16 on the GPU with its large Linear layers in float8
    (vitkit.engines.float8_inference), its checkpoint and the engine line; the device and the
    engine are checked before any weights are read."""
    import torch

    from vitkit.checkpoints import load_model
    from vitkit.engines.float8_inference import fp8_model, torchao_quantization
    from vitkit.eval.checkpoint_eval import check_finite_weights
    from vitkit.float8_layers import FP8_MIN_PARAMS, check_fp8_device, check_fp8_settings

    if engine not in (None, "torch"):
        raise VitkitError(f"--precision fp8 runs under the torch engine on a GPU, not {engine}")
    recipe = args.fp8_recipe or "tensorwise"
    min_params = FP8_MIN_PARAMS if args.fp8_min_params is None else args.fp8_min_params
    check_fp8_settings(recipe, min_params)
    device = torch.device(fp8_device(args))
    check_fp8_device(device)  # before any weights are read
    torchao_quantization()
    model, ckpt = load_model(path, **loading(args))
    check_finite_weights(model, ckpt)
    gpu = fp8_model(model, device, recipe, min_params)
    why = "--fast: float8 runs under torch only" if getattr(args, "fast", False) else "as asked"
    n = len(gpu.float8_layers)
    line = (
        f"engine: torch, fp8 ({recipe}: {count(n, 'Linear layer')} in float8, the rest bf16; "
        f"{gpu.device}, {torch.cuda.get_device_name(gpu.device)}; {why})"
    )
    return gpu, ckpt, line


def source_comparison(
    args: argparse.Namespace, ckpt: Any, dataset: Any, recorded: Any, result: Any
) -> dict[str, Any] | None:
    """For a quantized model: its fp32 source evaluated on the same images, and the top-1
    difference and agreement (None for a fp32 model, or a source no longer there)."""
    if ckpt.format != "vitkit-engine":
        return None
    from vitkit.engines.backends import read_engine_dir

    info, _ = read_engine_dir(ckpt.path)
    source = str(info.get("source", ""))
    if not source or not Path(source).exists():
        print(f"the fp32 source {source or '(none recorded)'} is not there: no comparison")
        return None
    from vitkit.checkpoints import load_model
    from vitkit.eval.checkpoint_eval import evaluate_checkpoint
    from vitkit.eval.compare import Recorder, agreement, comparison, format_comparison

    fp32, src = load_model(source, **loading(args))
    from vitkit.engines.onednn import onednn_linears

    onednn_linears(fp32)  # the source as the torch engine runs it
    rec = Recorder(fp32)
    ref = evaluate_checkpoint(rec, src, dataset, batch_size=args.batch_size, progress=False)
    agree = agreement(recorded.predictions(), rec.predictions())
    c = comparison(result.metrics()["top1"], ref.metrics()["top1"], agree, source)
    print(format_comparison(c, str(getattr(recorded.model, "precision", "int8"))))
    return c


def bf16_weights(args: argparse.Namespace, model: Any, tta: bool) -> bool:
    """Whether ``eval`` runs ``model`` with bf16 weights: ``--precision bf16`` asked on the CPU
    for a PyTorch model (without test-time augmentation, which keeps autocast). Refused on a
    CPU without native bf16."""
    from vitkit.engines.backends import EngineModel

    if args.precision != "bf16" or tta or isinstance(model, EngineModel):
        return False
    if str(args.device or "cpu") != "cpu":
        return False
    from vitkit.engines.bf16 import check_bf16_cpu

    check_bf16_cpu()
    return True


def versus_fp32(
    recorded: Any,
    fp32: Any,
    ckpt: Any,
    dataset: Any,
    batch_size: int,
    result: Any = None,
    *,
    device: str = "cpu",
    max_seq_len: int | None = None,
) -> dict[str, Any]:
    """A lower-precision model (a Recorder, or a module) beside the reference ``fp32`` (fp32;
    bf16 for fp8) on the same images, prepared on ``device``: top-1 of each, the difference and
    the agreement (vitkit.eval.compare). ``max_seq_len``: a NaFlex model's packed batches."""
    from vitkit.eval.checkpoint_eval import evaluate_checkpoint
    from vitkit.eval.compare import Recorder, agreement, comparison

    kw: dict[str, Any] = {"batch_size": batch_size, "progress": False, "device": device}
    kw["max_seq_len"] = max_seq_len
    if not isinstance(recorded, Recorder):
        recorded = Recorder(recorded)
    if result is None:
        result = evaluate_checkpoint(recorded, ckpt, dataset, **kw)
    ref = Recorder(fp32)
    base = evaluate_checkpoint(ref, ckpt, dataset, **kw)
    agree = agreement(recorded.predictions(), ref.predictions())
    return comparison(result.metrics()["top1"], base.metrics()["top1"], agree, str(ckpt.path))


def fp8_reference(args: argparse.Namespace, path: str, gpu: Any) -> Any:
    """What ``eval --precision fp8`` measures against: the checkpoint at ``path`` with bf16
    weights on the GPU the float8 model ``gpu`` runs on (vitkit.engines.float8_inference)."""
    from vitkit.checkpoints import load_model
    from vitkit.engines.float8_inference import bf16_gpu_model

    model, _ = load_model(path, **loading(args))
    return bf16_gpu_model(model, gpu.device)


def cmd_export_bf16(args: argparse.Namespace) -> int:
    """``export --precision bf16 [--engine openvino]``: an engine directory run at bf16, with
    its top-1 beside fp32's on the test split of the checkpoint's dataset (or --calib-data's)."""
    import copy

    from vitkit.checkpoints import load_model
    from vitkit.engines.backends import require
    from vitkit.engines.bf16 import check_bf16_cpu
    from vitkit.engines.bf16_export import BF16_FILES, export_bf16
    from vitkit.engines.onednn import onednn_linears
    from vitkit.eval.compare import format_comparison
    from vitkit.output_files import check_destination

    engine = args.engine or "openvino"
    if args.static or args.keep_fp32:
        raise VitkitError("--static and --keep-fp32 choose how --int8 quantizes, not bf16")
    if engine != "openvino":
        raise VitkitError(
            f"--precision bf16 writes a model for openvino, not {engine} (PyTorch converts a "
            "checkpoint to bf16 as it loads it: vitkit predict --precision bf16)"
        )
    require(engine)
    check_bf16_cpu()
    model, ckpt = load_model(args.ckpt, **loading(args))
    sizes = export_sizes(args, ckpt.model_config)
    check_destination(args.out, reads=[ckpt.path], writes=BF16_FILES, overwrite=args.overwrite)
    data = args.calib_data or ckpt.meta.get("dataset")
    measure = None
    if data and ckpt.model_config.num_classes:
        from vitkit.eval.checkpoint_eval import checkpoint_dataset

        dataset = checkpoint_dataset(ckpt, data, "test", None)
        fp32 = copy.deepcopy(model).eval()
        onednn_linears(fp32)  # the fp32 model as the torch engine runs it

        def measure(em: Any) -> dict[str, Any]:
            print(f"measuring bf16 against fp32 on {data} (test split, {len(dataset)} images)")
            return versus_fp32(em, fp32, ckpt, dataset, 64)
    else:
        print(
            f"{ckpt.path}: no dataset to measure bf16 against fp32 on (--calib-data D: D's "
            "test split); engine.json records versus_fp32: null"
        )
    out = export_bf16(
        model, ckpt, args.out, engine=engine, measure=measure, overwrite=args.overwrite,
        sizes=sizes,
    )  # fmt: skip
    from vitkit.engines.backends import read_engine_dir

    info, _ = read_engine_dir(out)
    print(f"wrote {out} ({engine}, bf16): {', '.join(BF16_FILES)}")
    if info.get("versus_fp32"):
        print(format_comparison(info["versus_fp32"], "bf16"))
    return 0
