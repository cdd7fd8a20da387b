"""CIFAR python batches and Hugging Face datasets saved to disk, written by the tests."""

from __future__ import annotations

import pickle

import numpy as np
import pytest
import torch

from vitkit.data import load_dataset
from vitkit.errors import VitkitError


def write_cifar10(root, n_per_batch=6, seed=0):
    rng = np.random.default_rng(seed)
    d = root / "cifar-10-batches-py"
    d.mkdir(parents=True)
    names = [f"class{i}" for i in range(10)]
    with open(d / "batches.meta", "wb") as f:
        pickle.dump({b"label_names": [n.encode() for n in names]}, f)
    batches = {}
    for name in [f"data_batch_{i}" for i in range(1, 6)] + ["test_batch"]:
        x = rng.integers(0, 256, (n_per_batch, 3072), dtype=np.uint8)
        y = [int(v) for v in rng.integers(0, 10, n_per_batch)]
        batches[name] = (x, y)
        with open(d / name, "wb") as f:  # keys as bytes, as the Python-2 pickles decode
            pickle.dump({b"data": x, b"labels": y, b"batch_label": b"x"}, f)
    return d, names, batches


def test_cifar10_batches_read_exactly(tmp_path):
    d, names, batches = write_cifar10(tmp_path)
    test = load_dataset(tmp_path, "test")
    x, y = batches["test_batch"]
    assert torch.equal(test.images, torch.from_numpy(x.reshape(-1, 3, 32, 32)))
    assert test.labels.tolist() == y
    assert test.info.class_names == tuple(names) and test.info.image_size == (32, 32)
    train = load_dataset(d, "train", val_size=6)
    val = load_dataset(d, "val", val_size=6)
    assert len(train) + len(val) == 30 and len(val) == 6
    every = np.concatenate([batches[f"data_batch_{i}"][0] for i in range(1, 6)])
    seen = torch.cat([train.images, val.images]).reshape(30, -1).numpy()
    assert sorted(map(bytes, seen)) == sorted(map(bytes, every))  # disjoint, complete
    small = load_dataset(d, "test", image_size=16, channels=1)
    assert small.images.shape == (6, 1, 16, 16)


def test_cifar100_fine_labels(tmp_path):
    d = tmp_path / "cifar-100-python"
    d.mkdir()
    rng = np.random.default_rng(0)
    with open(d / "meta", "wb") as f:
        pickle.dump(
            {
                "fine_label_names": [f"f{i}" for i in range(100)],
                "coarse_label_names": [f"c{i}" for i in range(20)],
            },
            f,
        )
    for name, n in (("train", 8), ("test", 4)):
        with open(d / name, "wb") as f:
            pickle.dump(
                {
                    "data": rng.integers(0, 256, (n, 3072), dtype=np.uint8),
                    "fine_labels": list(range(90, 90 + n)),
                    "coarse_labels": [0] * n,
                },
                f,
            )
    test = load_dataset(tmp_path, "test")
    assert test.info.num_classes == 100 and test.labels.tolist() == [90, 91, 92, 93]


class _Exploit:
    def __reduce__(self):
        return (print, ("pwned",))


def test_a_cifar_pickle_with_code_is_refused(tmp_path, capsys):
    d, _, _ = write_cifar10(tmp_path)
    with open(d / "test_batch", "wb") as f:
        pickle.dump({b"data": _Exploit(), b"labels": []}, f)
    with pytest.raises(VitkitError, match=r"test_batch: refusing to unpickle 'builtins.print'"):
        load_dataset(tmp_path, "test")
    assert "pwned" not in capsys.readouterr().out


def write_hf(root, with_validation=False):
    datasets = pytest.importorskip("datasets")
    from PIL import Image

    rng = np.random.default_rng(0)
    feats = datasets.Features(
        {"img": datasets.Image(), "label": datasets.ClassLabel(names=["cat", "dog", "eel"])}
    )

    def split(n, seed):
        r = np.random.default_rng(seed)
        arrays = [r.integers(0, 256, (10, 12, 3), dtype=np.uint8) for _ in range(n)]
        labels = [i % 3 for i in range(n)]
        ds = datasets.Dataset.from_dict(
            {"img": [Image.fromarray(a) for a in arrays], "label": labels}, features=feats
        )
        return ds, arrays, labels

    parts = {"train": split(12, 1), "test": split(6, 2)}
    if with_validation:
        parts["validation"] = split(3, 3)
    datasets.DatasetDict({k: v[0] for k, v in parts.items()}).save_to_disk(str(root))
    del rng
    return parts


def test_hugging_face_save_to_disk_reads_exactly(tmp_path):
    parts = write_hf(tmp_path / "hf")
    test = load_dataset(tmp_path / "hf", "test")
    _, arrays, labels = parts["test"]
    assert torch.equal(test.images, torch.from_numpy(np.stack(arrays).transpose(0, 3, 1, 2)))
    assert test.labels.tolist() == labels
    assert test.info.class_names == ("cat", "dog", "eel") and test.info.image_size == (10, 12)
    train, val = load_dataset(tmp_path / "hf", "train"), load_dataset(tmp_path / "hf", "val")
    assert len(train) + len(val) == 12 and len(val) >= 1
    gray = load_dataset(tmp_path / "hf", "test", image_size=8, channels=1)
    assert gray.images.shape == (6, 1, 8, 8)


def test_hugging_face_own_validation_split_is_val(tmp_path):
    parts = write_hf(tmp_path / "hf", with_validation=True)
    val = load_dataset(tmp_path / "hf", "val")
    assert val.labels.tolist() == parts["validation"][2]
    assert len(load_dataset(tmp_path / "hf", "train")) == 12
