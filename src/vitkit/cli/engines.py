"""The inference engines on the command line: ``export --int8`` / ``--precision bf16``, and the
``--engine`` / ``--fast`` / ``--precision`` options of ``eval``, ``predict`` and ``serve``,
parsed into :func:`vitkit.engines.checkpoint_runner.runner`'s keywords (which decides how a
checkpoint runs)."""

from __future__ import annotations

import argparse
from typing import Any

from vitkit.cli.options import (
    INFERENCE_PRECISION_HELP,
    add_fp8_options,
    add_precision,
    loading,
    positive_int,
)
from vitkit.errors import VitkitError


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
        "(1.04-1.8x for Ti/16 to B/16). --engine openvino without --int8: fp32 OpenVINO IR",
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
        add_precision(g, default=None, help=INFERENCE_PRECISION_HELP, auto=True, fp8=True)
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
        overwrite=args.overwrite, sizes=sizes, features=getattr(args, "feature_outputs", None),
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


def runner_options(args: argparse.Namespace) -> dict[str, Any]:
    """The keywords of :func:`vitkit.engines.checkpoint_runner.runner` that the command line
    gives: the engine options, the fp8 settings, ``--threads``, ``--device`` where the command
    has it, and the checkpoint's loading options."""
    return {
        "engine": args.engine,
        "fast": getattr(args, "fast", False),
        "threads": getattr(args, "threads", None),
        "device": getattr(args, "device", None),
        "fp8_recipe": getattr(args, "fp8_recipe", None),
        "fp8_min_params": getattr(args, "fp8_min_params", None),
        **loading(args),
    }


def load_for_inference(
    args: argparse.Namespace,
    path: str,
    *,
    batch: int | None = None,
    precision: str | None = None,
    long_lived: bool = False,
    source_options: bool = False,
) -> tuple[Any, Any, str]:
    """:func:`inference_runner`'s model, its checkpoint and the line saying which engine and
    precision run it (with ``precision="auto"``, and the line saying why)."""
    run = inference_runner(
        args, path, precision=precision, long_lived=long_lived, source_options=source_options
    )
    line = run.line
    if run.precision_why:
        line += f"\nprecision: {run.precision} ({run.precision_why})"  # (as serve says it)
    return run.model, run.checkpoint, line


def inference_runner(
    args: argparse.Namespace,
    path: str,
    *,
    precision: str | None = None,
    long_lived: bool = False,
    source_options: bool = False,
) -> Any:
    """:func:`vitkit.engines.checkpoint_runner.runner` of ``path`` at ``precision`` with the
    command's options (``auto`` decided there too). The fp8 options are checked as typed first
    (one line naming them). ``source_options`` (eval): for an engine directory, the loading
    options read its fp32 source (:func:`source_comparison`), not the engine (refused with one
    elsewhere)."""
    from vitkit.engines.checkpoint_runner import runner

    if path.endswith(".pt2"):  # (runs as compiled: no fp8 settings read, no model code imported)
        engine = getattr(args, "engine", None)
        return runner(path, engine=engine, precision=precision, **loading(args))
    from vitkit.engines.backends import is_engine_dir

    check_fp8_options(args)
    options = runner_options(args)
    if precision != "fp8":  # (refused above as typed; they set nothing at another precision)
        options.update(fp8_recipe=None, fp8_min_params=None)
    if source_options and is_engine_dir(path):
        for key in loading(args):
            options.pop(key)
    return runner(path, precision=precision, long_lived=long_lived, **options)


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


def source_comparison(
    args: argparse.Namespace, ckpt: Any, dataset: Any, recorded: Any, result: Any
) -> dict[str, Any] | None:
    """For a quantized model: its fp32 source evaluated on the same images, and the top-1
    difference and agreement (None for a fp32 model, or a source no longer there)."""
    if ckpt.format != "vitkit-engine":
        return None
    from vitkit.engines.checkpoint_runner import source_reference
    from vitkit.eval.compare import format_comparison, versus_source

    options = loading(args)
    fp32, src, source = source_reference(ckpt, **options)
    if fp32 is None:
        print(f"the fp32 source {source or '(none recorded)'} is not there: no comparison")
        return None
    if options:
        named = ", ".join(f"{k}={v}" for k, v in options.items())
        print(f"the fp32 source {source} read with {named} (the engine runs as exported)")
    seq = getattr(args, "max_seq_len", None)  # (a NaFlex engine: the source packed alike)
    c = versus_source(recorded, fp32, src, source, dataset, args.batch_size, result, seq)
    print(format_comparison(c, str(getattr(recorded.model, "precision", "int8"))))
    return c


def cmd_export_bf16(args: argparse.Namespace) -> int:
    """``export --precision bf16 [--engine openvino]``: an engine directory run at bf16, with
    its top-1 beside fp32's on the test split of the checkpoint's dataset (or --calib-data's)."""
    import copy

    from vitkit.checkpoints import load_model
    from vitkit.engines.backends import require
    from vitkit.engines.bf16 import check_bf16_cpu
    from vitkit.engines.bf16_export import BF16_FILES, export_bf16
    from vitkit.engines.onednn import onednn_linears
    from vitkit.eval.compare import format_comparison, versus_fp32
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
    features = getattr(args, "feature_outputs", None)
    if features is None and data and ckpt.model_config.num_classes:
        from vitkit.eval.checkpoint_eval import checkpoint_dataset

        dataset = checkpoint_dataset(ckpt, data, "test", None)
        fp32 = copy.deepcopy(model).eval()
        onednn_linears(fp32)  # the fp32 model as the torch engine runs it

        def measure(em: Any) -> dict[str, Any]:
            print(f"measuring bf16 against fp32 on {data} (test split, {len(dataset)} images)")
            return versus_fp32(em, fp32, ckpt, dataset, 64)
    elif features is None:  # (features: no top-1; engine.json's check records bf16's error)
        print(
            f"{ckpt.path}: no dataset to measure bf16 against fp32 on (--calib-data D: D's "
            "test split); engine.json records versus_fp32: null"
        )
    out = export_bf16(
        model, ckpt, args.out, engine=engine, measure=measure, overwrite=args.overwrite,
        sizes=sizes, features=features,
    )  # fmt: skip
    from vitkit.engines.backends import read_engine_dir

    info, _ = read_engine_dir(out)
    print(f"wrote {out} ({engine}, bf16): {', '.join(BF16_FILES)}")
    if info.get("versus_fp32"):
        print(format_comparison(info["versus_fp32"], "bf16"))
    return 0
