"""Batches in a reproducible order: `ArrayLoader` for in-memory data, a DataLoader for files.

Both yield `(images uint8 [B, C, H, W], labels int64 [B], n_skipped)` and share one protocol
(`EpochLoader`): `set_epoch(epoch)`, `len()` (batches per epoch), `iter(...)` and
`iter_from(k)`, which resumes an epoch at batch k without producing the first k batches.
The order of an epoch depends only on (seed, epoch): the permutation is drawn from
`torch.Generator().manual_seed(seed * 1_000_003 + epoch)`.

Data parallelism: with `world_size` ranks, batch b of the epoch is the *global* batch
`order[b * G : (b + 1) * G]` with `G = batch_size * world_size`, and rank r takes its contiguous
slice `[r * batch_size, (r + 1) * batch_size)` of it. So the images of every optimizer step are
the same whatever the number of ranks (a run may resume on another world size), the ranks read
disjoint samples, and DataLoader workers, which take whole batches in turn, do too.

Reproducibility of the *augmentation* is separate: batched tensor transforms take their own
generator (see `transforms`); PIL transforms in DataLoader workers use the workers' torch seeds,
which derive from (seed, epoch) unless `persistent_workers` keeps workers (and their random
state) across epochs. With `num_workers=0` they use the main process's global torch generator.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator, Sized
from typing import TYPE_CHECKING, Any, Protocol, cast

import torch
from torch.utils.data import DataLoader, Dataset, Sampler

from vitkit.data.arrays import ArrayDataset
from vitkit.data.folder import collate_skipping

if TYPE_CHECKING:
    from vitkit.data.shards_read import ShardDataset

Batch = tuple[torch.Tensor, torch.Tensor, int]


class EpochLoader(Protocol):
    """What the trainer needs from a loader."""

    def set_epoch(self, epoch: int) -> None: ...

    def iter_from(self, batch_index: int) -> Iterator[Batch]: ...

    def __iter__(self) -> Iterator[Batch]: ...

    def __len__(self) -> int: ...


def epoch_order(n: int, shuffle: bool, seed: int, epoch: int) -> torch.Tensor:
    """The sample order of an epoch: a permutation seeded by (seed, epoch), or 0..n-1."""
    if not shuffle:
        return torch.arange(n)
    generator = torch.Generator().manual_seed(seed * 1_000_003 + epoch)
    return torch.randperm(n, generator=generator)


def _num_batches(n: int, batch_size: int, drop_last: bool) -> int:
    return n // batch_size if drop_last else math.ceil(n / batch_size)


class EpochBatchSampler(Sampler[list[int]]):
    """Batches of indices in the order `epoch_order(n, shuffle, seed, epoch)`.

    With `world_size > 1`, this rank's slice of each global batch (see the module docstring):
    `batch_size` is per rank, and every rank has the same number of batches, `len(self)`.
    Without `drop_last`, the slices of the last global batch may be short or empty.
    """

    def __init__(
        self,
        n: int,
        batch_size: int,
        shuffle: bool,
        drop_last: bool,
        seed: int,
        *,
        rank: int = 0,
        world_size: int = 1,
    ) -> None:
        if batch_size <= 0:
            raise ValueError(f"batch_size must be positive, not {batch_size}")
        if not 0 <= rank < world_size:
            raise ValueError(f"rank {rank} is not in [0, world_size={world_size})")
        self.n = n
        self.batch_size = batch_size
        self.shuffle = shuffle
        self.drop_last = drop_last
        self.seed = seed
        self.rank = rank
        self.world_size = world_size
        self.epoch = 0
        self._start = 0  # batches to skip in the next iteration only (set by iter_from)

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def __len__(self) -> int:
        return _num_batches(self.n, self.batch_size * self.world_size, self.drop_last)

    def __iter__(self) -> Iterator[list[int]]:
        # Eager, so the order (and the skip) is fixed when the DataLoader iterator is made.
        start, self._start = self._start, 0
        order = epoch_order(self.n, self.shuffle, self.seed, self.epoch)
        size, step = self.batch_size, self.batch_size * self.world_size
        first = self.rank * size
        return iter(
            [
                order[b * step + first : b * step + first + size].tolist()
                for b in range(start, len(self))
            ]
        )


class ArrayLoader:
    """Batches of an `ArrayDataset` by direct tensor indexing (no DataLoader, no workers), in
    the order of an `EpochBatchSampler`."""

    def __init__(
        self,
        dataset: ArrayDataset,
        batch_size: int,
        shuffle: bool,
        drop_last: bool,
        seed: int = 0,
        pin_memory: bool = False,
        *,
        rank: int = 0,
        world_size: int = 1,
    ) -> None:
        self.dataset = dataset
        self.sampler = EpochBatchSampler(
            len(dataset), batch_size, shuffle, drop_last, seed, rank=rank, world_size=world_size
        )
        self.pin_memory = pin_memory and torch.cuda.is_available()

    def set_epoch(self, epoch: int) -> None:
        self.sampler.set_epoch(epoch)

    def __len__(self) -> int:
        return len(self.sampler)

    def __iter__(self) -> Iterator[Batch]:
        return self.iter_from(0)

    def iter_from(self, batch_index: int) -> Iterator[Batch]:
        """The batches of the current epoch from `batch_index` on (order fixed at this call)."""
        self.sampler._start = batch_index
        return self._batches(iter(self.sampler))

    def _batches(self, index_batches: Iterator[list[int]]) -> Iterator[Batch]:
        images, labels = self.dataset.images, self.dataset.labels
        for indices in index_batches:
            idx = torch.tensor(indices, dtype=torch.int64)
            batch_images, batch_labels = images[idx], labels[idx]
            if self.pin_memory:
                batch_images, batch_labels = batch_images.pin_memory(), batch_labels.pin_memory()
            yield batch_images, batch_labels, 0


class EpochDataLoader(DataLoader):
    """A DataLoader over an `EpochBatchSampler` that collates with `collate_skipping` (or
    `collate_fn`: NaFlex batches, `data.naflex_batches.CollatePacked`)."""

    batch_sampler: EpochBatchSampler  # the one given to __init__

    def __init__(
        self,
        dataset: Dataset,
        batch_sampler: EpochBatchSampler,
        collate_fn: Callable[[Any], Any] = collate_skipping,
        **kwargs: Any,
    ) -> None:
        generator = torch.Generator().manual_seed(self._worker_seed(batch_sampler, 0))
        super().__init__(
            dataset,
            batch_sampler=batch_sampler,
            collate_fn=collate_fn,
            generator=generator,  # seeds the workers' torch / random / numpy generators
            **kwargs,
        )

    @staticmethod
    def _worker_seed(sampler: EpochBatchSampler, epoch: int) -> int:
        # Each rank's workers draw their own augmentation (rank 0: the single-process seeds).
        return sampler.seed * 1_000_003 + epoch + sampler.rank * 7_777_777_777

    def set_epoch(self, epoch: int) -> None:
        self.batch_sampler.set_epoch(epoch)
        self.generator.manual_seed(self._worker_seed(self.batch_sampler, epoch))

    def iter_from(self, batch_index: int) -> Iterator[Batch]:
        self.batch_sampler._start = batch_index
        return iter(self)


def make_loader(
    dataset: Dataset | ShardDataset,
    batch_size: int,
    *,
    shuffle: bool,
    drop_last: bool,
    seed: int,
    num_workers: int = 0,
    pin_memory: bool = False,
    persistent_workers: bool = False,
    prefetch_factor: int | None = None,
    rank: int = 0,
    world_size: int = 1,
    shuffle_buffer: int = 1000,
    collate_fn: Callable[[Any], Any] | None = None,
    read_ahead: int = 2,
    shard_cache: str | None = None,
) -> EpochLoader:
    """An `EpochLoader` for `dataset`: `ArrayLoader` for an `ArrayDataset`, a `ShardLoader` for
    webdataset shards (`ShardDataset`), else a DataLoader over an `EpochBatchSampler`.

    `batch_size` is per rank; `rank` / `world_size` pick this rank's part of every epoch.
    The worker options apply to DataLoaders only (an ArrayLoader just honours `pin_memory`);
    `shuffle_buffer`, `read_ahead` and `shard_cache` to shards only; `collate_fn` to a
    map-style dataset's DataLoader.
    """
    if isinstance(dataset, ArrayDataset):
        return ArrayLoader(
            dataset,
            batch_size,
            shuffle,
            drop_last,
            seed,
            pin_memory=pin_memory,
            rank=rank,
            world_size=world_size,
        )
    from vitkit.data.shards_read import ShardDataset, ShardLoader

    if isinstance(dataset, ShardDataset):
        return ShardLoader(
            dataset,
            batch_size,
            shuffle=shuffle,
            drop_last=drop_last,
            seed=seed,
            rank=rank,
            world_size=world_size,
            num_workers=num_workers,
            pin_memory=pin_memory,
            persistent_workers=persistent_workers,
            prefetch_factor=prefetch_factor,
            shuffle_buffer=shuffle_buffer,
            read_ahead=read_ahead,
            shard_cache=shard_cache,
        )
    n = len(cast(Sized, dataset))  # a map-style dataset: its batches are sampled by index
    sampler = EpochBatchSampler(
        n, batch_size, shuffle, drop_last, seed, rank=rank, world_size=world_size
    )
    worker_kwargs: dict[str, Any] = {}
    if num_workers > 0:
        worker_kwargs = {
            "persistent_workers": persistent_workers,
            "prefetch_factor": prefetch_factor,
        }
    if collate_fn is not None:
        worker_kwargs["collate_fn"] = collate_fn
    return EpochDataLoader(
        dataset, sampler, num_workers=num_workers, pin_memory=pin_memory, **worker_kwargs
    )
