"""Writing webdataset shards from any dataset vitkit reads (`write_shards` for one split,
`write_dataset_shards` for a dataset's splits and its ``shards.json``).

The images keep their encoded bytes (JPEG files from an ImageFolder are copied, not
re-encoded); in-memory datasets are stored as lossless PNG. Samples are named with consecutive
zero-padded keys, ``000000042.png`` + ``000000042.cls``, and shards are written reproducibly
(fixed member times and owners). The format and the index are `vitkit.data.shards_index`.
"""

from __future__ import annotations

import contextlib
import io
import os
import tarfile
import tempfile
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any, Literal, cast

import numpy as np
import torch
from PIL import Image

from vitkit.data import shards_remote as remote
from vitkit.data.arrays import ArrayDataset, DataInfo
from vitkit.data.datasets import Split, load_dataset
from vitkit.data.folder import _DECODE_ERRORS, ImageFolderDataset
from vitkit.data.shards_index import SPLITS, write_index
from vitkit.errors import VitkitError
from vitkit.output_files import writing

_KEY_DIGITS = 9


def _encode_png(image: torch.Tensor) -> bytes:
    array = image.numpy()
    pil = Image.fromarray(array[0] if array.shape[0] == 1 else np.transpose(array, (1, 2, 0)))
    out = io.BytesIO()
    pil.save(out, format="PNG")
    return out.getvalue()


def _samples_to_write(
    dataset: ArrayDataset | ImageFolderDataset, order: Sequence[int], on_bad_image: str
) -> Iterator[tuple[str, bytes, int] | None]:
    """(image extension, encoded bytes, label) per sample; None for a skipped bad file."""
    for i in order:
        if isinstance(dataset, ArrayDataset):
            yield "png", _encode_png(dataset.images[i]), int(dataset.labels[i])
            continue
        path, label = dataset.samples[i]
        try:
            data = path.read_bytes()
            with Image.open(io.BytesIO(data)) as img:
                img.verify()
        except _DECODE_ERRORS as e:
            if on_bad_image == "skip":
                yield None
                continue
            raise VitkitError(
                f"{path}: cannot decode image ({type(e).__name__}: {e}); pass --on-bad-image "
                "skip to leave such files out"
            ) from None
        ext = path.suffix.lower().lstrip(".")
        yield ("jpg" if ext == "jpeg" else ext), data, label


def _add(tar: tarfile.TarFile, name: str, data: bytes) -> None:
    member = tarfile.TarInfo(name)
    member.size = len(data)
    member.mtime = 0  # reproducible shards
    member.mode = 0o444
    member.uname = member.gname = "vitkit"
    tar.addfile(member, io.BytesIO(data))


def write_shards(
    dataset: ArrayDataset | ImageFolderDataset,
    out_dir: str | os.PathLike[str],
    split: str,
    *,
    shard_size: int = 10_000,
    max_shard_bytes: int = 1 << 30,
    shuffle: bool = True,
    seed: int = 0,
    on_bad_image: Literal["stop", "skip"] = "stop",
    progress: bool = False,
) -> tuple[list[dict[str, Any]], int]:
    """Write `dataset` as ``out_dir/SPLIT-NNNNNN.tar`` shards of at most `shard_size` samples
    and `max_shard_bytes` bytes; returns (the index entries, the number of skipped files).

    `shuffle` (default) writes the samples in a random order (seeded): a streaming reader only
    shuffles within its buffer, so shards in class order would give one-class batches.
    Each shard is written to a temporary name and renamed when complete; to object storage
    (`out_dir` a URL) it is written locally, uploaded whole, then deleted locally.
    """
    if shard_size < 1:
        raise VitkitError(f"shard size must be at least 1, got {shard_size}")
    upload_to = str(out_dir) if remote.is_remote(out_dir) else None
    with contextlib.ExitStack() as stack:  # an upload is staged in a temporary directory
        local = (
            Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="vitkit-shards-")))
            if upload_to is not None
            else Path(out_dir)
        )
        return _write_shards(
            dataset, local, split, shard_size, max_shard_bytes, shuffle, seed, on_bad_image,
            progress, upload_to,
        )  # fmt: skip


def _write_shards(
    dataset: ArrayDataset | ImageFolderDataset,
    out: Path,
    split: str,
    shard_size: int,
    max_shard_bytes: int,
    shuffle: bool,
    seed: int,
    on_bad_image: Literal["stop", "skip"],
    progress: bool,
    upload_to: str | None,
) -> tuple[list[dict[str, Any]], int]:
    out.mkdir(parents=True, exist_ok=True)
    n = len(dataset)
    g = torch.Generator().manual_seed(seed)
    order = torch.randperm(n, generator=g).tolist() if shuffle else list(range(n))
    from vitkit.progress import progress as progress_bar

    entries: list[dict[str, Any]] = []
    skipped = 0
    items = _samples_to_write(dataset, order, on_bad_image)
    held: tuple[str, bytes, int] | None = None  # the sample that did not fit the last shard
    key = 0
    with progress_bar(total=n, desc=f"{split} shards", enabled=progress) as bar:
        done = False
        while not done:
            final = out / f"{split}-{len(entries):06d}.tar"
            tmp = final.with_name(f".{final.name}.tmp-{os.getpid()}")
            count = size = 0
            with (
                writing(final, tmp),  # any failure removes tmp; no room is one line
                tarfile.open(tmp, "w", format=tarfile.USTAR_FORMAT) as tar,
            ):
                while count < shard_size:
                    item, held = held, None
                    if item is None:
                        read = next(items, "end")
                        if isinstance(read, str):  # "end"
                            done = True
                            break
                        bar.update(1)
                        if read is None:
                            skipped += 1
                            continue
                        item = read
                    ext, data, label = item
                    cls = str(label).encode()
                    grown = size + len(data) + len(cls) + 1024  # + two 512-byte headers
                    if count and grown > max_shard_bytes:
                        held = item
                        break
                    name = f"{key:0{_KEY_DIGITS}d}"
                    _add(tar, f"{name}.{ext}", data)
                    _add(tar, f"{name}.cls", cls)
                    count, size, key = count + 1, grown, key + 1
            if count == 0:
                tmp.unlink()
                break
            with writing(final, tmp):
                with open(tmp, "rb") as f:
                    os.fsync(f.fileno())
                os.replace(tmp, final)
            entries.append({"file": final.name, "samples": count, "bytes": final.stat().st_size})
            if upload_to is not None:
                remote.upload(final, remote.join(upload_to, final.name))
                final.unlink()
    return entries, skipped


def native_size(dataset: ArrayDataset | ImageFolderDataset) -> tuple[int, int] | None:
    """The stored size of an in-memory dataset's images (None: files of any size)."""
    return dataset.info.image_size if isinstance(dataset, ArrayDataset) else None


def write_dataset_shards(
    src: str | os.PathLike[str],
    out: str | os.PathLike[str],
    splits: Sequence[str] | None = None,
    *,
    shard_size: int = 10_000,
    max_shard_bytes: float = 1e9,
    val_size: int | float | None = None,
    seed: int = 0,
    shuffle: bool = True,
    image_size: int | None = None,
    data_root: str | os.PathLike[str] | None = None,
    on_bad_image: Literal["stop", "skip"] = "stop",
    progress: bool = False,
) -> dict[str, dict[str, int]]:
    """Write `splits` of the dataset `src` (a built-in name or an ImageFolder directory) as
    shards in `out`, then ``out/shards.json``; returns ``{split: {"samples", "shards",
    "skipped"}}`` (skipped: unreadable files left out with ``on_bad_image="skip"``).

    splits: default every image: train, val and test (no val with ``val_size=0``). When
    "train" is written without "val", the held-out val images are in no shard;
    ``counts["train"]["held_out"]`` says how many.

    val_size: the held-out "val" slice of the training set, a count (>= 1) or a fraction;
    seed: chooses that slice and the order of the samples (`shuffle`); image_size: built-in
    data is resized to it first; data_root: mnist's IDX directory. See `load_dataset` and
    `write_shards`; this is what ``vitkit shards`` writes.
    """
    if splits is None:
        splits = ("train", "test") if val_size == 0 else SPLITS
    for split in splits:
        if split not in SPLITS:
            raise VitkitError(f"unknown split '{split}': expected train, val or test")
    if not splits:
        raise VitkitError("no splits to write: expected train, val or test")
    if shard_size < 1 or max_shard_bytes < 1:
        raise VitkitError("--shard-size and --max-shard-bytes must be positive")
    kw: dict[str, Any] = {"seed": seed, "on_bad_image": on_bad_image}
    if val_size is not None:
        kw["val_size"] = int(val_size) if val_size >= 1 else val_size
    if data_root:
        kw["root"] = data_root
    written: dict[str, list[dict[str, Any]]] = {}
    counts: dict[str, dict[str, int]] = {}
    info: DataInfo | None = None
    size: tuple[int, int] | None = None
    for split in splits:
        dataset = load_dataset(
            src, cast(Split, split), image_size=image_size, train_transform=False, **kw
        )
        if not isinstance(dataset, ArrayDataset | ImageFolderDataset):
            raise VitkitError(f"{src}: already webdataset shards; nothing to write")
        info, size = dataset.info, native_size(dataset)
        entries, skipped = write_shards(
            dataset,
            out,
            split,
            shard_size=shard_size,
            max_shard_bytes=int(max_shard_bytes),
            shuffle=shuffle,
            seed=seed,
            on_bad_image=on_bad_image,
            progress=progress,
        )
        written[split] = entries
        samples = sum(e["samples"] for e in entries)
        counts[split] = {"samples": samples, "shards": len(entries), "skipped": skipped}
    assert info is not None
    write_index(out, info, written, size, source=str(src))
    if "train" in splits and "val" not in splits and val_size != 0:
        try:
            val = load_dataset(src, "val", image_size=image_size, train_transform=False, **kw)
        except VitkitError:  # (no val split after all: nothing was held out)
            return counts
        counts["train"]["held_out"] = len(val)
    return counts


__all__ = ["native_size", "write_dataset_shards", "write_shards"]
