"""Webdataset tar shards: writing them from any dataset vitkit reads, and streaming them.

A shard is a plain POSIX tar file in the webdataset convention: the files of one sample are
consecutive and share a *key* (the path up to the first dot of the file name), their extension
says what they hold, e.g. ``000000042.png`` + ``000000042.cls`` (the label as ASCII digits).
Shards written by the ``webdataset`` package (``ShardWriter``/``TarWriter``) or by ``tar`` itself
read the same way. The images keep their encoded bytes (JPEG files from an ImageFolder are
copied, not re-encoded); in-memory datasets are stored as lossless PNG.

A shard directory written by vitkit (``vitkit shards SRC OUT``) holds ``SPLIT-NNNNNN.tar`` files
and ``shards.json``: the class names, channels, native image size and the sample count of every
shard, so that a reader knows each rank's share of an epoch without opening a shard. A directory
of tar files without ``shards.json`` (written elsewhere) is indexed by reading it once.

Streaming (`ShardLoader`): each rank reads its own shards (shard i goes to rank i mod
world_size, a fixed assignment, so each rank's share has the same size every epoch), and each
DataLoader worker of that rank reads every num_workers-th of them; the shard order and a shuffle
buffer (as webdataset's ``.shuffle(n)``) are seeded by (seed, epoch, rank, worker). Workers send
collated chunks of consecutive samples (one transfer per chunk, not one per image), and the
training process cuts the rank's stream into batches, so an epoch has the same number of
batches whatever the number of workers: ``min over ranks of (samples of the rank) // batch_size``
for training (every rank takes the same number of steps; the remainder of a rank's stream is
dropped for that epoch), and all of the rank's samples for evaluation. Within an epoch no
sample is read twice; when the shards split evenly over the ranks every sample is read exactly
once.
"""

from __future__ import annotations

import io
import json
import math
import os
import posixpath
import random
import re
import sys
import tarfile
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import numpy as np
import torch
from PIL import Image
from torch.utils.data import DataLoader, IterableDataset, get_worker_info

from vitkit.data.arrays import ArrayDataset, DataInfo
from vitkit.data.folder import _DECODE_ERRORS, ImageFolderDataset, collate_skipping
from vitkit.errors import VitkitError

INDEX = "shards.json"
FORMAT = "vitkit-shards"
IMAGE_KEYS = ("jpg", "jpeg", "png", "webp", "ppm", "pgm", "pbm", "bmp", "tif", "tiff", "gif")
LABEL_KEYS = ("cls", "cls2", "class", "label")
SPLITS = ("train", "val", "test")
_KEY_DIGITS = 9

Batch = tuple[torch.Tensor, torch.Tensor, int]


# --- the index ------------------------------------------------------------------------------


@dataclass(frozen=True)
class ShardFile:
    path: Path
    samples: int


def is_shard_dir(spec: str | os.PathLike[str]) -> bool:
    """True for a directory written by `write_shards` or holding webdataset ``.tar`` files."""
    p = Path(spec)
    return p.is_dir() and ((p / INDEX).is_file() or any(p.glob("*.tar")))


def read_index(root: str | os.PathLike[str]) -> dict[str, Any]:
    """The shard index of `root`: ``shards.json`` if present, else built by reading the tars."""
    root = Path(root)
    path = root / INDEX
    if not path.is_file():
        return _index_foreign(root)
    try:
        index = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise VitkitError(f"{path}: unreadable shard index ({e})") from None
    if not isinstance(index, dict) or index.get("format") != FORMAT:
        raise VitkitError(f"{path}: not a vitkit shard index (no format: {FORMAT})")
    for key in ("class_names", "channels", "splits"):
        if key not in index:
            raise VitkitError(f"{path}: shard index lacks '{key}'")
    return index


def shard_splits(root: str | os.PathLike[str]) -> tuple[str, ...]:
    return tuple(read_index(root)["splits"])


def _split_of(name: str) -> str:
    """The split a foreign shard's file name says it belongs to (default: train)."""
    stem = name.lower()
    for split in SPLITS:
        if re.match(rf"^{split}(ing|ation)?[-_.]", stem) or stem == f"{split}.tar":
            return split
    if re.match(r"^valid[-_.]", stem):
        return "val"
    return "train"


def _index_foreign(root: Path) -> dict[str, Any]:
    """Index a directory of webdataset tars written elsewhere (reads every shard once)."""
    splits: dict[str, list[dict[str, Any]]] = {}
    max_label = -1
    for path in sorted(root.glob("*.tar")):
        count = 0
        for sample in iter_tar_samples(path):
            if _image_entry(sample) is None:
                continue
            max_label = max(max_label, _label_of(sample, path))
            count += 1
        splits.setdefault(_split_of(path.name), []).append({"file": path.name, "samples": count})
    if not splits:
        raise VitkitError(f"{root}: no .tar shards")
    return {
        "format": FORMAT,
        "name": str(root.resolve()),
        "class_names": [str(i) for i in range(max_label + 1)],
        "channels": 3,
        "image_size": None,
        "allow_flip": True,
        "splits": splits,
    }


# --- reading tar files ----------------------------------------------------------------------


def iter_tar_samples(path: str | os.PathLike[str]) -> Iterator[dict[str, Any]]:
    """The samples of a webdataset tar in file order: ``{"__key__": key, ext: bytes, ...}``.

    As webdataset: the key is the member's path up to the first dot of its file name and the
    extension (lower-cased) is the rest; consecutive members with one key form one sample.
    Directories, hidden files and names without an extension are ignored.
    """
    current: dict[str, Any] | None = None
    try:
        with tarfile.open(path, "r|*") as tar:
            for member in tar:
                if not member.isfile():
                    continue
                dirname, base = posixpath.split(member.name)
                if base.startswith(".") or "." not in base:
                    continue
                stem, ext = base.split(".", 1)
                key = posixpath.join(dirname, stem)
                f = tar.extractfile(member)
                data = f.read() if f is not None else b""
                if current is None or current["__key__"] != key:
                    if current is not None:
                        yield current
                    current = {"__key__": key, "__url__": str(path)}
                current[ext.lower()] = data
    except (tarfile.TarError, EOFError, OSError) as e:
        raise VitkitError(f"{path}: unreadable tar shard ({type(e).__name__}: {e})") from None
    if current is not None:
        yield current


def _image_entry(sample: dict[str, Any]) -> bytes | None:
    for key in IMAGE_KEYS:
        if key in sample:
            return sample[key]
    return None


def _label_of(sample: dict[str, Any], path: str | os.PathLike[str]) -> int:
    for key in LABEL_KEYS:
        if key in sample:
            try:
                return int(sample[key].decode().strip())
            except (UnicodeDecodeError, ValueError):
                break
    if "json" in sample:
        try:
            meta = json.loads(sample["json"])
            if isinstance(meta, dict) and "label" in meta:
                return int(meta["label"])
        except (ValueError, TypeError):
            pass
    raise VitkitError(
        f"{path}: sample '{sample['__key__']}' has no integer label (.cls, or .json with 'label')"
    )


def _shuffled(items: Iterable[Any], size: int, rng: random.Random) -> Iterator[Any]:
    """A shuffle buffer of `size` items (as webdataset's ``.shuffle``): yields a random
    buffered item for every item read once the buffer is full, then the rest in random order."""
    buf: list[Any] = []
    for item in items:
        buf.append(item)
        if len(buf) >= size:
            i = rng.randrange(len(buf))
            buf[i], buf[-1] = buf[-1], buf[i]
            yield buf.pop()
    rng.shuffle(buf)
    yield from buf


# --- the dataset ----------------------------------------------------------------------------


class ShardDataset:
    """One split of a shard directory: its shard files, `info`, and the per-sample transform.

    Iterate it through a `ShardLoader` (`make_loader` builds one); `len()` is the sample count.
    """

    def __init__(
        self,
        shards: Sequence[ShardFile],
        info: DataInfo,
        transform: Any,
        on_bad_image: Literal["stop", "skip"] = "stop",
    ) -> None:
        if not shards:
            raise VitkitError(f"{info.name}: no shards")
        self.shards = list(shards)
        self.info = info
        self.transform = transform
        self.on_bad_image = on_bad_image

    def __len__(self) -> int:
        return sum(s.samples for s in self.shards)

    def rank_shards(self, rank: int, world_size: int) -> list[ShardFile]:
        return self.shards[rank::world_size]

    def rank_samples(self, rank: int, world_size: int) -> int:
        return sum(s.samples for s in self.rank_shards(rank, world_size))

    def decode(self, sample: dict[str, Any]) -> tuple[torch.Tensor, int] | None:
        """A raw sample -> (uint8 [C, H, W], label); None for a bad image with 'skip'."""
        where = f"{sample.get('__url__', '?')}: sample '{sample['__key__']}'"
        data = _image_entry(sample)
        if data is None:
            raise VitkitError(f"{where} has no image ({', '.join(IMAGE_KEYS)})")
        label = _label_of(sample, sample.get("__url__", "?"))
        if not 0 <= label < self.info.num_classes:
            raise VitkitError(f"{where} has label {label}, outside [0, {self.info.num_classes})")
        mode = "L" if self.info.channels == 1 else "RGB"
        try:
            with Image.open(io.BytesIO(data)) as img:
                if img.mode == "P" and "transparency" in img.info:
                    img = img.convert("RGBA")
                img = img.convert(mode)
        except _DECODE_ERRORS as e:
            if self.on_bad_image == "skip":
                return None
            reason = " ".join(f"{type(e).__name__}: {e}".split())
            raise VitkitError(
                f"{where}: cannot decode image ({reason}); pass --on-bad-image skip to skip "
                "such samples"
            ) from e
        return self.transform(img), label

    def __repr__(self) -> str:
        return f"ShardDataset({self.info.name!r}, shards={len(self.shards)}, n={len(self)})"


class _RankStream(IterableDataset):
    """The samples of one rank in one epoch, split over the DataLoader's workers.

    `epoch` and `skip` live in shared memory so persistent workers see `set_epoch`.
    """

    def __init__(
        self, dataset: ShardDataset, shuffle: bool, seed: int, rank: int, world: int, buf: int
    ) -> None:
        self.dataset = dataset
        self.shuffle = shuffle
        self.seed = seed
        self.rank = rank
        self.world = world
        self.buffer = buf
        self.chunk = 1  # samples per item a worker sends (the loader sets its batch size)
        self.state = torch.zeros(2, dtype=torch.int64).share_memory_()  # epoch, samples to skip

    def worker_samples(self, worker: int, num_workers: int, epoch: int) -> Iterator[dict]:
        shards = self.dataset.rank_shards(self.rank, self.world)
        if self.shuffle:
            g = torch.Generator().manual_seed(_seed(self.seed, epoch, self.rank, -1))
            shards = [shards[i] for i in torch.randperm(len(shards), generator=g).tolist()]
        mine = shards[worker::num_workers]
        samples: Iterable[dict] = (s for shard in mine for s in iter_tar_samples(shard.path))
        if self.shuffle and self.buffer > 1:
            rng = random.Random(_seed(self.seed, epoch, self.rank, worker))
            samples = _shuffled(samples, self.buffer, rng)
        return samples

    def __iter__(self) -> Iterator[Chunk]:
        """Chunks of up to `chunk` consecutive samples of this worker's stream, collated: one
        transfer per chunk instead of one shared-memory tensor per image."""
        info = get_worker_info()
        worker, num_workers = (info.id, info.num_workers) if info is not None else (0, 1)
        epoch, skip = (int(v) for v in self.state.tolist())
        decoded: list[tuple[torch.Tensor, int] | None] = []
        for i, sample in enumerate(self.worker_samples(worker, num_workers, epoch)):
            if i < skip:  # (only set with num_workers=0: one stream, skipped undecoded)
                continue
            if _image_entry(sample) is None:
                continue  # e.g. a metadata-only member group
            decoded.append(self.dataset.decode(sample))
            if len(decoded) == self.chunk:
                yield _chunk(decoded)
                decoded = []
        if decoded:
            yield _chunk(decoded)


Chunk = tuple[torch.Tensor, torch.Tensor, torch.Tensor]  # images, labels, present [n] (bool)


def _chunk(samples: list[tuple[torch.Tensor, int] | None]) -> Chunk:
    images, labels, _ = collate_skipping(samples)
    return images, labels, torch.tensor([s is not None for s in samples])


def _unchunk(chunk: Chunk) -> Iterator[tuple[torch.Tensor, int] | None]:
    images, labels, present = chunk
    k = 0
    for here in present.tolist():
        if here:
            yield images[k], int(labels[k])
            k += 1
        else:
            yield None


def _seed(seed: int, epoch: int, rank: int, worker: int) -> int:
    return (seed * 1_000_003 + epoch * 7919 + rank * 104_729 + (worker + 1) * 15_485_863) % 2**63


def _identity(x: Any) -> Any:
    return x


class ShardLoader:
    """An `EpochLoader` over a `ShardDataset`: batches of `(uint8 images, labels, n_skipped)`.

    See the module docstring for how shards are split over ranks and workers and how long an
    epoch is. `batch_size` is per rank.
    """

    def __init__(
        self,
        dataset: ShardDataset,
        batch_size: int,
        *,
        shuffle: bool,
        drop_last: bool,
        seed: int,
        rank: int = 0,
        world_size: int = 1,
        num_workers: int = 0,
        pin_memory: bool = False,
        persistent_workers: bool = False,
        prefetch_factor: int | None = None,
        shuffle_buffer: int = 1000,
    ) -> None:
        if batch_size <= 0:
            raise ValueError(f"batch_size must be positive, not {batch_size}")
        self.dataset = dataset
        self.batch_size = batch_size
        self.drop_last = drop_last
        self.seed = seed
        self.rank = rank
        self.world_size = world_size
        self.num_workers = num_workers
        self.pin_memory = pin_memory and torch.cuda.is_available()
        self.epoch = 0
        self.stream = _RankStream(dataset, shuffle, seed, rank, world_size, shuffle_buffer)
        self.stream.chunk = batch_size
        if drop_last and len(dataset.shards) < world_size:
            raise VitkitError(
                f"{dataset.info.name}: {len(dataset.shards)} shards for {world_size} ranks; "
                "write more, smaller shards (vitkit shards --shard-size)"
            )
        kwargs: dict[str, Any] = {}
        if num_workers > 0:
            kwargs = {"persistent_workers": persistent_workers, "prefetch_factor": prefetch_factor}
        self.generator = torch.Generator()
        self.loader = DataLoader(
            self.stream,
            batch_size=None,
            num_workers=num_workers,
            collate_fn=_identity,
            generator=self.generator,  # seeds the workers' generators (PIL augmentation)
            **kwargs,
        )
        self.set_epoch(0)

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch
        self.stream.state[0] = epoch
        self.generator.manual_seed(_seed(self.seed, epoch, self.rank, -2))

    def __len__(self) -> int:
        if self.drop_last:  # the same on every rank: the smallest share decides
            ranks = range(self.world_size)
            return min(self.dataset.rank_samples(r, self.world_size) for r in ranks) // (
                self.batch_size
            )
        return math.ceil(self.dataset.rank_samples(self.rank, self.world_size) / self.batch_size)

    def __iter__(self) -> Iterator[Batch]:
        return self.iter_from(0)

    def iter_from(self, batch_index: int) -> Iterator[Batch]:
        """The batches of the epoch from `batch_index` on. Without workers the skipped samples
        are not decoded; with workers they are (each worker's augmentation stays in step)."""
        skip_samples = batch_index * self.batch_size if self.num_workers == 0 else 0
        self.stream.state[1] = skip_samples
        skip_batches = 0 if self.num_workers == 0 else batch_index
        return self._batches(batch_index, skip_batches)

    def _batches(self, first: int, skip_batches: int) -> Iterator[Batch]:
        total = len(self)
        if first >= total:
            return
        b = first
        pending: list[tuple[torch.Tensor, int] | None] = []
        try:
            for sample in (s for chunk in self.loader for s in _unchunk(chunk)):
                pending.append(sample)
                if len(pending) < self.batch_size:
                    continue
                batch, pending = pending, []
                if skip_batches:
                    skip_batches -= 1
                    continue
                yield self._collate(batch)
                b += 1
                if b >= total:
                    return
            if pending and not self.drop_last and not skip_batches:
                yield self._collate(pending)
        finally:
            self.stream.state[1] = 0

    def _collate(self, samples: list[tuple[torch.Tensor, int] | None]) -> Batch:
        images, labels, skipped = collate_skipping(samples)
        if self.pin_memory:
            images, labels = images.pin_memory(), labels.pin_memory()
        return images, labels, skipped


# --- loading a split ------------------------------------------------------------------------


def load_shards(
    root: str | os.PathLike[str],
    split: str,
    *,
    image_size: int | tuple[int, int] | None,
    channels: int | None,
    transform: Any,
    on_bad_image: Literal["stop", "skip"] = "stop",
) -> ShardDataset:
    """`split` of a shard directory. `transform` maps a PIL image to uint8 [C, H, W] of
    `image_size` (the caller builds it from the returned size; see `shard_info`)."""
    root = Path(root)
    index = read_index(root)
    if split not in index["splits"]:
        raise VitkitError(
            f"{root}: no '{split}' shards (splits: {', '.join(index['splits'])}); write them "
            f"with vitkit shards SRC {root} --splits ..."
        )
    shards = []
    for entry in index["splits"][split]:
        path = root / entry["file"]
        if not path.is_file():
            raise VitkitError(f"{path}: shard listed in {root / INDEX} is missing")
        shards.append(ShardFile(path, int(entry["samples"])))
    info = shard_info(root, index, image_size, channels)
    return ShardDataset(shards, info, transform, on_bad_image)


def shard_info(
    root: Path,
    index: dict[str, Any],
    image_size: int | tuple[int, int] | None,
    channels: int | None,
    default_size: int = 224,
) -> DataInfo:
    size = image_size if image_size is not None else index.get("image_size") or default_size
    h, w = (size, size) if isinstance(size, int) else size
    names = tuple(str(c) for c in index["class_names"])
    return DataInfo(
        name=str(root.resolve()),  # what a checkpoint records to find the data again
        num_classes=len(names),
        class_names=names,
        channels=int(channels or index["channels"]),
        image_size=(int(h), int(w)),
        allow_flip=bool(index.get("allow_flip", True)),
    )


# --- writing --------------------------------------------------------------------------------


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
    Each shard is written to a temporary name and renamed when complete.
    """
    if shard_size < 1:
        raise VitkitError(f"shard size must be at least 1, got {shard_size}")
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    n = len(dataset)
    g = torch.Generator().manual_seed(seed)
    order = torch.randperm(n, generator=g).tolist() if shuffle else list(range(n))
    from tqdm import tqdm

    entries: list[dict[str, Any]] = []
    skipped = 0
    items = _samples_to_write(dataset, order, on_bad_image)
    held: tuple[str, bytes, int] | None = None  # the sample that did not fit the last shard
    key = 0
    with tqdm(total=n, desc=f"{split} shards", disable=not progress, file=sys.stderr) as bar:
        done = False
        while not done:
            final = out / f"{split}-{len(entries):06d}.tar"
            tmp = final.with_name(f".{final.name}.tmp-{os.getpid()}")
            count = size = 0
            with tarfile.open(tmp, "w", format=tarfile.USTAR_FORMAT) as tar:
                while count < shard_size:
                    item, held = held, None
                    if item is None:
                        item = next(items, "end")
                        if item == "end":
                            done = True
                            break
                        bar.update(1)
                        if item is None:
                            skipped += 1
                            continue
                    ext, data, label = item  # type: ignore[misc]
                    cls = str(label).encode()
                    grown = size + len(data) + len(cls) + 1024  # + two 512-byte headers
                    if count and grown > max_shard_bytes:
                        held = item  # type: ignore[assignment]
                        break
                    name = f"{key:0{_KEY_DIGITS}d}"
                    _add(tar, f"{name}.{ext}", data)
                    _add(tar, f"{name}.cls", cls)
                    count, size, key = count + 1, grown, key + 1
            if count == 0:
                tmp.unlink()
                break
            with open(tmp, "rb") as f:
                os.fsync(f.fileno())
            os.replace(tmp, final)
            entries.append({"file": final.name, "samples": count})
    return entries, skipped


def write_index(
    out_dir: str | os.PathLike[str],
    info: DataInfo,
    splits: dict[str, list[dict[str, Any]]],
    native_size: tuple[int, int] | None,
    source: str,
) -> Path:
    """Write ``shards.json`` (atomically) for the splits written into `out_dir`."""
    out = Path(out_dir)
    index = {
        "format": FORMAT,
        "version": 1,
        "name": info.name,
        "source": source,
        "class_names": list(info.class_names),
        "channels": info.channels,
        "image_size": list(native_size) if native_size is not None else None,
        "allow_flip": info.allow_flip,
        "splits": splits,
    }
    tmp = out / f".{INDEX}.tmp-{os.getpid()}"
    tmp.write_text(json.dumps(index, indent=1))
    os.replace(tmp, out / INDEX)
    return out / INDEX


def native_size(dataset: ArrayDataset | ImageFolderDataset) -> tuple[int, int] | None:
    """The stored size of an in-memory dataset's images (None: files of any size)."""
    return dataset.info.image_size if isinstance(dataset, ArrayDataset) else None


__all__ = [
    "INDEX",
    "ShardDataset",
    "ShardFile",
    "ShardLoader",
    "is_shard_dir",
    "iter_tar_samples",
    "load_shards",
    "native_size",
    "read_index",
    "shard_splits",
    "write_index",
    "write_shards",
]
