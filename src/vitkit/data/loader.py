"""Batches in a reproducible order: `ArrayLoader` for in-memory data, a DataLoader for files.

Both yield `(images uint8 [B, C, H, W], labels int64 [B], n_skipped)` and share one protocol
(`EpochLoader`): `set_epoch(epoch)`, `len()` (batches per epoch), `iter(...)` and
`iter_from(k)`, which resumes an epoch at batch k without producing the first k batches.
The order of an epoch depends only on (seed, epoch): the permutation is drawn from
`torch.Generator().manual_seed(seed * 1_000_003 + epoch)`.

Reproducibility of the *augmentation* is separate: batched tensor transforms take their own
generator (see `transforms`); PIL transforms in DataLoader workers use the workers' torch seeds,
which derive from (seed, epoch) unless `persistent_workers` keeps workers (and their random
state) across epochs. With `num_workers=0` they use the main process's global torch generator.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from typing import Protocol

import torch
from torch.utils.data import DataLoader, Dataset, Sampler

from vitkit.data.arrays import ArrayDataset
from vitkit.data.folder import collate_skipping

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
    """Batches of indices in the order `epoch_order(n, shuffle, seed, epoch)`."""

    def __init__(self, n: int, batch_size: int, shuffle: bool, drop_last: bool, seed: int) -> None:
        if batch_size <= 0:
            raise ValueError(f"batch_size must be positive, not {batch_size}")
        self.n = n
        self.batch_size = batch_size
        self.shuffle = shuffle
        self.drop_last = drop_last
        self.seed = seed
        self.epoch = 0
        self._start = 0  # batches to skip in the next iteration only (set by iter_from)

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def __len__(self) -> int:
        return _num_batches(self.n, self.batch_size, self.drop_last)

    def __iter__(self) -> Iterator[list[int]]:
        # Eager, so the order (and the skip) is fixed when the DataLoader iterator is made.
        start, self._start = self._start, 0
        order = epoch_order(self.n, self.shuffle, self.seed, self.epoch)
        size = self.batch_size
        return iter([order[b * size : (b + 1) * size].tolist() for b in range(start, len(self))])


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
    ) -> None:
        self.dataset = dataset
        self.sampler = EpochBatchSampler(len(dataset), batch_size, shuffle, drop_last, seed)
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
    """A DataLoader over an `EpochBatchSampler` that collates with `collate_skipping`."""

    def __init__(self, dataset: Dataset, batch_sampler: EpochBatchSampler, **kwargs) -> None:
        generator = torch.Generator().manual_seed(batch_sampler.seed * 1_000_003)
        super().__init__(
            dataset,
            batch_sampler=batch_sampler,
            collate_fn=collate_skipping,
            generator=generator,  # seeds the workers' torch / random / numpy generators
            **kwargs,
        )

    def set_epoch(self, epoch: int) -> None:
        self.batch_sampler.set_epoch(epoch)
        self.generator.manual_seed(self.batch_sampler.seed * 1_000_003 + epoch)

    def iter_from(self, batch_index: int) -> Iterator[Batch]:
        self.batch_sampler._start = batch_index
        return iter(self)


def make_loader(
    dataset: Dataset,
    batch_size: int,
    *,
    shuffle: bool,
    drop_last: bool,
    seed: int,
    num_workers: int = 0,
    pin_memory: bool = False,
    persistent_workers: bool = False,
    prefetch_factor: int | None = None,
) -> ArrayLoader | EpochDataLoader:
    """An `EpochLoader` for `dataset`: `ArrayLoader` for an `ArrayDataset`, else a DataLoader.

    The worker options apply to the DataLoader only (an ArrayLoader just honours `pin_memory`).
    """
    if isinstance(dataset, ArrayDataset):
        return ArrayLoader(dataset, batch_size, shuffle, drop_last, seed, pin_memory=pin_memory)
    sampler = EpochBatchSampler(len(dataset), batch_size, shuffle, drop_last, seed)
    worker_kwargs = {}
    if num_workers > 0:
        worker_kwargs = {
            "persistent_workers": persistent_workers,
            "prefetch_factor": prefetch_factor,
        }
    return EpochDataLoader(
        dataset, sampler, num_workers=num_workers, pin_memory=pin_memory, **worker_kwargs
    )
