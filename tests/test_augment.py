"""RandAugment, Mixup / CutMix and weight averaging: checked with numbers."""

from __future__ import annotations

import pytest
import torch

from vitkit.train.augment import OPS, apply_op, mix, rand_augment
from vitkit.train.ema import WeightAverage


def batch(n=8, c=3, size=16, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, 256, (n, c, size, size), generator=g, dtype=torch.uint8)


def test_rand_augment_is_seeded_shape_preserving_and_zero_magnitude_keeps_geometry():
    x = batch()
    a = rand_augment(x, 2, 10, torch.Generator().manual_seed(1))
    b = rand_augment(x, 2, 10, torch.Generator().manual_seed(1))
    assert torch.equal(a, b) and a.dtype == torch.uint8 and a.shape == x.shape
    assert not torch.equal(a, rand_augment(x, 2, 10, torch.Generator().manual_seed(2)))
    ones = torch.ones(4)
    for op in (
        "rotate",
        "shear_x",
        "shear_y",
        "translate_x",
        "translate_y",
        "color",
        "contrast",
        "brightness",
        "sharpness",
        "identity",
    ):
        assert torch.allclose(apply_op(x.float()[:4], op, 0.0, ones), x.float()[:4]), op


def test_individual_ops_do_what_they_say():
    x = batch(4, 3).float()
    ones = torch.ones(4)
    assert torch.equal(apply_op(x, "solarize", 1.0, ones), 255 - x)  # threshold 0: invert all
    assert (apply_op(x, "posterize", 1.0, ones).long() % 16 == 0).all()  # 4 bits kept
    ac = apply_op(x, "autocontrast", 0.0, ones)
    assert (ac.amin(dim=(2, 3)) == 0).all()
    assert torch.allclose(ac.amax(dim=(2, 3)), torch.full((4, 3), 255.0))
    gray = apply_op(x, "color", 1.0 / 0.9, -ones)  # factor 0: fully desaturated
    assert torch.allclose(gray[:, 0], gray[:, 1], atol=1e-4)
    shifted = apply_op(x, "translate_x", 1.0, ones)  # content moves 45 % of the width
    assert (shifted[..., :, 10:] == 128).all() and torch.equal(shifted[..., :, :8], x[..., :, 7:15])
    eq = apply_op(x, "equalize", 0.0, ones)
    hist = torch.histc(eq[0, 0], bins=4, min=0, max=255)
    assert hist.min() > 0.1 * hist.sum()  # spread over the whole range
    assert set(OPS) >= {"rotate", "equalize", "translate_y"}


def test_mixup_blends_images_and_targets_with_the_same_lambda():
    x = batch(6).float()
    t = torch.eye(6)
    mx, mt = mix(
        x, t, mixup_alpha=0.8, cutmix_alpha=0.0, generator=torch.Generator().manual_seed(0)
    )
    lam = float(mt[0, 0])
    assert torch.allclose(mx, lam * x + (1 - lam) * x.flip(0), atol=1e-4)
    assert torch.allclose(mt.sum(1), torch.ones(6))


def test_cutmix_pastes_a_box_whose_area_is_the_target_weight():
    x = torch.zeros(2, 1, 20, 20)
    x[1] = 1.0
    t = torch.eye(2)
    for seed in range(10):
        mx, mt = mix(
            x, t, mixup_alpha=0.0, cutmix_alpha=1.0, generator=torch.Generator().manual_seed(seed)
        )
        pasted = float(mx[0].mean())  # share of image 0 taken from image 1
        assert mt[0, 1] == pytest.approx(pasted, abs=1e-6)
        assert mt[0, 0] == pytest.approx(1 - pasted, abs=1e-6)


def test_weight_average_is_the_exponential_moving_average():
    model = torch.nn.Linear(3, 2)
    avg = WeightAverage(model, decay=0.9)
    w0 = model.weight.detach().clone()
    expected = w0.clone()
    for _ in range(5):
        with torch.no_grad():
            model.weight.add_(1.0)
        avg.update(model)
        expected = 0.9 * expected + 0.1 * model.weight.detach()
    assert torch.allclose(avg.averaged_model(model).weight, expected, atol=1e-6)
    assert torch.allclose(model.weight, w0 + 5)  # the model itself is untouched
