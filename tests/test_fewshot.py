"""The paper's few-shot linear evaluation: the closed form, the sampling, and the command."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

import vitkit
from vitkit.checkpoints import save_checkpoint
from vitkit.cli import main
from vitkit.errors import VitkitError
from vitkit.eval.fewshot import fewshot_evaluate, fit_ridge, sample_per_class


def test_closed_form_equals_sklearn_ridge_on_standardised_features():
    from sklearn.linear_model import Ridge

    g = torch.Generator().manual_seed(0)
    x = torch.randn(30, 50, generator=g, dtype=torch.float64) * 3 + 1
    y = torch.arange(30) % 4
    z = torch.randn(7, 50, generator=g, dtype=torch.float64)
    for l2 in (0.1, 3.0, 100.0):
        ours = fit_ridge(x, y, 4, l2)(z).numpy()
        mean, std = x.mean(0), x.std(0, unbiased=False) + 1e-5
        targets = 2 * np.eye(4)[y.numpy()] - 1
        ref = Ridge(alpha=l2, fit_intercept=True, solver="cholesky").fit(
            ((x - mean) / std).numpy(), targets
        )
        assert np.abs(ours - ref.predict(((z - mean) / std).numpy())).max() < 1e-9


def test_sampling_is_per_class_disjoint_and_seeded():
    labels = torch.arange(100) % 5
    a = sample_per_class(labels, 3, 5, seed=1)
    assert torch.equal(a, sample_per_class(labels, 3, 5, seed=1))
    assert not torch.equal(a, sample_per_class(labels, 3, 5, seed=2))
    assert torch.bincount(labels[a], minlength=5).tolist() == [3] * 5
    b = sample_per_class(labels, 17, 5, seed=1, exclude=a)
    assert not set(a.tolist()) & set(b.tolist())
    with pytest.raises(VitkitError, match="class 0 has 17 training images available"):
        sample_per_class(labels, 18, 5, seed=0, exclude=a)


def test_separable_features_are_solved_from_one_shot_and_noise_is_not():
    g = torch.Generator().manual_seed(0)
    centres = torch.randn(6, 32, generator=g) * 10
    ytr, yte = torch.arange(600) % 6, torch.arange(300) % 6
    xtr = centres[ytr] + torch.randn(600, 32, generator=g)
    xte = centres[yte] + torch.randn(300, 32, generator=g)
    res = fewshot_evaluate((xtr, ytr), (xte, yte), 6, shots=(1, 5), seeds=3)
    assert [r.shots for r in res] == [1, 5]
    assert all(r.mean == 1.0 and len(r.accuracies) == 3 for r in res)
    noise = fewshot_evaluate((torch.randn(600, 32, generator=g), ytr), (xte, yte), 6, (5,), 5)
    assert noise[0].mean < 0.4  # chance is 1/6


def test_fewshot_command_end_to_end(tmp_path, capsys):
    model = vitkit.create_model(
        "Ti/2",
        image_size=8,
        in_chans=1,
        num_classes=10,
        width=32,
        depth=1,
        num_heads=2,
        mlp_dim=64,
        representation_size=16,
    )
    save_checkpoint(tmp_path / "ck", model)
    out = tmp_path / "fs.json"
    args = [
        "fewshot",
        "--from",
        str(tmp_path / "ck"),
        "--data",
        "digits",
        "--shots",
        "1,5",
        "--seeds",
        "2",
        "--out",
        str(out),
    ]
    assert main(args) == 0
    printed = capsys.readouterr().out
    assert "mean ± std over 2 seeds" in printed
    got = json.loads(out.read_text())
    assert [r["shots"] for r in got["results"]] == [1, 5]
    for r in got["results"]:
        assert len(r["accuracies"]) == 2 and all(0.0 <= a <= 1.0 for a in r["accuracies"])
        assert r["mean"] == pytest.approx(float(np.mean(r["accuracies"])))
    # The command computes exactly what the library functions give on the same features.
    from vitkit.data import load_dataset, to_model_input
    from vitkit.eval.fewshot import fewshot_evaluate as evaluate

    def feats(split):
        data = load_dataset("digits", split, image_size=8, train_transform=False)
        x, y = data.get_batch(torch.arange(len(data)))[:2]
        with torch.no_grad():
            f = model.eval().forward_head(
                model.forward_features(to_model_input(x, (8, 8), 1)), pre_logits=True
            )
        return f.double(), y

    ref = evaluate(feats("train"), feats("test"), 10, (1, 5), 2)
    assert [r.accuracies for r in ref] == [r["accuracies"] for r in got["results"]]
    assert main(args[:-2] + ["--random-init", "--l2", "1.0"]) == 0
    assert (
        main(["fewshot", "--from", str(tmp_path / "ck"), "--data", "digits", "--shots", "1,x"]) == 2
    )
