"""``vitkit export``: ONNX (any size with ``--dynamic-size``), the backbone's features
(``--features``), PyTorch's AOTInductor package (``--format pt2``), int8 and bf16 engine
directories (vitkit.cli.engines)."""

from __future__ import annotations

import argparse
from typing import Any

from vitkit.cli.engines import add_int8_options, cmd_export_bf16, cmd_export_int8, export_sizes
from vitkit.cli.options import (
    add_checkpoint,
    add_command,
    add_overwrite,
    image_side,
    loading,
    output_directory,
    output_file,
    path,
    positive_int,
)
from vitkit.errors import VitkitError


def add_export_command(sub: Any) -> None:
    p = add_command(
        sub,
        "export",
        "export a checkpoint (any format) to ONNX or a .pt2 package, checked against PyTorch",
    )
    add_checkpoint(p, positional=True)
    p.add_argument(
        "out",
        metavar="OUT",
        type=path,
        help="the .onnx (or .pt2) file to write (--int8, --precision bf16: a directory)",
    )
    p.add_argument(
        "--format",
        dest="out_format",
        default="onnx",
        choices=["onnx", "pt2"],
        help="onnx; pt2: torch.export + AOTInductor package for the CPU (compiles C++: "
        "minutes), run by PyTorch without vitkit's model code",
    )
    p.add_argument("--opset", type=positive_int, help="ONNX opset (default: the exporter's)")
    p.add_argument(
        "--no-check",
        action="store_true",
        help="skip comparing onnxruntime's outputs with PyTorch's (needs onnxruntime)",
    )
    g = p.add_argument_group("image size")
    g.add_argument(
        "--dynamic-size",
        action="store_true",
        help="height and width dynamic (any multiple of the patch in --min-size..--max-size), "
        "E_pos resampled inside the graph with the checkpoint's kernel; checked at sizes it "
        "was not traced at",
    )
    g.add_argument("--min-size", type=image_side, help="smallest side, px (default: 2 patches)")
    g.add_argument(
        "--max-size", type=image_side, help="largest side, px (default: twice the checkpoint's)"
    )
    g = p.add_argument_group("features (the backbone for dense tasks)")
    g.add_argument(
        "--features",
        action="store_true",
        help="export forward_intermediates (outputs block{i}, one per index) instead of logits",
    )
    g.add_argument(
        "--out-indices",
        metavar="N|I,J,..",
        help="N: the last N blocks; I,J,..: those blocks, negative from the end (default: all)",
    )
    g.add_argument(
        "--output-fmt",
        choices=("NCHW", "NLC"),
        default="NCHW",
        help="maps [B, D, h, w] (NCHW) or tokens [B, h*w, D] (NLC)",
    )
    g.add_argument("--norm", action="store_true", help="through the final norm (timm's norm=True)")
    g.add_argument(
        "--prefix-tokens",
        action="store_true",
        help="also output block{i}_prefix: the class token and registers [B, prefix, D]",
    )
    add_int8_options(p)
    add_overwrite(p, "replace an existing OUT (never a file of the checkpoint read)")
    p.set_defaults(func=cmd_export)


def _features(args: argparse.Namespace) -> dict[str, Any] | None:
    from vitkit.engines.feature_export import parse_indices

    if not args.features:
        given = args.out_indices or args.norm or args.prefix_tokens or args.output_fmt != "NCHW"
        if given:
            raise VitkitError(
                "--out-indices, --output-fmt, --norm and --prefix-tokens shape --features: add it"
            )
        return None
    return {
        "indices": parse_indices(args.out_indices),
        "output_fmt": args.output_fmt,
        "norm": args.norm,
        "prefix_tokens": args.prefix_tokens,
    }


def cmd_export(args: argparse.Namespace) -> int:
    from vitkit.checkpoints import load_model

    engine_dir = args.precision == "bf16" or args.int8 or args.engine or args.static
    if engine_dir or args.keep_fp32:
        if args.out_format == "pt2":
            raise VitkitError("--int8, --precision bf16 and --engine write ONNX / OpenVINO")
        args.feature_outputs = _features(args)
        return _engine_dir(args)
    _check_path(output_file, args.out)
    if args.out_format == "pt2" and args.no_check:
        raise VitkitError("--no-check: a .pt2 package is always checked (it is compiled anyway)")
    features = _features(args)
    model, ckpt = load_model(args.ckpt, **loading(args))
    sizes = export_sizes(args, ckpt.model_config)
    from vitkit.engines.exports import export_file

    if args.out_format == "pt2":
        print("compiling with AOTInductor (C++; minutes for a large model)")
    out, info = export_file(
        model, ckpt, args.out, fmt=args.out_format, sizes=sizes, features=features,
        opset=args.opset, check=not args.no_check, overwrite=args.overwrite,
    )  # fmt: skip
    cfg = ckpt.model_config
    shape = (
        f"[batch, {cfg.in_chans}, H, W] (H, W: {_described(info['sizes'])})"
        if info["sizes"]
        else f"[batch, {cfg.in_chans}, {cfg.image_size[0]}, {cfg.image_size[1]}]"
    )
    outs = ", ".join(info["outputs"])
    print(f"wrote {out} ({out.stat().st_size / 1e6:.1f} MB): input pixel_values {shape}, "
          f"output {outs}")  # fmt: skip
    check = info.get("check")
    if check:
        at = ", ".join(check["sizes"])
        engine = "onnxruntime" if args.out_format == "onnx" else "the package"
        print(
            f"{engine} vs PyTorch: max relative difference {check['max_relative_error']:.2e} "
            f"at {at}"
        )
    return 0


def _described(sizes: dict[str, int]) -> str:
    from vitkit.engines.dynamic_size import SizeRange

    return SizeRange.from_dict(sizes).describe()


def _engine_dir(args: argparse.Namespace) -> int:
    if args.precision == "bf16":
        if args.int8:
            raise VitkitError("--int8 or --precision bf16: one precision per export")
        _check_path(output_directory, args.out)
        return cmd_export_bf16(args)
    if not args.int8:
        if args.engine == "openvino" and not (args.static or args.keep_fp32):
            _check_path(output_directory, args.out)
            return _export_openvino_fp32(args)
        raise VitkitError(
            "--static and --keep-fp32 choose how --int8 quantizes, --engine what it is for: "
            "add --int8 (or --engine openvino alone: fp32 OpenVINO IR)"
        )
    _check_path(output_directory, args.out)
    return cmd_export_int8(args)


def _export_openvino_fp32(args: argparse.Namespace) -> int:
    """``export --engine openvino``: an engine directory of fp32 OpenVINO IR, OpenVINO's own
    outputs checked against PyTorch (at several sizes with --dynamic-size)."""
    from vitkit.checkpoints import load_model
    from vitkit.engines.backends import read_engine_dir, require
    from vitkit.engines.openvino_export import OPENVINO_FILES, export_openvino
    from vitkit.output_files import check_destination

    require("openvino")
    model, ckpt = load_model(args.ckpt, **loading(args))
    sizes = export_sizes(args, ckpt.model_config)
    check_destination(args.out, reads=[ckpt.path], writes=OPENVINO_FILES, overwrite=args.overwrite)
    out = export_openvino(
        model, ckpt, args.out, sizes=sizes, features=args.feature_outputs,
        overwrite=args.overwrite,
    )  # fmt: skip
    info, _ = read_engine_dir(out)
    check = info["check"]
    print(f"wrote {out} (openvino, fp32): {', '.join(OPENVINO_FILES)}")
    print(
        f"openvino vs PyTorch: max relative difference {check['max_relative_error']:.2e} at "
        f"{', '.join(check['sizes'])}"
    )
    return 0


def _check_path(check: Any, text: str) -> None:
    try:
        check(text)
    except argparse.ArgumentTypeError as e:
        raise VitkitError(str(e)) from None
