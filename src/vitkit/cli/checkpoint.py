"""``vitkit convert``, ``inspect``, ``export``, ``consolidate`` and ``models``: checkpoint files
and the variant tables."""

from __future__ import annotations

import argparse
import json
from typing import Any

from vitkit.cli.export import add_export_command
from vitkit.cli.options import (
    add_checkpoint,
    add_command,
    image_side,
    image_size,
    non_negative_int,
    output_directory,
    path,
    positive_int,
    reading,
)
from vitkit.registry.config_checks import RESAMPLE_MODES


def add_commands(sub: Any) -> None:
    p = add_command(
        sub,
        "models",
        "the variant tables (ViTs, hybrids, BiT, the ViT family) with parameters and GFLOPs",
    )
    p.add_argument("--image-size", type=image_side, default=224, help="input resolution")
    p.add_argument(
        "--num-classes", type=non_negative_int, default=1000, help="classes of the head (0: none)"
    )
    p.add_argument(
        "--all-sizes", metavar="PATCH", type=positive_int, help="every size at this patch"
    )
    p.set_defaults(func=cmd_models)

    p = add_command(
        sub,
        "convert",
        "convert a checkpoint between vitkit, timm, Hugging Face and Google .npz",
        "Read SRC (any supported format, detected), optionally move it to another resolution "
        "(2-D position-embedding resampling) or head, and write DST.",
    )
    p.add_argument("src", metavar="SRC", type=path, help="checkpoint file or directory")
    p.add_argument(
        "dst",
        metavar="DST",
        type=path,
        help="output: a directory, or a .npz / .safetensors / .pth file",
    )
    p.add_argument(
        "--to", required=True, choices=("vitkit", "timm", "hf", "npz"), help="output format"
    )
    add_checkpoint(p, formats=True, source=False)
    g = p.add_argument_group("changes")
    g.add_argument(
        "--image-size", type=image_side, nargs="+", metavar="N", help="new resolution (H [W])"
    )
    g.add_argument(
        "--resample",
        choices=RESAMPLE_MODES,
        help="position-embedding interpolation (default: the checkpoint's source's kernel, "
        "timm's bicubic-antialias, Hugging Face's class's, else bicubic); 'zoom' = the "
        "official scipy.ndimage.zoom(order=1)",
    )
    g.add_argument(
        "--num-classes",
        type=non_negative_int,
        help="replace the head (zero-initialised; 0: no head)",
    )
    g.add_argument(
        "--drop-pre-logits",
        action="store_true",
        help="drop the tanh pre-logits layer (puts in a new zero head), as the paper fine-tunes",
    )
    g.add_argument(
        "--hf-naming",
        default="4",
        choices=("4", "5"),
        help="Hugging Face key names: 4.x (loads in transformers 4 and 5) or 5.x",
    )
    p.add_argument(
        "--overwrite",
        action="store_true",
        help="write into an existing DST (even the run read, never into its checkpoints): "
        "replaces only the files convert writes, keeps everything else",
    )
    p.set_defaults(func=cmd_convert)

    p = add_command(
        sub,
        "inspect",
        "what a checkpoint holds: format, architecture, parameters, classes, resolution",
    )
    add_checkpoint(p, positional=True, formats=True)
    p.add_argument("--json", action="store_true", help="print JSON")
    p.set_defaults(func=cmd_inspect)

    add_export_command(sub)

    p = add_command(
        sub,
        "consolidate",
        "a distributed (sharded) checkpoint as one single-file vitkit checkpoint",
        "Gather the weights of a distributed checkpoint (or a run directory: its latest) into "
        "a vitkit checkpoint directory (model.safetensors + config.json) that eval, predict "
        "and Python's vitkit.load_model read anywhere. Runs in one process.",
    )
    p.add_argument("src", metavar="SRC", type=path, help="checkpoint or run directory")
    p.add_argument("out", metavar="OUT", type=output_directory, help="the new checkpoint directory")
    p.add_argument(
        "--overwrite",
        action="store_true",
        help="write into an existing OUT: replaces only the files written, keeps everything else",
    )
    p.set_defaults(func=cmd_consolidate)


def cmd_convert(args: argparse.Namespace) -> int:
    from vitkit.checkpoints import read_checkpoint, write_checkpoint

    ckpt = read_checkpoint(
        args.src,
        **reading(args),
        image_size=image_size(args.image_size),
        num_classes=args.num_classes,
        pre_logits=False if args.drop_pre_logits else None,
        resample=args.resample,
    )
    out = write_checkpoint(
        ckpt,
        args.dst,
        args.to,
        hf_naming=args.hf_naming,
        source=args.src,
        overwrite=args.overwrite,
    )
    cfg = ckpt.model_config
    print(
        f"{args.src} ({ckpt.format}) -> {out} ({args.to}): {cfg.short_name}, "
        f"{cfg.image_size[0]}x{cfg.image_size[1]} px, {cfg.num_classes} classes"
    )
    return 0


def cmd_inspect(args: argparse.Namespace) -> int:
    from vitkit.engines.exports import read_export

    exported = read_export(args.ckpt)
    if exported is not None:  # an ONNX file, a .pt2 package, an engine directory
        from vitkit.engines.export_record import describe_export

        print(json.dumps(exported, indent=1) if args.json else describe_export(exported, args.ckpt))
        return 0
    from vitkit.checkpoints import describe, read_checkpoint
    from vitkit.checkpoints.description import format_description

    info = describe(read_checkpoint(args.ckpt, **reading(args)))
    print(json.dumps(info, indent=1) if args.json else format_description(info))
    return 0


def cmd_consolidate(args: argparse.Namespace) -> int:
    from vitkit.checkpoints.native.sharded import consolidate_checkpoint

    path = consolidate_checkpoint(args.src, args.out, overwrite=args.overwrite)
    print(f"wrote {path}")
    return 0


def cmd_models(args: argparse.Namespace) -> int:
    from vitkit.registry.counts import count_flops, count_params
    from vitkit.registry.model_config import (
        HYBRIDS,
        SIZES,
        STANDARD_MODELS,
        STANDARD_RESNETS,
        ViTConfig,
        model_config,
    )

    names = [f"{s}/{args.all_sizes}" for s in SIZES] if args.all_sizes else STANDARD_MODELS
    print(f"at {args.image_size} px, {args.num_classes} classes; GFLOPs = 2 x multiply-adds")
    header = f"{'model':<8}{'name':<10}{'width':>6}{'depth':>6}{'heads':>6}{'mlp':>6}"
    print(header + f"{'tokens':>8}{'params':>14}{'GFLOPs':>9}")
    for name in names:
        cfg = model_config(name, image_size=args.image_size, num_classes=args.num_classes)
        assert isinstance(cfg, ViTConfig)
        size, patch = name.split("/")
        print(
            f"{name:<8}{'vit_' + size.lower() + patch:<10}{cfg.width:>6}{cfg.depth:>6}"
            f"{cfg.num_heads:>6}{cfg.mlp_dim:>6}{cfg.seq_len:>8}{count_params(cfg):>14,}"
            f"{count_flops(cfg) / 1e9:>9.2f}"
        )
    size_px = dict(image_size=args.image_size, num_classes=args.num_classes)
    tail = f"{'params':>14}{'GFLOPs':>9}"
    print("\nhybrids (paper Sec. 3.1; vit_jax names): ResNet stages + ViT on its feature map")
    print(f"{'name':<14}{'model':<22}{'tokens':>8}{tail}")
    for name in HYBRIDS:
        cfg = model_config(name, **size_px)
        assert isinstance(cfg, ViTConfig)
        print(f"{name:<14}{cfg.short_name:<22}{cfg.seq_len:>8}{_cost(cfg)}")
    print("\nBiT ResNet-v2 baselines (any depth: -o layers=1,1,1; width: bit_r50x3)")
    print(f"{'name':<14}{'model':<22}{'features':>8}{tail}")
    for name in STANDARD_RESNETS:
        cfg = model_config(name, **size_px)
        print(f"{name:<14}{cfg.short_name:<22}{cfg.feature_dim:>8}{_cost(cfg)}")
    _print_families()
    return 0


def _print_families() -> None:
    """The family's named models (vitkit.registry.families) at their own size and head, as
    timm's."""
    from vitkit.registry.families import FAMILIES, family_of
    from vitkit.registry.model_config import ViTConfig, model_config

    print("\nthe ViT family (timm's names, each at its own size and head: counts equal timm's)")
    print(f"{'name':<38}{'family':<9}{'size':<21}{'px':>4}{'tokens':>7}{'params':>14}{'GFLOPs':>9}")
    for name in FAMILIES:
        cfg = model_config(name)
        assert isinstance(cfg, ViTConfig)
        print(
            f"{name:<38}{family_of(name):<9}{cfg.short_name:<21}{cfg.image_size[0]:>4}"
            f"{cfg.seq_len:>7}{_cost(cfg)}"
        )


def _cost(cfg: Any) -> str:
    from vitkit.registry.counts import count_flops, count_params

    return f"{count_params(cfg):>14,}{count_flops(cfg) / 1e9:>9.2f}"
