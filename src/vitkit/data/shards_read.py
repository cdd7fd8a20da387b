"""Streaming webdataset shards: `ShardDataset` (one split), `ShardLoader` and `load_shards`.

Each rank reads its own shards (shard i goes to rank i mod world_size, a fixed assignment, so
each rank's share has the same size every epoch), and each DataLoader worker of that rank reads
every num_workers-th of them; the shard order and a shuffle buffer (as webdataset's
``.shuffle(n)``) are seeded by (seed, epoch, rank, worker). Workers send collated chunks of
consecutive samples (one transfer per chunk, not one per image), and the training process cuts
the rank's stream into batches, so an epoch has the same number of batches whatever the number
of workers: ``min over ranks of (samples of the rank) // batch_size`` for training (every rank
takes the same number of steps; the remainder of a rank's stream is dropped for that epoch), and
all of the rank's samples for evaluation. Within an epoch no sample is read twice; when the
shards split evenly over the ranks every sample is read exactly once.

The format and the index are `vitkit.data.shards_index`; writing is `vitkit.data.shards_write`.
"""

from __future__ import annotations

import io
import math
import os
import random
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any, Literal

import torch
from PIL import Image
from torch.utils.data import DataLoader, IterableDataset, get_worker_info

from vitkit.data import shards_remote as remote
from vitkit.data.arrays import DataInfo
from vitkit.data.folder import _DECODE_ERRORS, collate_skipping
from vitkit.data.shards_index import (
    IMAGE_KEYS,
    INDEX,
    ShardFile,
    image_entry,
    iter_tar_samples,
    label_of,
    read_index,
    shard_info,
)
from vitkit.data.transforms import convert_image
from vitkit.errors import VitkitError

Batch = tuple[torch.Tensor, torch.Tensor, int]


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
        data = image_entry(sample)
        if data is None:
            raise VitkitError(f"{where} has no image ({', '.join(IMAGE_KEYS)})")
        label = label_of(sample, sample.get("__url__", "?"))
        if not 0 <= label < self.info.num_classes:
            raise VitkitError(f"{where} has label {label}, outside [0, {self.info.num_classes})")
        img: Image.Image
        try:
            with Image.open(io.BytesIO(data)) as img:
                img.load()
                img = convert_image(img, self.info.channels)  # 16-bit / float: by their range
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
        self,
        dataset: ShardDataset,
        shuffle: bool,
        seed: int,
        rank: int,
        world: int,
        buf: int,
        read_ahead: int = 2,
        cache: str | None = None,
    ) -> None:
        self.dataset = dataset
        self.shuffle = shuffle
        self.seed = seed
        self.rank = rank
        self.world = world
        self.buffer = buf
        self.read_ahead = read_ahead  # (object storage) shards fetched ahead, and where kept
        self.cache = cache
        self.chunk = 1  # samples per item a worker sends (the loader sets its batch size)
        self.state = torch.zeros(2, dtype=torch.int64).share_memory_()  # epoch, samples to skip

    def worker_samples(self, worker: int, num_workers: int, epoch: int) -> Iterator[dict]:
        shards = self.dataset.rank_shards(self.rank, self.world)
        if self.shuffle:
            g = torch.Generator().manual_seed(_seed(self.seed, epoch, self.rank, -1))
            shards = [shards[i] for i in torch.randperm(len(shards), generator=g).tolist()]
        mine = shards[worker::num_workers]
        samples: Iterator[dict]
        if mine and remote.is_remote(mine[0].path):  # fetched whole, read_ahead shards ahead
            fetched = remote.ReadAhead(
                [(str(s.path), s.size) for s in mine], self.read_ahead, self.cache
            )
            samples = (
                s
                for shard, data in zip(mine, fetched, strict=True)
                for s in _counted(shard, iter_tar_samples(shard.path, data))
            )
        else:
            samples = (s for shard in mine for s in _counted(shard, iter_tar_samples(shard.path)))
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
            if image_entry(sample) is None:
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


def _counted(shard: ShardFile, samples: Iterator[dict]) -> Iterator[dict]:
    """The samples of `shard`, refused at its end if they are not as many as the index says
    (a truncated or replaced shard would otherwise shorten the epoch silently)."""
    n = 0
    for s in samples:
        n += image_entry(s) is not None
        yield s
    if n != shard.samples:
        raise VitkitError(
            f"{shard.path}: {n} samples where {INDEX} records {shard.samples}: the shard is "
            "truncated or was replaced; write the shards again"
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
        read_ahead: int = 2,
        shard_cache: str | None = None,
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
        self.stream = _RankStream(
            dataset, shuffle, seed, rank, world_size, shuffle_buffer, read_ahead, shard_cache
        )
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
    index = read_index(root)
    if split not in index["splits"]:
        raise VitkitError(
            f"{root}: no '{split}' shards (splits: {', '.join(index['splits'])}); write them "
            f"with vitkit shards SRC {root} --splits ..."
        )
    shards = []
    for entry in index["splits"][split]:
        size = int(entry["bytes"]) if entry.get("bytes") is not None else None
        if remote.is_remote(root):  # (a missing object is said when its turn comes)
            shards.append(
                ShardFile(remote.join(str(root), entry["file"]), int(entry["samples"]), size)
            )
            continue
        path = Path(root) / entry["file"]
        if not path.is_file():
            raise VitkitError(f"{path}: shard listed in {Path(root) / INDEX} is missing")
        shards.append(ShardFile(path, int(entry["samples"]), size))
    where = str(root) if remote.is_remote(root) else Path(root)
    info = shard_info(where, index, image_size, channels)
    return ShardDataset(shards, info, transform, on_bad_image)


__all__ = ["Batch", "ShardDataset", "ShardLoader", "load_shards"]
