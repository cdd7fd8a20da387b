"""The MNIST digit-canvas segmentation set (vitkit.data.digit_canvas), the tiled and pixel
feature sources of the dense probe (vitkit.eval.dense_probe), and bench/dense_probe_mnist.py
end to end on a tiny set of MNIST IDX files written here."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import numpy as np
import pytest
import torch

import vitkit
from vitkit.data.digit_canvas import DIGIT_SEGMENTATION_CLASSES, make_digit_canvases, shift_cut
from vitkit.errors import VitkitError
from vitkit.eval.dense_probe import PixelPatches, TiledFeatures

ROOT = Path(__file__).resolve().parents[1]
TINY = dict(image_size=28, in_chans=1, patch_size=7, width=16, depth=2, num_heads=2,
            mlp_dim=32, num_classes=10)  # fmt: skip


def _write_idx(path: Path, array: np.ndarray) -> None:
    header = (0x0800 + array.ndim).to_bytes(4, "big")
    header += b"".join(d.to_bytes(4, "big") for d in array.shape)
    path.write_bytes(header + array.astype(np.uint8).tobytes())


def _digits(labels: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """Stand-in digits: a 14 px block of strokes whose brightness says the class (128 + 12 d),
    below-threshold speckle around it."""
    x = rng.integers(0, 100, (len(labels), 28, 28)) * (rng.random((len(labels), 28, 28)) < 0.2)
    for i, d in enumerate(labels):
        top, left = rng.integers(5, 9, 2)
        x[i, top : top + 14, left : left + 14] = 128 + 12 * d
    return x


def _mnist_root(
    root: Path, n_train: int = 40, n_test: int = 20, classes: tuple[int, ...] = tuple(range(10))
) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(0)
    arrays = {"train_y": rng.choice(classes, n_train), "test_y": rng.choice(classes, n_test)}
    arrays["train_x"], arrays["test_x"] = (_digits(arrays[k], rng) for k in ("train_y", "test_y"))
    root.mkdir(exist_ok=True)
    for split, prefix in (("train", "train"), ("test", "t10k")):
        _write_idx(root / f"{prefix}-images-idx3-ubyte", arrays[f"{split}_x"])
        _write_idx(root / f"{prefix}-labels-idx1-ubyte", arrays[f"{split}_y"])
    return arrays


def test_canvas_labels_are_the_digits_placed(tmp_path: Path) -> None:
    arrays = _mnist_root(tmp_path)
    images, masks = make_digit_canvases("test", 16, seed=5, jitter=0, root=tmp_path)
    assert images.shape == (16, 1, 56, 56) and images.dtype == torch.uint8
    assert masks.shape == (16, 56, 56) and len(DIGIT_SEGMENTATION_CLASSES) == 11
    test_x = torch.from_numpy(arrays["test_x"].astype(np.uint8))
    for image, mask in zip(images[:, 0], masks):
        placed = 0
        for r in range(2):
            for c in range(2):
                cell = image[r * 28 : (r + 1) * 28, c * 28 : (c + 1) * 28]
                labels = mask[r * 28 : (r + 1) * 28, c * 28 : (c + 1) * 28]
                if not cell.any():
                    assert not labels.any()
                    continue
                placed += 1
                # the cell holds one test digit as MNIST drew it, labelled with its class
                match = [i for i in range(len(test_x)) if torch.equal(test_x[i], cell)]
                assert match, "a cell holds something that is not a digit of the test split"
                digit = int(arrays["test_y"][match[0]])
                expected = torch.where(cell >= 128, digit + 1, 0)
                assert torch.equal(labels, expected)
        assert 2 <= placed <= 4
    again = make_digit_canvases("test", 16, seed=5, jitter=0, root=tmp_path)
    assert torch.equal(again[0], images) and torch.equal(again[1], masks)
    other = make_digit_canvases("test", 16, seed=6, jitter=0, root=tmp_path)
    assert not torch.equal(other[1], masks)


def test_jittered_canvases_label_exactly_the_stroke_pixels(tmp_path: Path) -> None:
    _mnist_root(tmp_path)
    images, masks = make_digit_canvases("train", 24, seed=1, jitter=3, root=tmp_path)
    assert torch.equal(masks > 0, images[:, 0] >= 128)
    assert set(masks.unique().tolist()) - {0} and masks.max() <= 10
    # a 3 px shift moves the stroke block, but no pixel wraps to the far side of the cell
    block = torch.zeros(28, 28, dtype=torch.uint8)
    block[0:2, 26:28] = 200
    moved = shift_cut(block, dy=-1, dx=3)
    assert moved.sum() == 0  # all of it left the frame, nothing came back at the left
    assert torch.equal(shift_cut(block, 1, -2)[1:3, 24:26], block[0:2, 26:28])


def test_canvas_refusals(tmp_path: Path) -> None:
    _mnist_root(tmp_path)
    bad_args = [({"n": 0}, "positive"), ({"cells": 1}, "at least 2"),
                ({"jitter": 15}, "jitter"), ({"threshold": 0}, "threshold")]  # fmt: skip
    for bad, message in bad_args:
        with pytest.raises(VitkitError, match=message):
            make_digit_canvases("test", **{"n": 2, **bad}, root=tmp_path)


def test_tiled_features_are_each_tiles_own_maps() -> None:
    torch.manual_seed(0)
    model = vitkit.create_model("Ti/4", **TINY).eval()
    x = torch.randn(3, 1, 56, 84)
    maps = TiledFeatures(model, 28, indices=2)(x)
    assert [tuple(m.shape) for m in maps] == [(3, 16, 8, 12)] * 2
    kw = dict(norm=True, output_fmt="NCHW", intermediates_only=True)
    for r, c in ((0, 0), (1, 2), (0, 1)):
        crop = x[:, :, r * 28 : (r + 1) * 28, c * 28 : (c + 1) * 28]
        own = model.forward_intermediates(crop, 2, **kw)
        for level, m in zip(maps, own):
            torch.testing.assert_close(level[:, :, r * 4 : (r + 1) * 4, c * 4 : (c + 1) * 4], m)
    pixels = PixelPatches(7)(x)[0]
    assert pixels.shape == (3, 49, 8, 12)
    assert torch.equal(pixels[1, :, 1, 2], x[1, 0, 7:14, 14:21].flatten())
    with pytest.raises(VitkitError, match="not a whole number of 28 px tiles"):
        TiledFeatures(model, 28)(torch.randn(1, 1, 56, 60))
    with pytest.raises(VitkitError, match="not a whole number of 7 px patches"):
        PixelPatches(7)(torch.randn(1, 1, 30, 28))


def _bench():
    spec = importlib.util.spec_from_file_location(
        "dense_probe_mnist", ROOT / "bench" / "dense_probe_mnist.py"
    )
    module = importlib.util.module_from_spec(spec)  # type: ignore[arg-type]
    spec.loader.exec_module(module)  # type: ignore[union-attr]
    return module


def test_bench_runs_end_to_end_and_pixels_beat_the_floor(tmp_path: Path) -> None:
    """The bench's whole path on a tiny model and tiny canvases: results, table, picture; raw
    pixels, which here tell the two digits apart by their brightness (164 against 212), beat
    the noise floor (background only)."""
    _mnist_root(tmp_path / "mnist", n_train=60, n_test=30, classes=(3, 7))
    torch.manual_seed(0)
    vitkit.save_checkpoint(tmp_path / "run", vitkit.create_model("Ti/4", **TINY))
    out, figure = tmp_path / "res" / "dense", tmp_path / "dense.png"
    args = [str(tmp_path / "run"), "--train", "48", "--test", "24", "--steps", "100",
            "--heads", "linear", "--indices", "2", "--sources", "trained,random_init,pixels,noise",
            "--mnist-root", str(tmp_path / "mnist"), "--out", str(out),
            "--figure", str(figure), "--figure-rows", "2"]  # fmt: skip
    assert _bench().main(args) == 0
    result = json.loads(out.with_suffix(".json").read_text())
    assert set(result["miou"]) == {"trained", "random_init", "pixels"}
    assert list(result["iou"]["pixels"]) == list(DIGIT_SEGMENTATION_CLASSES)
    noise = result["heads"]["linear"]["noise"]
    digits = [noise["iou"][str(d)] for d in range(10)]
    assert digits.count(None) == 8 and max(v or 0 for v in digits) <= 0.05  # background only
    assert result["miou"]["pixels"] >= noise["miou"] + 0.2, result["miou"]
    assert result["heads"]["linear"]["pixels"]["grid"] == [8, 8]
    assert result["heads"]["linear"]["pixels"]["channels"] == 49
    table = out.with_suffix(".md").read_text()
    assert "| linear | pixels |" in table and "`python bench/dense_probe_mnist.py " in table
    assert figure.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    with pytest.raises(SystemExit, match="unknown colour"):
        _bench().main([str(tmp_path / "run"), "--sources", "pixels,colour"])
    # a model that does not read 28 px grey digits is refused in one line, before any work
    vitkit.save_checkpoint(tmp_path / "rgb", vitkit.create_model("Ti/4", **{**TINY, "in_chans": 3}))
    with pytest.raises(SystemExit, match=r"rgb: a model of 28 x 28 grey digits .* 3 channel"):
        _bench().main([str(tmp_path / "rgb"), "--mnist-root", str(tmp_path / "nowhere")])
