"""``vitkit shards``: a dataset written as webdataset tar shards."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from vitkit.cli.options import add_bad_image, add_command
from vitkit.errors import VitkitError


def add_commands(sub: Any) -> None:
    p = add_command(
        sub,
        "shards",
        "write a dataset as webdataset tar shards (for streaming, multi-node training)",
        "Write SRC (mnist, digits, shapes or an ImageFolder directory) as webdataset tar "
        "shards OUT/SPLIT-NNNNNN.tar plus OUT/shards.json; 'vitkit train --data OUT' then "
        "streams them. Files of an ImageFolder are copied as they are (no re-encoding); "
        "in-memory datasets are stored as PNG. Samples are shuffled before writing (a "
        "streaming reader only shuffles within its buffer).",
    )
    p.add_argument("src", metavar="SRC", help="dataset name or ImageFolder directory")
    p.add_argument("out", metavar="OUT", help="output directory")
    g = p.add_argument_group("data")
    g.add_argument("--splits", default="train,test", help="comma-separated: train, val, test")
    g.add_argument("--val-size", type=float, help="held-out training images (count or fraction)")
    g.add_argument("--seed", type=int, default=0, help="chooses the val split and the order")
    g.add_argument("--image-size", type=int, help="built-in data: resize to this size first")
    g.add_argument("--data-root", help="mnist: directory with the IDX files")
    add_bad_image(g, default="stop")
    g = p.add_argument_group("shards")
    g.add_argument("--shard-size", type=int, default=10_000, help="samples per shard at most")
    g.add_argument(
        "--max-shard-bytes", type=float, default=1e9, help="bytes per shard at most (about)"
    )
    g.add_argument("--no-shuffle", action="store_true", help="keep the dataset's order")
    p.set_defaults(func=cmd_shards)


def cmd_shards(args: argparse.Namespace) -> int:
    from vitkit.data import load_dataset
    from vitkit.data.shards import INDEX, native_size, write_index, write_shards

    splits = [s.strip() for s in args.splits.split(",") if s.strip()]
    for split in splits:
        if split not in ("train", "val", "test"):
            raise VitkitError(f"unknown split '{split}': expected train, val or test")
    if args.shard_size < 1 or args.max_shard_bytes < 1:
        raise VitkitError("--shard-size and --max-shard-bytes must be positive")
    kw: dict[str, Any] = {"seed": args.seed, "on_bad_image": args.on_bad_image}
    if args.val_size is not None:
        kw["val_size"] = int(args.val_size) if args.val_size >= 1 else args.val_size
    if args.data_root:
        kw["root"] = args.data_root
    written: dict[str, list[dict[str, Any]]] = {}
    info = size = None
    for split in splits:
        dataset = load_dataset(
            args.src, split, image_size=args.image_size, train_transform=False, **kw
        )
        info, size = dataset.info, native_size(dataset)
        entries, skipped = write_shards(
            dataset,
            args.out,
            split,
            shard_size=args.shard_size,
            max_shard_bytes=int(args.max_shard_bytes),
            shuffle=not args.no_shuffle,
            seed=args.seed,
            on_bad_image=args.on_bad_image,
            progress=True,
        )
        written[split] = entries
        n = sum(e["samples"] for e in entries)
        note = f" ({skipped} unreadable files skipped)" if skipped else ""
        print(f"{split}: {n:,} samples in {len(entries)} shards{note}")
    assert info is not None
    write_index(args.out, info, written, size, source=str(args.src))
    print(f"wrote {Path(args.out) / INDEX}; train with: vitkit train --data {args.out}")
    return 0
