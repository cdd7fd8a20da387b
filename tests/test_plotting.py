"""The figures are real PNGs with something drawn on them; metrics.jsonl survives a crash."""

from __future__ import annotations

import json

import numpy as np
import pytest
from PIL import Image

from vitkit.errors import VitkitError
from vitkit.plotting import plot_confusion_matrix, plot_training_curves, read_jsonl


def assert_drawn_png(path, min_side=200):
    with Image.open(path) as im:
        assert im.format == "PNG"
        im.verify()
    with Image.open(path) as im:
        assert min(im.size) >= min_side
        pixels = np.asarray(im.convert("RGB"), dtype=np.uint32)
    assert pixels.astype(np.float64).std() > 0  # not a blank canvas
    # Many colours (axes, anti-aliased text, data), not one line on a flat background.
    packed = (pixels[..., 0] << 16) | (pixels[..., 1] << 8) | pixels[..., 2]
    assert len(np.unique(packed)) > 10


def assert_only_file(folder, name):
    assert sorted(p.name for p in folder.iterdir()) == [name]  # no temp file left behind


def training_records(n=40):
    records = []
    for step in range(0, n * 10, 10):
        record = {"step": step, "epoch": step // 100, "train_loss": 2.0 / (1 + step / 50)}
        record["train_acc"] = 1 - record["train_loss"] / 2.5
        record["lr"] = 1e-3 * min(1.0, (step + 10) / 100)
        record["images_per_s"] = 500.0 + step % 7
        if step % 50 == 0:
            record.update(val_loss=record["train_loss"] * 1.1, val_top1=record["train_acc"] * 0.9)
        records.append(record)
    return records


@pytest.mark.parametrize("normalize", [True, False])
def test_confusion_matrix_png(tmp_path, normalize):
    rng = np.random.default_rng(0)
    confusion = rng.integers(0, 20, size=(5, 5)) + np.diag([30] * 5)
    confusion[4] = 0  # a class with no samples must not break row normalisation
    path = plot_confusion_matrix(
        confusion, ["a", "b", "c", "d", "e"], tmp_path / "cm.png", normalize=normalize
    )
    assert path == tmp_path / "cm.png"
    assert_drawn_png(path)
    assert_only_file(tmp_path, "cm.png")


def test_confusion_matrix_many_classes_and_overwrite(tmp_path):
    k = 60  # beyond annotation and tick-label limits
    confusion = np.eye(k, dtype=np.int64) * 5 + 1
    path = tmp_path / "sub" / "cm.png"
    plot_confusion_matrix(confusion, [f"class{i}" for i in range(k)], path, title="big")
    first = path.read_bytes()
    plot_confusion_matrix(confusion * 2, [f"class{i}" for i in range(k)], path, normalize=False)
    assert path.read_bytes() != first  # replaced in place
    assert_drawn_png(path)
    assert_only_file(path.parent, "cm.png")


def test_confusion_matrix_rejects_bad_input(tmp_path):
    with pytest.raises(VitkitError):
        plot_confusion_matrix(np.zeros((3, 3)), ["a", "b"], tmp_path / "x.png")
    with pytest.raises(VitkitError):
        plot_confusion_matrix(np.zeros((3, 2)), ["a", "b", "c"], tmp_path / "x.png")
    assert list(tmp_path.iterdir()) == []


def test_training_curves_png(tmp_path):
    path = plot_training_curves(training_records(), tmp_path / "curves.png", title="run")
    assert_drawn_png(path)
    assert_only_file(tmp_path, "curves.png")
    with Image.open(path) as im:
        wide, tall = im.size
    assert tall > 0.6 * wide  # four panels: a 2x2 grid


def test_training_curves_single_record_and_missing_keys(tmp_path):
    path = plot_training_curves([{"step": 0, "train_loss": 2.3}], tmp_path / "one.png")
    assert_drawn_png(path)
    only_lr = [{"step": s, "lr": 0.1 * s} for s in range(5)] + [{"final": True}]
    assert_drawn_png(plot_training_curves(only_lr, tmp_path / "lr.png"))
    with pytest.raises(VitkitError, match="nothing to plot"):
        plot_training_curves([{"step": 1, "unknown": 3.0}], tmp_path / "none.png")
    assert not (tmp_path / "none.png").exists()


def test_read_jsonl_skips_truncated_last_line(tmp_path):
    records = training_records(5)
    text = "".join(json.dumps(r) + "\n" for r in records)
    path = tmp_path / "metrics.jsonl"
    path.write_text(text + '{"step": 50, "train_lo')  # killed mid-write
    assert read_jsonl(path) == records
    path.write_text(text + "\n\n")  # blank lines are fine
    assert read_jsonl(path) == records
    path.write_bytes(text.encode() + '{"name": "caf\u00e9'.encode()[:-1])  # cut inside a UTF-8 char
    assert read_jsonl(path) == records
    path.write_text("")
    assert read_jsonl(path) == []


def test_read_jsonl_corruption_in_the_middle_raises(tmp_path):
    path = tmp_path / "metrics.jsonl"
    path.write_text('{"step": 0}\n{"step": 1\n{"step": 2}\n')
    with pytest.raises(VitkitError, match=":2:"):
        read_jsonl(path)
    with pytest.raises(VitkitError, match="not found"):
        read_jsonl(tmp_path / "missing.jsonl")


def test_read_jsonl_round_trips_into_plot(tmp_path):
    path = tmp_path / "metrics.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in training_records()) + '{"st')
    out = plot_training_curves(read_jsonl(path), tmp_path / "curves.png")
    assert_drawn_png(out)
