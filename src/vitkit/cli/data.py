"""``vitkit shards``: a dataset written as webdataset tar shards."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from vitkit.cli.options import (
    add_bad_image,
    add_command,
    add_overwrite,
    byte_count,
    count,
    dataset,
    fraction_or_count,
    image_side,
    output_directory,
    positive_int,
    seed,
)
from vitkit.errors import VitkitError


def add_commands(sub: Any) -> None:
    p = add_command(
        sub,
        "shards",
        "write a dataset as webdataset tar shards (for streaming, multi-node training)",
        "Write SRC (mnist, digits, shapes, shapes-hard, an ImageFolder directory, a "
        "CIFAR-10/100 python download or a Hugging Face dataset saved with save_to_disk) as "
        "webdataset tar "
        "shards OUT/SPLIT-NNNNNN.tar plus OUT/shards.json; 'vitkit train --data OUT' then "
        "streams them. Files of an ImageFolder are copied as they are (no re-encoding); "
        "in-memory datasets are stored as PNG. Samples are shuffled before writing (a "
        "streaming reader only shuffles within its buffer).",
    )
    p.add_argument("src", metavar="SRC", type=dataset, help="dataset name or directory")
    p.add_argument(
        "out",
        metavar="OUT",
        type=shards_destination,
        help="output directory, or object storage: s3://BUCKET/PREFIX/ (credentials from the "
        "environment, as the storage's own tools find them)",
    )
    g = p.add_argument_group("data")
    g.add_argument(
        "--splits",
        help="comma-separated: train, val, test (default: all three, every image; train,test "
        "with --val-size 0)",
    )
    g.add_argument(
        "--val-size", type=fraction_or_count, help="held-out training images (count or fraction)"
    )
    g.add_argument("--seed", type=seed, default=0, help="chooses the val split and the order")
    g.add_argument("--image-size", type=image_side, help="built-in data: resize to this size first")
    g.add_argument("--data-root", help="mnist: directory with the IDX files")
    add_bad_image(g, default="stop")
    g = p.add_argument_group("shards")
    g.add_argument(
        "--shard-size", type=positive_int, default=10_000, help="samples per shard at most"
    )
    g.add_argument(
        "--max-shard-bytes",
        type=byte_count,
        default=1_000_000_000,
        help="bytes per shard at most (about)",
    )
    g.add_argument("--no-shuffle", action="store_true", help="keep the dataset's order")
    add_overwrite(p, "replace shards (and shards.json) already in OUT; other files stay")
    p.set_defaults(func=cmd_shards)


def shards_destination(text: str) -> str:
    """`vitkit shards`'s OUT: a directory to write into, or a URL in object storage."""
    from vitkit.data.shards_remote import is_remote

    return text if is_remote(text) else output_directory(text)


def cmd_shards(args: argparse.Namespace) -> int:
    from vitkit.data import shards_remote as remote
    from vitkit.data.shards_index import INDEX
    from vitkit.data.shards_write import write_dataset_shards
    from vitkit.output_files import check_destination

    if remote.is_remote(args.out):
        index = remote.join(args.out, INDEX)
        if remote.exists(index) and not args.overwrite:
            raise VitkitError(f"{index} exists; pass --overwrite to replace those shards")
        where = index
    else:
        out = Path(args.out)
        taken = [INDEX, *(p.name for p in out.glob("*.tar"))] if out.is_dir() else []
        reads = [args.src] if Path(args.src).is_dir() else []  # (an ImageFolder directory)
        check_destination(out, reads=reads, writes=taken, overwrite=args.overwrite)
        where = str(out / INDEX)
    counts = write_dataset_shards(
        args.src,
        args.out,
        None if args.splits is None else [s.strip() for s in args.splits.split(",") if s.strip()],
        shard_size=args.shard_size,
        max_shard_bytes=args.max_shard_bytes,
        val_size=args.val_size,
        seed=args.seed,
        shuffle=not args.no_shuffle,
        image_size=args.image_size,
        data_root=args.data_root,
        on_bad_image=args.on_bad_image,
        progress=True,
    )
    for split, c in counts.items():
        note = f" ({c['skipped']} unreadable files skipped)" if c["skipped"] else ""
        if c.get("held_out"):
            note += (
                f"; the {c['held_out']:,} images held out as the val split are in no shard "
                "(add val to --splits to write them)"
            )
        print(f"{split}: {count(c['samples'], 'sample')} in {count(c['shards'], 'shard')}{note}")
    print(f"wrote {where}; train with: vitkit train --data {args.out}")
    return 0
