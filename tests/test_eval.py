"""Classification evaluation against references computed by hand or directly with torch."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch import nn

from vitkit.errors import VitkitError
from vitkit.eval import (
    ClassificationEvaluator,
    ClassificationResult,
    evaluate_classification,
    format_result,
    topk_correct,
)


class ListLoader:
    """The loader contract in memory: (uint8 images, int64 labels, n_skipped) per batch."""

    def __init__(self, images, labels, batch_size, skipped=None):
        self.images, self.labels, self.batch_size = images, labels, batch_size
        self.skipped = skipped

    def __len__(self):
        return math.ceil(len(self.labels) / self.batch_size)

    def __iter__(self):
        for b, start in enumerate(range(0, len(self.labels), self.batch_size)):
            stop = start + self.batch_size
            n_skipped = self.skipped[b] if self.skipped is not None else 0
            yield self.images[start:stop], self.labels[start:stop], n_skipped


class Recorder(nn.Module):
    """Wraps a model and records the state it was called in."""

    def __init__(self, inner):
        super().__init__()
        self.inner = inner
        self.seen_training = []
        self.seen_inference_mode = []
        self.seen_dtypes = []

    def forward(self, x):
        self.seen_training.append(self.training)
        self.seen_inference_mode.append(torch.is_inference_mode_enabled())
        out = self.inner(x)
        self.seen_dtypes.append(out.dtype)
        return out


def random_dataset(n=150, num_classes=6, seed=0, label_classes=None):
    g = torch.Generator().manual_seed(seed)
    images = torch.randint(0, 256, (n, 3, 4, 4), dtype=torch.uint8, generator=g)
    high = num_classes if label_classes is None else label_classes
    labels = torch.randint(0, high, (n,), generator=g)
    return images, labels


def linear_model(num_classes=6, seed=0):
    torch.manual_seed(seed)
    return nn.Sequential(nn.Flatten(), nn.Linear(3 * 4 * 4, num_classes))


def reference(model, images, labels):
    """Metrics straight from torch on the whole tensor at once."""
    with torch.no_grad():
        logits = model(images.float() / 127.5 - 1).double()
    loss = F.cross_entropy(logits, labels).item()
    top1 = (logits.argmax(1) == labels).double().mean().item()
    k = min(5, logits.shape[1])
    top5 = (logits.topk(k, 1).indices == labels[:, None]).any(1).double().mean().item()
    return loss, top1, top5, logits.argmax(1)


# --- topk_correct -------------------------------------------------------------------------


def test_topk_one_hot_predictions_count_matches_loop():
    g = torch.Generator().manual_seed(1)
    num_classes, n = 7, 40
    preds = torch.randint(0, num_classes, (n,), generator=g)
    labels = torch.randint(0, num_classes, (n,), generator=g)
    logits = F.one_hot(preds, num_classes).float()
    expected = sum(int(p) == int(y) for p, y in zip(preds, labels, strict=True))
    assert 0 < expected < n  # the case must be able to fail both ways
    assert topk_correct(logits, labels, ks=(1,)) == {1: expected}


def test_topk_known_ranking():
    # Each row is a permutation of distinct scores, so the label's rank is known exactly.
    g = torch.Generator().manual_seed(2)
    num_classes, n = 10, 60
    logits = torch.stack([torch.randperm(num_classes, generator=g).float() for _ in range(n)])
    labels = torch.randint(0, num_classes, (n,), generator=g)
    counts = topk_correct(logits, labels, ks=(1, 3, 5))
    for k in (1, 3, 5):
        expected = 0
        for row, y in zip(logits.tolist(), labels.tolist(), strict=True):
            rank = sum(v > row[y] for v in row)  # how many classes score above the label
            expected += rank < k
        assert counts[k] == expected, k
    assert counts[1] < counts[3] < counts[5] < n


def test_topk_k_larger_than_num_classes_is_clamped():
    logits = torch.tensor([[0.1, 0.9, 0.0], [2.0, 1.0, 0.0]])
    labels = torch.tensor([2, 2])
    assert topk_correct(logits, labels, ks=(1, 2, 5)) == {1: 0, 2: 0, 5: 2}


# --- evaluate_classification --------------------------------------------------------------


def test_matches_reference_computation():
    images, labels = random_dataset()
    model = linear_model()
    result = evaluate_classification(model, ListLoader(images, labels, 32), 6)
    loss, top1, top5, preds = reference(model, images, labels)
    assert result.num_samples == len(labels)
    assert result.loss == pytest.approx(loss, rel=1e-6)
    assert result.top1 == pytest.approx(top1, abs=1e-12)
    assert result.top5 == pytest.approx(top5, abs=1e-12)
    assert 0 < result.top1 < result.top5 < 1  # not a degenerate case

    expected = np.zeros((6, 6), dtype=np.int64)
    for y, p in zip(labels.tolist(), preds.tolist(), strict=True):
        expected[y, p] += 1  # rows = true class, columns = predicted
    np.testing.assert_array_equal(result.confusion, expected)
    assert result.confusion.dtype == np.int64
    assert result.confusion.sum() == len(labels)
    assert np.trace(result.confusion) / len(labels) == pytest.approx(result.top1)


def test_per_class_accuracy_and_empty_class_is_nan():
    images, labels = random_dataset(n=120, num_classes=6, label_classes=5)  # class 5 unused
    model = linear_model()
    result = evaluate_classification(model, ListLoader(images, labels, 16), 6)
    _, _, _, preds = reference(model, images, labels)
    for c in range(5):
        mask = labels == c
        manual = (preds[mask] == c).double().mean().item()
        assert result.per_class_accuracy[c] == pytest.approx(manual), c
    assert math.isnan(result.per_class_accuracy[5])
    assert len(result.per_class_accuracy) == 6


def test_batch_size_independence():
    images, labels = random_dataset(n=200)
    model = linear_model()
    small = evaluate_classification(model, ListLoader(images, labels, 7), 6)
    large = evaluate_classification(model, ListLoader(images, labels, 64), 6)
    np.testing.assert_array_equal(small.confusion, large.confusion)
    assert small.top1 == large.top1
    assert small.top5 == large.top5
    assert small.loss == pytest.approx(large.loss, rel=1e-6)
    assert small.per_class_accuracy == large.per_class_accuracy


@pytest.mark.parametrize("start_training", [True, False])
def test_eval_mode_inference_mode_and_mode_restored(start_training):
    images, labels = random_dataset(n=20)
    model = Recorder(linear_model())
    model.train(start_training)
    evaluate_classification(model, ListLoader(images, labels, 8), 6)
    assert model.seen_training == [False] * 3
    assert model.seen_inference_mode == [True] * 3
    assert model.training is start_training
    assert all(m.training is start_training for m in model.modules())


def test_mixed_submodule_modes_restored_exactly():
    images, labels = random_dataset(n=10)
    model = Recorder(linear_model())
    model.train()
    model.inner.eval()  # e.g. a frozen backbone inside a training model
    evaluate_classification(model, ListLoader(images, labels, 8), 6)
    assert model.training is True
    assert model.inner.training is False


def test_mode_restored_when_model_raises():
    class Broken(nn.Module):
        def forward(self, x):
            raise RuntimeError("boom")

    model = Broken().train()
    images, labels = random_dataset(n=4)
    with pytest.raises(RuntimeError, match="boom"):
        evaluate_classification(model, ListLoader(images, labels, 4), 6)
    assert model.training is True


def test_bf16_autocast_runs_and_is_close_to_fp32():
    # Well-separated classes: each image is its class's +-1 pattern plus a little noise, and
    # the model is the matched filter, so the margin dwarfs bf16 rounding.
    g = torch.Generator().manual_seed(3)
    num_classes, n, dim = 5, 100, 3 * 4 * 4
    protos = torch.randint(0, 2, (num_classes, dim), generator=g).float() * 2 - 1
    labels = torch.randint(0, num_classes, (n,), generator=g)
    pixels = 127.5 + 100 * protos[labels] + 10 * torch.randn(n, dim, generator=g)
    images = pixels.clamp(0, 255).round().to(torch.uint8).reshape(n, 3, 4, 4)
    linear = nn.Linear(dim, num_classes, bias=False)
    with torch.no_grad():
        linear.weight.copy_(protos * 4 / dim)
    model = Recorder(nn.Sequential(nn.Flatten(), linear))

    fp32 = evaluate_classification(model, ListLoader(images, labels, 32), num_classes)
    assert set(model.seen_dtypes) == {torch.float32}
    model.seen_dtypes.clear()
    bf16 = evaluate_classification(
        model, ListLoader(images, labels, 32), num_classes, autocast_dtype=torch.bfloat16
    )
    assert set(model.seen_dtypes) == {torch.bfloat16}  # autocast really was on
    assert fp32.top1 == 1.0
    assert bf16.top1 == fp32.top1
    np.testing.assert_array_equal(bf16.confusion, fp32.confusion)
    assert bf16.loss == pytest.approx(fp32.loss, rel=0.05, abs=1e-3)


def test_n_skipped_summed_and_max_batches():
    images, labels = random_dataset(n=40)
    loader = ListLoader(images, labels, 10, skipped=[1, 0, 2, 4])
    full = evaluate_classification(linear_model(), loader, 6)
    assert full.n_skipped == 7
    assert full.num_samples == 40
    first_two = evaluate_classification(linear_model(), loader, 6, max_batches=2)
    assert first_two.num_samples == 20
    assert first_two.n_skipped == 1


def test_custom_prepare_is_used():
    images, labels = random_dataset(n=30)
    model = linear_model()
    calls = []

    def prepare(x):
        calls.append(x.dtype)
        return x.float() / 255.0

    result = evaluate_classification(model, ListLoader(images, labels, 10), 6, prepare=prepare)
    assert calls == [torch.uint8] * 3
    with torch.no_grad():
        expected = F.cross_entropy(model(images.float() / 255.0).double(), labels).item()
    assert result.loss == pytest.approx(expected, rel=1e-6)


def test_progress_bar_path(capsys):
    images, labels = random_dataset(n=30)
    result = evaluate_classification(
        linear_model(), ListLoader(images, labels, 10), 6, progress=True
    )
    assert result.num_samples == 30
    # A loader with no len() (a plain generator) works too, cut by max_batches.
    generator = iter(ListLoader(images, labels, 10))
    result = evaluate_classification(linear_model(), generator, 6, progress=True, max_batches=2)
    assert result.num_samples == 20
    assert capsys.readouterr().out == ""  # the bar goes to stderr, never stdout


def test_bad_inputs_raise_vitkit_error():
    images, labels = random_dataset(n=10)
    model = linear_model(num_classes=6)
    with pytest.raises(VitkitError, match="logits of shape"):
        evaluate_classification(model, ListLoader(images, labels % 4, 5), 4)
    with pytest.raises(VitkitError, match="labels must be in"):
        evaluate_classification(model, ListLoader(images, labels + 6, 5), 6)
    with pytest.raises(VitkitError, match="no samples"):
        evaluate_classification(model, ListLoader(images[:0], labels[:0], 5), 6)


# --- result, evaluator, report ------------------------------------------------------------


def test_result_metrics_and_json():
    images, labels = random_dataset(n=50, num_classes=6, label_classes=5)
    loader = ListLoader(images, labels, 16, skipped=[0, 1, 0, 2])
    result = evaluate_classification(linear_model(), loader, 6)
    metrics = result.metrics()
    assert set(metrics) == {"loss", "top1", "top5", "num_samples", "n_skipped"}
    assert all(isinstance(v, float) for v in metrics.values())
    assert metrics["num_samples"] == 50.0 and metrics["n_skipped"] == 3.0

    data = json.loads(json.dumps(result.to_json_dict(), allow_nan=False))
    assert data["confusion"] == result.confusion.tolist()
    assert data["per_class_accuracy"][5] is None  # NaN -> null
    assert data["top1"] == result.top1

    with pytest.raises(AttributeError):
        result.top1 = 0.0  # type: ignore[misc]
    with pytest.raises(ValueError):
        result.confusion[0, 0] = 1  # the array is read-only too


def test_result_validates_shapes():
    with pytest.raises(VitkitError):
        ClassificationResult(1, 0.0, 1.0, 1.0, (1.0,), np.zeros((2, 2)), 0)


def test_evaluator_protocol():
    images, labels = random_dataset(n=40)
    model = linear_model()
    evaluator = ClassificationEvaluator(ListLoader(images, labels, 16), 6, prefix="val_")
    assert evaluator.last_result is None
    metrics = evaluator.run(model)
    assert set(metrics) == {"val_top1", "val_top5", "val_loss"}
    direct = evaluate_classification(model, ListLoader(images, labels, 16), 6)
    assert metrics["val_top1"] == direct.top1
    assert metrics["val_loss"] == pytest.approx(direct.loss)
    assert evaluator.last_result is not None
    np.testing.assert_array_equal(evaluator.last_result.confusion, direct.confusion)


def test_format_result():
    confusion = np.array([[3, 1, 0], [0, 2, 0], [0, 0, 0]])
    result = ClassificationResult(
        num_samples=6,
        loss=0.25,
        top1=5 / 6,
        top5=1.0,
        per_class_accuracy=(0.75, 1.0, float("nan")),
        confusion=confusion,
        n_skipped=2,
    )
    text = format_result(result, ["cat", "dog", "hippopotamus"])
    assert "83.33%" in text and "100.00%" in text and "0.2500" in text
    assert "2 skipped" in text
    rows = {line.split()[0]: line.split()[1:] for line in text.splitlines() if line.strip()}
    assert rows["cat"] == ["4", "3", "75.00%"]
    assert rows["dog"] == ["2", "2", "100.00%"]
    assert rows["hippopotamus"] == ["0", "0", "n/a"]
    with pytest.raises(VitkitError):
        format_result(result, ["cat", "dog"])
