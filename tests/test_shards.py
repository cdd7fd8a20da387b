"""Sharded data: every rank and worker reads a disjoint part of each epoch (in-memory data,
ImageFolder, webdataset shards); shards round-trip; foreign webdataset tars read; CLI."""

from __future__ import annotations

import io
import json
import tarfile
from collections import Counter
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from vitkit.cli import main
from vitkit.data import (
    ArrayDataset,
    DataInfo,
    ImageFolderDataset,
    ShardDataset,
    load_dataset,
    make_loader,
    pil_to_tensor,
    write_shards,
)
from vitkit.data.shards_index import INDEX, iter_tar_samples, write_index
from vitkit.data.shards_write import write_dataset_shards
from vitkit.errors import VitkitError

TINY_ARGS = ["-o", "width=32", "-o", "depth=2", "-o", "num_heads=2", "-o", "mlp_dim=64"]


def _indexed(n: int) -> ArrayDataset:
    """Image i is one grey pixel of value i (n <= 256), label i % 3."""
    images = torch.arange(n, dtype=torch.uint8).reshape(n, 1, 1, 1)
    info = DataInfo("indexed", 3, ("a", "b", "c"), 1, (1, 1), True)
    return ArrayDataset(images, torch.arange(n) % 3, info)


def _ids(batch) -> list[int]:
    images, _, _ = batch
    return images[:, 0, 0, 0].long().tolist()


def _epoch(loaders, epoch: int) -> list[list[list[int]]]:
    """[rank][batch] -> sample ids, for one epoch of each rank's loader."""
    out = []
    for loader in loaders:
        loader.set_epoch(epoch)
        out.append([_ids(b) for b in loader])
    return out


def _check_disjoint_cover(per_rank: list[list[list[int]]], n: int, batch: int) -> None:
    lengths = {len(batches) for batches in per_rank}
    assert len(lengths) == 1  # every rank takes the same number of steps
    seen = Counter(i for batches in per_rank for b in batches for i in b)
    assert all(c == 1 for c in seen.values())  # nobody reads a sample twice
    assert all(len(b) == batch for batches in per_rank for b in batches)
    assert sorted(seen) == list(range(n))  # these sizes split evenly: all read, exactly once


@pytest.mark.parametrize("world", [1, 2, 3])
def test_in_memory_ranks_read_slices_of_the_single_process_batches(world: int) -> None:
    n, per_rank = 48, 4
    single = make_loader(_indexed(n), per_rank * world, shuffle=True, drop_last=True, seed=5)
    ranks = [
        make_loader(
            _indexed(n), per_rank, shuffle=True, drop_last=True, seed=5, rank=r, world_size=world
        )
        for r in range(world)
    ]
    for epoch in (0, 1):
        per = _epoch(ranks, epoch)
        _check_disjoint_cover(per, n, per_rank)
        # Global batch b is the single process's batch b: the run does not depend on the world.
        whole = _epoch([single], epoch)[0]
        for b, batch in enumerate(whole):
            assert [i for r in range(world) for i in per[r][b]] == batch


def _write_indexed_folder(root: Path, n: int) -> None:
    for i in range(n):
        d = root / f"class{i % 2}"
        d.mkdir(parents=True, exist_ok=True)
        Image.fromarray(np.full((4, 4), i, dtype=np.uint8), mode="L").save(d / f"{i:03d}.png")


def test_image_folder_ranks_and_workers_read_each_image_once(tmp_path: Path) -> None:
    n = 24
    _write_indexed_folder(tmp_path, n)
    dataset = ImageFolderDataset(tmp_path, 4, channels=1)
    ranks = [
        make_loader(
            dataset, 3, shuffle=True, drop_last=True, seed=1, num_workers=2, rank=r, world_size=2
        )
        for r in range(2)
    ]
    for epoch in (0, 1):
        _check_disjoint_cover(_epoch(ranks, epoch), n, 3)


def _write_indexed_shards(root: Path, n: int, shard_size: int) -> None:
    entries, skipped = write_shards(_indexed(n), root, "train", shard_size=shard_size, seed=3)
    assert skipped == 0 and sum(e["samples"] for e in entries) == n
    write_index(root, _indexed(n).info, {"train": entries}, (1, 1), source="indexed")


@pytest.mark.parametrize("workers", [0, 2])
def test_shards_ranks_and_workers_read_each_sample_once(tmp_path: Path, workers: int) -> None:
    n = 96
    _write_indexed_shards(tmp_path, n, shard_size=12)  # 8 shards: 4 per rank, 2 per worker
    dataset = load_dataset(tmp_path, "train", train_transform=False)
    assert isinstance(dataset, ShardDataset) and len(dataset) == n
    assert dataset.info.class_names == ("a", "b", "c") and dataset.info.image_size == (1, 1)
    ranks = [
        make_loader(
            dataset,
            4,
            shuffle=True,
            drop_last=True,
            seed=0,
            num_workers=workers,
            rank=r,
            world_size=2,
            shuffle_buffer=10,
        )
        for r in range(2)
    ]
    epochs = [_epoch(ranks, e) for e in (0, 1)]
    for per in epochs:
        _check_disjoint_cover(per, n, 4)
    assert epochs[0] != epochs[1]  # shard order and shuffle buffer follow the epoch


def test_shards_of_uneven_sizes_give_every_rank_the_same_number_of_steps(tmp_path: Path) -> None:
    n = 50
    _write_indexed_shards(tmp_path, n, shard_size=7)  # 8 shards: 7 x 7 + 1
    dataset = load_dataset(tmp_path, "train", train_transform=False)
    ranks = [
        make_loader(dataset, 4, shuffle=True, drop_last=True, seed=0, rank=r, world_size=3)
        for r in range(3)
    ]
    per = _epoch(ranks, 0)
    assert [len(p) for p in per] == [len(ranks[0])] * 3 == [14 // 4] * 3  # the smallest share
    seen = Counter(i for batches in per for b in batches for i in b)
    assert max(seen.values()) == 1
    # Evaluation reads everything, each rank its own shards.
    evals = [
        make_loader(dataset, 4, shuffle=False, drop_last=False, seed=0, rank=r, world_size=3)
        for r in range(3)
    ]
    seen = Counter(i for loader in evals for b in loader for i in _ids(b))
    assert sorted(seen) == list(range(n)) and max(seen.values()) == 1


def test_shard_loader_iter_from_is_the_tail_of_the_epoch(tmp_path: Path) -> None:
    """Resuming mid-epoch without workers skips samples undecoded and continues exactly."""
    _write_indexed_shards(tmp_path, 60, shard_size=10)
    dataset = load_dataset(tmp_path, "train", train_transform=False)
    loader = make_loader(dataset, 4, shuffle=True, drop_last=True, seed=2, shuffle_buffer=8)
    loader.set_epoch(3)
    full = [_ids(b) for b in loader]
    for k in (0, 5, len(full)):
        assert [_ids(b) for b in loader.iter_from(k)] == full[k:]


def test_shards_round_trip_pixels_and_labels(tmp_path: Path) -> None:
    digits = load_dataset("digits", "test")
    entries, _ = write_shards(digits, tmp_path, "test", shard_size=100)
    assert [e["samples"] for e in entries] == [100, 100, 100, len(digits) - 300]
    write_index(tmp_path, digits.info, {"test": entries}, digits.info.image_size, "digits")
    shards = load_dataset(tmp_path, "test")
    assert shards.info.class_names == digits.info.class_names
    assert shards.info.allow_flip is False  # digits: a mirror changes the class
    assert shards.info.image_size == (8, 8) and shards.info.channels == 1
    shards.transform = pil_to_tensor  # the stored pixels, without the eval resize and crop
    loader = make_loader(shards, 64, shuffle=False, drop_last=False, seed=0)
    images = torch.cat([b[0] for b in loader])
    labels = torch.cat([b[1] for b in loader])
    assert len(labels) == len(digits)

    def rows(x: torch.Tensor, y: torch.Tensor) -> Counter:
        return Counter((bytes(img.flatten().tolist()), int(label)) for img, label in zip(x, y))

    assert rows(images, labels) == rows(digits.images, digits.labels)  # lossless, as a set
    with pytest.raises(VitkitError, match="no 'val' shards"):
        load_dataset(tmp_path, "val")


def _tar_member(tar: tarfile.TarFile, name: str, data: bytes) -> None:
    info = tarfile.TarInfo(name)
    info.size = len(data)
    tar.addfile(info, io.BytesIO(data))


def _jpeg(value: int) -> bytes:
    out = io.BytesIO()
    Image.fromarray(np.full((6, 6, 3), value, dtype=np.uint8)).save(out, format="JPEG")
    return out.getvalue()


def test_foreign_webdataset_tars_are_read(tmp_path: Path) -> None:
    """Tars in the webdataset convention written by another tool: keys with directories and
    dots in extensions, .jpeg/.jpg/.png images, .cls or .json labels, extra members, no index."""
    with tarfile.open(tmp_path / "train-000000.tar", "w") as tar:
        _tar_member(tar, "imgs/a/sample0001.jpg", _jpeg(10))
        _tar_member(tar, "imgs/a/sample0001.cls", b"2\n")
        _tar_member(tar, "imgs/a/sample0001.txt", b"a caption")
        _tar_member(tar, "imgs/b/sample0002.seg.png", b"not read")
        _tar_member(tar, "imgs/b/sample0002.jpeg", _jpeg(200))
        _tar_member(tar, "imgs/b/sample0002.json", json.dumps({"label": 0}).encode())
    with tarfile.open(tmp_path / "test-000000.tar", "w") as tar:
        _tar_member(tar, "x.jpg", _jpeg(50))
        _tar_member(tar, "x.cls", b"1")
    samples = list(iter_tar_samples(tmp_path / "train-000000.tar"))
    assert [s["__key__"] for s in samples] == ["imgs/a/sample0001", "imgs/b/sample0002"]
    assert set(samples[1]) >= {"seg.png", "jpeg", "json"}
    train = load_dataset(tmp_path, "train", image_size=6, train_transform=False)
    assert train.info.class_names == ("0", "1", "2") and len(train) == 2
    (batch,) = list(make_loader(train, 8, shuffle=False, drop_last=False, seed=0))
    assert batch[1].tolist() == [2, 0]
    assert abs(int(batch[0][0].float().mean()) - 10) <= 3  # JPEG: close to the written value
    assert len(load_dataset(tmp_path, "test", image_size=6)) == 1
    assert not (tmp_path / INDEX).exists()  # a foreign directory is only read


def test_corrupt_shard_and_bad_label_name_the_file(tmp_path: Path) -> None:
    (tmp_path / "train-000000.tar").write_bytes(b"this is not a tar file" * 40)
    with pytest.raises(VitkitError, match="train-000000.tar: unreadable tar shard"):
        load_dataset(tmp_path, "train")
    (tmp_path / "train-000000.tar").unlink()
    with tarfile.open(tmp_path / "train-000000.tar", "w") as tar:
        _tar_member(tar, "k.jpg", _jpeg(1))
        _tar_member(tar, "k.cls", b"cat")
    with pytest.raises(VitkitError, match="sample 'k' has no integer label"):
        load_dataset(tmp_path, "train")


@pytest.mark.filterwarnings("ignore:Unable to enable fault handler")  # torchrun under pytest
def test_cli_shards_then_train_on_two_processes(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """vitkit shards writes train/val/test shards; vitkit train --nproc-per-node 2 (torchrun)
    streams them with a worker per rank; eval reads the distributed checkpoint."""
    out = tmp_path / "shards"
    args = ["shards", "digits", str(out), "--shard-size", "150", "--splits", "train,val,test"]
    assert main([*args, "--val-size", "100"]) == 0
    index = json.loads((out / INDEX).read_text())
    assert sum(e["samples"] for e in index["splits"]["val"]) == 100
    assert len(index["splits"]["train"]) == 9 and index["channels"] == 1  # 1,338 / 150
    capsys.readouterr()
    run = tmp_path / "run"
    train = ["train", "--data", str(out), "--model", "Ti/2", *TINY_ARGS, "--image-size", "8"]
    train += ["--batch-size", "16", "--max-steps", "4", "--epochs", "1", "--no-progress"]
    train += ["--num-workers", "1", "--precision", "fp32", "--out-dir", str(run)]
    assert main([*train, "--nproc-per-node", "2"]) == 0
    report = json.loads((run / "report.json").read_text())
    assert report["steps"] == 4 and report["distributed"]["world_size"] == 2
    assert report["test_num_samples"] == sum(e["samples"] for e in index["splits"]["test"])
    records = [json.loads(line) for line in (run / "metrics.jsonl").open()]
    assert any("val_top1" in r for r in records)
    code = main(["eval", "--from", str(run), "--out", str(tmp_path / "ev")])
    assert code == 0
    result = json.loads((tmp_path / "ev" / "eval.json").read_text())
    assert result["top1"] == pytest.approx(report["test_top1"], abs=1e-9)


def test_write_dataset_shards_writes_what_the_cli_writes(tmp_path: Path) -> None:
    """The library function behind `vitkit shards`: the same tar bytes and the same index."""
    cli_out, lib_out = tmp_path / "cli", tmp_path / "lib"
    args = ["shards", "digits", str(cli_out), "--shard-size", "500", "--splits", "train,val,test"]
    assert main([*args, "--val-size", "100", "--seed", "4", "--max-shard-bytes", "2e5"]) == 0
    counts = write_dataset_shards(
        "digits",
        lib_out,
        ["train", "val", "test"],
        shard_size=500,
        max_shard_bytes=2e5,
        val_size=100.0,
        seed=4,
    )
    index = json.loads((lib_out / INDEX).read_text())
    assert (lib_out / INDEX).read_text() == (cli_out / INDEX).read_text()
    files = sorted(p.name for p in cli_out.glob("*.tar"))
    assert files == sorted(p.name for p in lib_out.glob("*.tar"))
    for name in files:
        assert (lib_out / name).read_bytes() == (cli_out / name).read_bytes()
    for split, entries in index["splits"].items():
        samples = sum(e["samples"] for e in entries)
        assert counts[split] == {"samples": samples, "shards": len(entries), "skipped": 0}
    assert counts["val"]["samples"] == 100


def test_write_dataset_shards_rejects_what_the_cli_rejects(tmp_path: Path) -> None:
    with pytest.raises(VitkitError, match="unknown split 'dev': expected train, val or test"):
        write_dataset_shards("digits", tmp_path, ["train", "dev"])
    with pytest.raises(VitkitError, match="--shard-size and --max-shard-bytes must be positive"):
        write_dataset_shards("digits", tmp_path, ["train"], shard_size=0)
    with pytest.raises(VitkitError, match="--shard-size and --max-shard-bytes must be positive"):
        write_dataset_shards("digits", tmp_path, ["train"], max_shard_bytes=0.5)
    assert not any(tmp_path.iterdir())  # checked before anything is written


def test_shards_write_every_image_or_say_how_many_are_left_out(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """By default every image is in a shard (train, val and test); splits that leave the
    held-out val images out say how many."""
    total = len(load_dataset("digits", "train")) + len(load_dataset("digits", "val"))
    total += len(load_dataset("digits", "test"))
    assert main(["shards", "digits", str(tmp_path / "all")]) == 0
    index = json.loads((tmp_path / "all" / INDEX).read_text())
    written = sum(e["samples"] for entries in index["splits"].values() for e in entries)
    assert set(index["splits"]) == {"train", "val", "test"} and written == total
    capsys.readouterr()
    assert main(["shards", "digits", str(tmp_path / "some"), "--splits", "train,test"]) == 0
    out = capsys.readouterr().out
    n_val = len(load_dataset("digits", "val"))
    assert f"the {n_val:,} images held out as the val split are in no shard" in out


def test_a_shard_with_fewer_samples_than_its_index_says_is_refused(tmp_path: Path) -> None:
    """A shard cut at a member boundary (or replaced) reads as a valid tar with fewer samples:
    the epoch would silently shrink. Its count is checked against shards.json at its end."""
    write_dataset_shards("digits", tmp_path, ["train"], shard_size=100, val_size=0)
    index = json.loads((tmp_path / INDEX).read_text())
    first = tmp_path / index["splits"]["train"][0]["file"]
    with tarfile.open(first) as tar:
        members = [(m, tar.extractfile(m).read()) for m in tar.getmembers()]  # type: ignore[union-attr]
    with tarfile.open(first, "w", format=tarfile.USTAR_FORMAT) as tar:
        for member, data in members[: len(members) // 2]:
            tar.addfile(member, io.BytesIO(data))
    data = load_dataset(str(tmp_path), "train")
    loader = make_loader(data, 16, shuffle=False, drop_last=False, seed=0)
    with pytest.raises(
        VitkitError, match=r"train-000000.tar: 50 samples where shards.json records 100"
    ):
        list(loader)
