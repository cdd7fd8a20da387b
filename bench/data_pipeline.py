"""Data-pipeline throughput: decoded + augmented images/s, ImageFolder JPEGs vs webdataset shards.

Writes a synthetic ImageFolder of JPEGs of ImageNet's typical size (500x375, quality 90, about
100 kB: smooth gradients plus noise, so they compress like photos), copies them into webdataset
shards with ``write_shards`` (the same JPEG bytes), then reads both through vitkit's loaders with
the training transform (Inception crop to 224 + flip, as ``vitkit train`` does): decode, crop,
resize, flip, to uint8 tensors, collate. Settings are interleaved round by round so that noise
from other jobs on the machine hits all of them alike; medians are reported, as images/s in
total and per worker (0 workers: the training process does the work, counted as one).

    python bench/data_pipeline.py                         # 512 images, workers 0,1,2, 3 rounds
    python bench/data_pipeline.py --images 2048 --workers 0,4,8 --rounds 5
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import numpy as np  # noqa: E402
import torch  # noqa: E402
from PIL import Image  # noqa: E402

from vitkit.data import load_dataset, make_loader, write_shards  # noqa: E402
from vitkit.data.shards_index import write_index  # noqa: E402


def write_jpeg_folder(root: Path, n: int, classes: int, size: tuple[int, int], seed: int) -> int:
    """`n` JPEGs in `classes` folders; returns their total size in bytes."""
    rng = np.random.default_rng(seed)
    w, h = size
    yy, xx = np.mgrid[0:h, 0:w].astype(np.float32)
    total = 0
    for i in range(n):
        d = root / f"class{i % classes:03d}"
        d.mkdir(parents=True, exist_ok=True)
        phase = rng.uniform(0, 2 * np.pi, 3)
        freq = rng.uniform(0.005, 0.03, 3)
        base = np.stack(
            [127 + 100 * np.sin(freq[c] * (xx + 0.7 * yy) + phase[c]) for c in range(3)], -1
        )
        noisy = base + rng.normal(0, 12, base.shape)
        img = Image.fromarray(np.clip(noisy, 0, 255).astype(np.uint8))
        path = d / f"{i:06d}.jpg"
        img.save(path, quality=90)
        total += path.stat().st_size
    return total


def images_per_s(dataset, batch: int, workers: int, epoch: int) -> float:
    loader = make_loader(dataset, batch, shuffle=True, drop_last=True, seed=0, num_workers=workers)
    loader.set_epoch(epoch)
    t = time.perf_counter()
    n = sum(len(labels) for _, labels, _ in loader)
    return n / (time.perf_counter() - t)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--images", type=int, default=512)
    p.add_argument("--classes", type=int, default=8)
    p.add_argument("--image-size", type=int, default=224, help="training crop size")
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--workers", default="0,1,2", help="comma-separated DataLoader workers")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--shard-size", type=int, default=128)
    p.add_argument("--out", default="bench/results")
    args = p.parse_args()
    torch.set_num_threads(1)

    with tempfile.TemporaryDirectory() as tmp:
        folder, shards = Path(tmp) / "folder", Path(tmp) / "shards"
        jpeg_bytes = write_jpeg_folder(folder, args.images, args.classes, (500, 375), seed=0)
        kw = {"image_size": args.image_size, "train_transform": True}
        folder_set = load_dataset(str(folder), "train", **kw)
        # Shards of the same training images (the same JPEG bytes, copied).
        entries, _ = write_shards(folder_set, shards, "train", shard_size=args.shard_size)
        write_index(shards, folder_set.info, {"train": entries}, None, source=str(folder))
        shard_set = load_dataset(str(shards), "train", **kw)
        assert len(shard_set) == len(folder_set)
        sources = {"imagefolder": folder_set, "webdataset": shard_set}
        workers = [int(w) for w in args.workers.split(",")]
        settings = [(name, w) for w in workers for name in sources]
        results: dict[tuple[str, int], list[float]] = {s: [] for s in settings}
        for r in range(args.rounds):
            for name, w in settings:
                results[(name, w)].append(images_per_s(sources[name], args.batch_size, w, r))
            print(f"round {r + 1}/{args.rounds} done", file=sys.stderr, flush=True)

    rows = []
    for (name, w), values in results.items():
        med = statistics.median(values)
        rows.append(
            {
                "source": name,
                "workers": w,
                "images_per_s": med,
                "images_per_s_per_worker": med / max(w, 1),
                "all_images_per_s": values,
            }
        )
    result = {
        "images": len(folder_set),
        "jpeg_kb_mean": jpeg_bytes / args.images / 1e3,
        "source_size": [500, 375],
        "crop": args.image_size,
        "batch_size": args.batch_size,
        "transform": "PilTrainTransform (Inception crop + flip), uint8 tensors, collated",
        "torch": torch.__version__,
        "pillow": Image.__version__,
        "machine": platform.processor() or platform.machine(),
        "cpu_count": os.cpu_count(),
        "rounds": args.rounds,
        "rows": rows,
    }
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "data_pipeline.json").write_text(json.dumps(result, indent=1))
    lines = [
        f"Data pipeline: {len(folder_set)} JPEGs of 500x375 (mean "
        f"{result['jpeg_kb_mean']:.0f} kB) decoded + Inception-cropped to {args.image_size} + "
        f"flipped + collated, batch {args.batch_size}; median of {args.rounds} rounds, "
        f"{os.cpu_count()} CPUs (shared)",
        "",
        "| source | workers | images/s | images/s per worker |",
        "| --- | ---: | ---: | ---: |",
    ]
    for r in rows:
        lines.append(
            f"| {r['source']} | {r['workers']} | {r['images_per_s']:.0f} | "
            f"{r['images_per_s_per_worker']:.0f} |"
        )
    table = "\n".join(lines) + "\n"
    (out / "data_pipeline.md").write_text(table)
    print(table)


if __name__ == "__main__":
    main()
