"""The inference engines on the command line: ``export --int8`` and ``--engine`` / ``--fast``
of ``eval`` and ``predict`` (vitkit.engines.backends, vitkit.engines.int8)."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from vitkit.cli.options import loading, positive_int
from vitkit.errors import VitkitError

# What --fast picks (bench/results/cpu_inference.md): an exact fp32 path for a checkpoint, the
# fastest engine that runs the file for an int8 model. Never a lower precision than the model's.
# OpenVINO fp32 was the fastest for Ti/16-B/16 at batch 1 and 32 on an AVX-512 host (1.15-1.26x
# ONNX Runtime, more over vitkit's own oneDNN path) and 0.9-1.3x ONNX Runtime on an AVX2 one.
FAST_FP32 = ("openvino", "onnxruntime", "torch")
FAST_INT8 = ("onnxruntime", "openvino")


def add_int8_options(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("int8 (CPU inference; OUT is then a directory)")
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


def add_engine_options(p: argparse.ArgumentParser, *, fast: bool = False) -> None:
    g = p.add_argument_group("engine")
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
            help="the fastest installed engine at the model's own precision (says which)",
        )


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
        overwrite=args.overwrite,
    )  # fmt: skip
    size = directory_size(out, names) / 1e6
    print(f"wrote {out} ({engine}, int8, {size:.1f} MB): {', '.join(names)}")
    print(f"accuracy beside the fp32 source: vitkit eval --from {out}")
    return 0


def load_for_inference(
    args: argparse.Namespace, path: str, *, batch: int | None = None
) -> tuple[Any, Any, str]:
    """The model of ``path`` run by ``--engine`` (or what ``--fast`` picks), its checkpoint,
    and the one line saying which engine and precision run it."""
    from vitkit.engines.backends import available, fp32_engine_model, is_engine_dir, load_engine_dir

    threads = getattr(args, "threads", None)
    fast = getattr(args, "fast", False)
    engine = args.engine
    if is_engine_dir(path):
        from vitkit.engines.backends import read_engine_dir

        info, _ = read_engine_dir(path)
        if engine is None and fast:
            files = info.get("files", {})
            engine = next((e for e in FAST_INT8 if e in files and available(e)), None)
        em, ckpt = load_engine_dir(path, engine, threads)
        why = "--fast" if fast and args.engine is None else "as written"
        return em, ckpt, f"engine: {em.engine}, {em.precision} ({why})"
    from vitkit.checkpoints import load_model

    model, ckpt = load_model(path, **loading(args))
    if engine is None and fast:
        engine = next(e for e in FAST_FP32 if available(e))
        why = "--fast: the fastest exact fp32 path installed"
    else:
        why = "as asked" if engine else "default"
        engine = engine or "torch"
    if engine != "torch":
        from vitkit.eval.checkpoint_eval import check_finite_weights

        check_finite_weights(model, ckpt)
        model = fp32_engine_model(model, engine, threads)
    else:
        from vitkit.engines.onednn import onednn_linears

        if onednn_linears(model):  # fp32 CPU inference as fast as ONNX Runtime's (onednn.py)
            why += "; Linear layers on oneDNN"
    return model, ckpt, f"engine: {engine}, fp32 ({why})"


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
