"""Self-supervised pre-training: masked patch prediction (corruption, targets, loss), MAE
(visible-only encoder), the Pretrainer (resume, checkpoint) and pretrain -> finetune -> fewshot
on the command line."""

from __future__ import annotations

import dataclasses
import json
import math
import shutil
from pathlib import Path

import pytest
import torch

from vitkit.checkpoints import LATEST, load_checkpoint, load_model
from vitkit.cli import main
from vitkit.data import load_dataset
from vitkit.errors import VitkitError
from vitkit.models.vit import VisionTransformer
from vitkit.registry.model_config import ViTConfig
from vitkit.selfsup import (
    MAEConfig,
    MaskedAutoencoder,
    MaskedPatchPrediction,
    MPPConfig,
    apply_corruption,
    corruption_plan,
    downsized_target,
    encode_visible,
    mean_color_target,
    patchify,
    random_masking,
    unpatchify,
)
from vitkit.train.pretrain import Pretrainer
from vitkit.train.recipes import MNIST_MAE, MNIST_MPP, smoke
from vitkit.train.trainer import TrainConfig, Trainer

ENC = ViTConfig(
    image_size=16, patch_size=4, in_chans=3, num_classes=0, width=32, depth=2, num_heads=2,
    mlp_dim=64,
)  # fmt: skip


def gen(seed: int = 0) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


# ----- corruption ------------------------------------------------------------------------------


def test_corruption_proportions_hold_on_a_large_batch() -> None:
    b, n = 512, 196
    plan = corruption_plan(b, n, gen(), ratio=0.5, mask_prob=0.8, random_prob=0.1)
    assert (plan.corrupted.sum(1) == 98).all()  # exactly half of every image's patches
    assert not (plan.masked & plan.replaced).any()
    assert not ((plan.masked | plan.replaced) & ~plan.corrupted).any()
    m = int(plan.corrupted.sum())
    for part, p in ((plan.masked, 0.8), (plan.replaced, 0.1), (plan.kept, 0.1)):
        frac = int(part.sum()) / m
        sigma = math.sqrt(p * (1 - p) / m)
        assert abs(frac - p) < 5 * sigma, (p, frac)
    own = torch.arange(b * n).reshape(b, n)
    assert not (plan.donor == own).any()  # "another" patch, never itself
    from_other_image = (plan.donor // n != own // n).float().mean()
    assert abs(float(from_other_image) - (b - 1) * n / (b * n - 1)) < 0.01
    # Patch positions are corrupted uniformly.
    per_position = plan.corrupted.float().mean(0)
    assert per_position.min() > 0.5 - 5 * math.sqrt(0.25 / b)
    assert per_position.max() < 0.5 + 5 * math.sqrt(0.25 / b)


def test_corruption_is_reproducible_and_ratio_is_respected() -> None:
    a, b = corruption_plan(4, 49, gen(3)), corruption_plan(4, 49, gen(3))
    assert torch.equal(a.corrupted, b.corrupted) and torch.equal(a.donor, b.donor)
    assert (corruption_plan(8, 49, gen(), ratio=0.15).corrupted.sum(1) == 7).all()
    with pytest.raises(VitkitError, match="at least one"):
        corruption_plan(2, 4, gen(), ratio=0.1)


def test_apply_corruption_replaces_exactly_what_the_plan_says() -> None:
    b, n, d = 6, 16, 8
    patches = torch.randn(b, n, d)
    token = torch.randn(d)
    plan = corruption_plan(b, n, gen(1), mask_prob=0.5, random_prob=0.3)
    out = apply_corruption(patches, plan, token)
    flat = patches.reshape(b * n, d)
    for i in range(b):
        for j in range(n):
            if plan.masked[i, j]:
                expected = token
            elif plan.replaced[i, j]:
                expected = flat[plan.donor[i, j]]
            else:  # kept or not corrupted
                expected = patches[i, j]
            assert torch.equal(out[i, j], expected)
    assert plan.kept.any() and plan.replaced.any() and plan.masked.any()


# ----- targets ---------------------------------------------------------------------------------


def test_three_bit_mean_colour_of_constructed_patches_is_exact() -> None:
    g = gen(5)
    b, grid, p = 3, 4, 4
    levels = torch.randint(0, 8, (b, 3, grid, grid), generator=g)
    # Each patch: a checkerboard of two values whose mean is (level + 0.5) / 8 in each channel.
    mean = (levels.float() + 0.5) / 8
    delta = torch.rand(b, 3, grid, grid, generator=g) * torch.minimum(mean, 1 - mean)
    checker = (torch.arange(p)[:, None] + torch.arange(p)[None, :]) % 2 * 2 - 1  # ±1, mean 0
    pixels = (mean + 0 * delta).repeat_interleave(p, 2).repeat_interleave(p, 3)
    pixels = pixels + delta.repeat_interleave(p, 2).repeat_interleave(p, 3) * checker.repeat(
        grid, grid
    )
    target = mean_color_target(pixels, (p, p), bits=3)
    r, gg, bb = levels.flatten(2).unbind(1)  # [B, N] each, row-major patches
    assert torch.equal(target, r * 64 + gg * 8 + bb)
    assert int(target.max()) < 512


def test_mean_colour_level_edges_and_grayscale() -> None:
    # Level boundaries: [k/8, (k+1)/8) -> k, and 1.0 (white) -> 7.
    values = torch.tensor([0.0, 0.1249, 0.125, 0.5, 0.8749, 0.875, 1.0])
    pixels = values.view(1, 1, 1, -1).repeat_interleave(2, 2).repeat_interleave(2, 3)
    target = mean_color_target(pixels, (2, 2), bits=3)
    assert target.tolist() == [[0, 0, 1, 4, 6, 7, 7]]
    # uint8 images: 255 / 255 is white; a patch of 0 and 255 halves has mean 0.5 -> level 4.
    img = torch.zeros(1, 1, 2, 4)
    img[..., :, 1] = 1.0
    img[..., :, 2:] = 255 / 255
    assert mean_color_target(img, (2, 2)).tolist() == [[4, 7]]
    assert mean_color_target(torch.ones(1, 1, 4, 4), (4, 4), bits=1).tolist() == [[1]]


def test_downsized_target_quantises_every_cell() -> None:
    p, cells = 8, 4  # 8x8 patches downsized to 4x4 cells of 2x2 pixels
    levels = torch.randint(0, 8, (2, 3, 2 * cells, 2 * cells), generator=gen(2))
    pixels = ((levels.float() + 0.5) / 8).repeat_interleave(2, 2).repeat_interleave(2, 3)
    target = downsized_target(pixels, (p, p), grid=cells, bits=3)  # [B, 4 patches, 16 cells]
    assert target.shape == (2, 4, 16)
    for i, (pr, pc) in enumerate([(0, 0), (0, 1), (1, 0), (1, 1)]):
        block = levels[:, :, pr * cells : (pr + 1) * cells, pc * cells : (pc + 1) * cells]
        r, g, b = block.flatten(2).unbind(1)
        assert torch.equal(target[:, i], r * 64 + g * 8 + b)


def test_patchify_matches_the_patch_embedding() -> None:
    model = VisionTransformer(ENC)
    x = torch.randn(2, 3, 16, 16)
    proj = model.patch_embed.proj
    expected = patchify(x, (4, 4)) @ proj.weight.reshape(32, -1).T + proj.bias
    torch.testing.assert_close(model.patch_embed(x), expected, rtol=1e-5, atol=1e-5)
    assert torch.equal(unpatchify(patchify(x, (4, 4)), (4, 4), (4, 4)), x)
    torch.testing.assert_close(
        model.encode(model.embed_patches(model.patch_embed(x))), model.forward_features(x)
    )


# ----- the MPP loss counts corrupted patches only ----------------------------------------------


@pytest.mark.parametrize("target", ["mean-color", "downsized", "pixels"])
def test_mpp_loss_counts_only_corrupted_patches(target: str) -> None:
    torch.manual_seed(0)
    obj = MaskedPatchPrediction(MPPConfig(target=target, grid=2), ENC)
    b, n = 4, ENC.num_patches
    x = torch.rand(b, 3, 16, 16) * 2 - 1
    targets = obj.targets(x, (x + 1) / 2)
    plan = corruption_plan(b, n, gen(7))
    tokens = torch.randn(b, n, 32, requires_grad=True)
    loss, _ = obj.loss(tokens, targets, plan.corrupted)
    loss.backward()
    grad_norm = tokens.grad.norm(dim=-1)
    assert (grad_norm[~plan.corrupted] == 0).all()
    assert (grad_norm[plan.corrupted] > 0).all()
    # Other targets at the uncorrupted patches: the same loss; at a corrupted one: another.
    changed = targets.clone()
    if target == "pixels":
        changed[~plan.corrupted] += 5.0
    else:
        changed[~plan.corrupted] = (changed[~plan.corrupted] + 3) % obj.num_colors
    with torch.no_grad():
        same, _ = obj.loss(tokens, changed, plan.corrupted)
        i, j = map(int, torch.nonzero(plan.corrupted)[0])
        changed[i, j] = changed[i, j] + 1 if target == "pixels" else (changed[i, j] + 1) % 8
        other, _ = obj.loss(tokens, changed, plan.corrupted)
    assert float(same) == float(loss.detach())
    assert float(other) != float(loss.detach())


def test_mpp_objective_trains_the_encoder_and_its_own_weights() -> None:
    torch.manual_seed(0)
    enc = VisionTransformer(ENC)
    obj = MaskedPatchPrediction(MPPConfig(), ENC)
    x = torch.rand(4, 3, 16, 16) * 2 - 1
    loss, correct, counted = obj(enc, x, (x + 1) / 2, gen())
    assert counted == 4 * 8 and 0 <= float(correct) <= counted
    assert math.isfinite(loss.item()) and obj.head.out_features == 512
    loss.backward()
    assert obj.mask_token.grad.abs().sum() > 0 and enc.patch_embed.proj.weight.grad is not None
    gray = MaskedPatchPrediction(MPPConfig(), ENC.replace(in_chans=1))
    assert gray.head.out_features == 8  # grayscale: 3-bit mean intensity
    with pytest.raises(VitkitError, match="grid=3"):
        MaskedPatchPrediction(MPPConfig(target="downsized", grid=3), ENC)


# ----- MAE -------------------------------------------------------------------------------------


def test_random_masking_keeps_an_exact_sorted_visible_set() -> None:
    visible, hidden = random_masking(16, 49, 0.75, gen())
    assert visible.shape == (16, 12) and (hidden.sum(1) == 37).all()
    assert (visible.diff(dim=1) > 0).all()
    assert not hidden.gather(1, visible).any()


@pytest.mark.parametrize("pool", ["token", "gap"])
def test_mae_encoder_sees_only_the_visible_patches(pool: str) -> None:
    torch.manual_seed(0)
    cfg = ENC.replace(pool=pool)
    enc = VisionTransformer(cfg).eval()
    mae = MaskedAutoencoder(MAEConfig(decoder_width=16, decoder_depth=1, decoder_heads=2), cfg)
    x = torch.randn(3, 3, 16, 16)
    seen: list[tuple[int, ...]] = []
    hook = enc.blocks[0].register_forward_pre_hook(lambda m, a: seen.append(tuple(a[0].shape)))
    visible, hidden = random_masking(3, 16, 0.75, gen(4))
    out = encode_visible(enc, x, visible)
    hook.remove()
    assert seen == [(3, cfg.num_prefix_tokens + 4, 32)]
    # Changing the pixels of hidden patches changes nothing; a visible patch's pixels do.
    patches = patchify(x, (4, 4))
    noisy = torch.where(hidden.unsqueeze(-1), torch.randn_like(patches), patches)
    out2 = encode_visible(enc, unpatchify(noisy, (4, 4), (4, 4)), visible)
    assert torch.equal(out, out2)
    j = int(visible[0, 0])
    patches[0, j] += 1.0
    assert not torch.equal(out, encode_visible(enc, unpatchify(patches, (4, 4), (4, 4)), visible))
    # The loss: hidden patches only.
    pred, hidden = mae.reconstruct(enc, x, gen(9))
    pred = pred.detach().requires_grad_()
    mae.loss(pred, mae.targets(x), hidden).backward()
    assert (pred.grad.norm(dim=-1)[~hidden] == 0).all()
    assert (pred.grad.norm(dim=-1)[hidden] > 0).all()


# ----- the pre-training loop -------------------------------------------------------------------


def ssl_config(out: Path, objective: str = "mpp", **changes) -> TrainConfig:
    base = smoke(MNIST_MPP if objective == "mpp" else MNIST_MAE, data="digits")
    return dataclasses.replace(
        base,
        data="digits",
        model="Ti/2",
        image_size=8,
        out_dir=str(out),
        epochs=2,
        max_steps=None,
        batch_size=64,
        precision="fp32",
        **changes,
    )


@pytest.mark.parametrize("objective", ["mpp", "mae"])
def test_pretraining_resumes_bitwise_and_writes_an_encoder_checkpoint(
    tmp_path: Path, objective: str
) -> None:
    full = ssl_config(tmp_path / "full", objective, ckpt_every=7, keep_checkpoints=100)
    report = Pretrainer(full).fit()
    assert report["steps"] > 7 and math.isfinite(report["test_loss"])
    assert (objective == "mpp") == ("test_acc" in report)
    for png in ("curves.png", "preview.png"):
        assert (tmp_path / "full" / png).stat().st_size > 1000
    page = (tmp_path / "full" / "report.html").read_text()  # one report.html per run, as train
    assert ">Training</h2>" in page and ">Preview</h2>" in page
    ckpt = load_checkpoint(tmp_path / "full", with_train_state=True)
    assert ckpt.model_config.num_classes == 0 and "head.weight" not in ckpt.state_dict
    assert ckpt.meta["pretrain"]["objective"] == objective and ckpt.class_names == ()
    assert any(k.startswith("objective") for k in ckpt.train_state)
    records = [
        json.loads(x) for x in (tmp_path / "full" / "metrics.jsonl").read_text().splitlines()
    ]
    assert any("val_loss" in r for r in records)
    mid = tmp_path / "full" / "checkpoints" / "step_00000007"
    run = tmp_path / "resumed"
    (run / "checkpoints").mkdir(parents=True)
    shutil.copytree(mid, run / "checkpoints" / mid.name)
    (run / "checkpoints" / LATEST).write_text(mid.name + "\n")
    Pretrainer(dataclasses.replace(full, out_dir=str(run), resume=True)).fit()
    a = load_checkpoint(tmp_path / "full", with_train_state=True)
    b = load_checkpoint(run, with_train_state=True)
    for k in a.state_dict:
        assert torch.equal(a.state_dict[k], b.state_dict[k]), k
    obj_a, obj_b = a.train_state["objective"], b.train_state["objective"]
    assert obj_a.keys() == obj_b.keys()
    assert all(torch.equal(obj_a[k], obj_b[k]) for k in obj_a)


def test_pretraining_config_errors_are_clear(tmp_path: Path) -> None:
    with pytest.raises(VitkitError, match="unknown mpp option"):
        TrainConfig(objective="mpp", objective_options={"mask_ratio": 0.5})
    with pytest.raises(VitkitError, match="objective_options are for"):
        TrainConfig(objective_options={"target": "pixels"})
    with pytest.raises(VitkitError, match="vitkit pretrain"):
        Trainer(ssl_config(tmp_path / "a"))
    with pytest.raises(VitkitError, match="needs a self-supervised objective"):
        Pretrainer(dataclasses.replace(ssl_config(tmp_path / "b"), objective="classify"))
    with pytest.raises(VitkitError, match="ema_decay"):
        Pretrainer(ssl_config(tmp_path / "c", ema_decay=0.9))


def test_mask_tokens_get_no_weight_decay(tmp_path: Path) -> None:
    trainer = Pretrainer(ssl_config(tmp_path / "wd", "mae", weight_decay=0.1))
    no_decay = {id(p) for p in trainer.optimizer.param_groups[1]["params"]}
    assert id(trainer.objective.decoder.mask_token) in no_decay
    assert id(trainer.objective.decoder.pos_embed) in no_decay
    assert id(trainer.objective.decoder.embed.weight) not in no_decay
    n_opt = sum(p.numel() for g in trainer.optimizer.param_groups for p in g["params"])
    n_all = sum(p.numel() for m in (trainer.model, trainer.objective) for p in m.parameters())
    assert n_opt == n_all


def test_train_size_is_a_stratified_subset_chosen_by_the_seed() -> None:
    full = load_dataset("digits", "train", val_size=0)
    sub = load_dataset("digits", "train", val_size=0, train_size=0.1, seed=0)
    assert len(sub) == round(0.1 * len(full))
    counts = torch.bincount(sub.labels, minlength=10)
    assert counts.max() - counts.min() <= 2  # digits' classes are nearly balanced
    again = load_dataset("digits", "train", val_size=0, train_size=0.1, seed=0)
    other = load_dataset("digits", "train", val_size=0, train_size=0.1, seed=1)
    assert torch.equal(sub.images, again.images) and not torch.equal(sub.images, other.images)
    assert len(load_dataset("digits", "train", val_size=0, train_size=50)) == 50
    with pytest.raises(VitkitError, match="train_size applies to the train split"):
        load_dataset("digits", "test", train_size=10)


# ----- the command line: pretrain -> finetune -> fewshot ---------------------------------------


@pytest.mark.parametrize("objective", ["mpp", "mae"])
def test_cli_pretrain_then_finetune_then_fewshot(
    tmp_path: Path, objective: str, capsys: pytest.CaptureFixture[str]
) -> None:
    pre = tmp_path / "pre"
    args = ["pretrain", "--objective", objective, "--smoke", "--data", "digits"]
    args += ["--out-dir", str(pre), "--no-progress"]
    if objective == "mpp":
        args += ["-p", "target=downsized", "-p", "grid=2"]
    assert main(args) == 0
    out = capsys.readouterr().out
    assert f"test {objective} loss" in out and "vitkit finetune --from" in out
    cfg = json.loads((pre / "train_config.json").read_text())
    assert cfg["objective"] == objective
    if objective == "mpp":
        assert cfg["objective_options"] == {"target": "downsized", "grid": 2}
    model, ckpt = load_model(pre)
    assert model.head is None and ckpt.meta["pretrain"]["objective"] == objective

    ft = tmp_path / "ft"
    args = ["finetune", "--from", str(pre), "--data", "digits", "--smoke", "--out-dir", str(ft)]
    assert main([*args, "--no-progress", "--train-size", "200"]) == 0
    report = json.loads((ft / "report.json").read_text())
    assert 0.0 <= report["test_top1"] <= 1.0
    ft_cfg = json.loads((ft / "train_config.json").read_text())
    assert ft_cfg["init_from"] == str(pre) and ft_cfg["train_size"] == 200
    tuned, _ = load_model(ft)
    assert tuned.head is not None and tuned.head.out_features == 10
    before = dict(model.state_dict())
    assert not torch.equal(tuned.state_dict()["blocks.0.mlp.fc1.weight"],
                           before["blocks.0.mlp.fc1.weight"])  # fmt: skip

    # The few-labels recipe from the encoder: model sizes equal to the checkpoint's are fine.
    few = ["train", "--recipe", "mnist-few-labels", "--smoke", "--data", "digits"]
    few += ["--init-from", str(pre), "--no-progress", "--train-size", "100"]
    sizes = ["-o", "width=32", "-o", "depth=2", "-o", "num_heads=2", "-o", "mlp_dim=64"]
    assert main([*few, *sizes, "--out-dir", str(tmp_path / "few")]) == 0
    assert json.loads((tmp_path / "few" / "report.json").read_text())["test_top1"] >= 0
    assert main([*few, "--out-dir", str(tmp_path / "bad")]) == 2  # width 64 != 32
    assert "model options depth, mlp_dim, num_heads, width would" in capsys.readouterr().err

    result = tmp_path / "fewshot.json"
    fewshot = ["fewshot", "--from", str(pre), "--data", "digits", "--shots", "2,5"]
    assert main([*fewshot, "--seeds", "2", "--out", str(result)]) == 0
    shots = json.loads(result.read_text())["results"]
    assert [r["shots"] for r in shots] == [2, 5]
    assert all(0.0 <= a <= 1.0 for r in shots for a in r["accuracies"])
    capsys.readouterr()


def test_cli_pretrain_refuses_bad_options(tmp_path: Path, capsys) -> None:
    args = ["pretrain", "--smoke", "--data", "digits", "--out-dir", str(tmp_path / "x")]
    assert main([*args, "-p", "target=colour"]) == 2
    assert "target must be mean-color, downsized or pixels" in capsys.readouterr().err
    assert main([*args, "--objective", "mae", "-p", "target=pixels"]) == 2
    assert "unknown mae option(s): target" in capsys.readouterr().err
