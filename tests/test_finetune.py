"""Fine-tuning the paper's way: start from a checkpoint, new zero head, pre-logits dropped,
position embeddings resampled; EMA, RandAugment and Mixup in the trainer; the lr sweep; every
recipe runs a tiny training."""

from __future__ import annotations

import dataclasses
import json
import shutil
from pathlib import Path

import pytest
import torch

from vitkit.checkpoints import (
    load_checkpoint,
    read_checkpoint,
    resample_pos_embed,
    write_checkpoint,
)
from vitkit.cli import main
from vitkit.errors import VitkitError
from vitkit.train.pretrain import Pretrainer
from vitkit.train.recipes import RECIPES, smoke
from vitkit.train.trainer import TrainConfig, Trainer

TINY = {"width": 32, "depth": 2, "num_heads": 2, "mlp_dim": 64, "representation_size": 16}


def pretrain(out: Path) -> Path:
    cfg = TrainConfig(
        data="digits",
        model="Ti/2",
        model_overrides=TINY,
        image_size=8,
        epochs=1,
        max_steps=5,
        batch_size=32,
        augment="none",
        precision="fp32",
        progress=False,
        out_dir=str(out),
    )
    Trainer(cfg).fit()
    return out


def ft_config(src: Path, out: Path, **kw) -> TrainConfig:
    base = dict(
        data="digits",
        init_from=str(src),
        image_size=16,
        epochs=2,
        batch_size=32,
        optimizer="sgd",
        lr=0.01,
        weight_decay=0.0,
        warmup_steps=2,
        augment="none",
        precision="fp32",
        progress=False,
        out_dir=str(out),
        keep_checkpoints=5,
    )
    base.update(kw)
    return TrainConfig(**base)


@pytest.fixture(scope="module")
def pretrained(tmp_path_factory) -> Path:
    return pretrain(tmp_path_factory.mktemp("pre") / "run")


def test_finetuning_starts_from_the_checkpoint_as_the_paper_says(pretrained, tmp_path):
    src = read_checkpoint(pretrained)
    trainer = Trainer(ft_config(pretrained, tmp_path / "ft"))
    cfg, sd = trainer.model_cfg, trainer.model.state_dict()
    assert cfg.image_size == (16, 16) and cfg.grid_size == (8, 8)
    assert cfg.representation_size is None and "pre_logits.0.weight" not in sd  # dropped
    assert not sd["head.weight"].any() and not sd["head.bias"].any()  # zero-initialised
    assert sd["head.weight"].shape == (10, 32)
    want = resample_pos_embed(src.state_dict["pos_embed"], (4, 4), (8, 8), 1, "bicubic")
    assert torch.equal(sd["pos_embed"], want)
    for k, v in src.state_dict.items():
        if (
            k.startswith("blocks.")
            or k.startswith("patch_embed")
            or k in ("cls_token", "norm.weight")
        ):
            assert torch.equal(sd[k], v), k
    report = trainer.fit()
    assert report["test_top1"] > 0.1
    assert load_checkpoint(tmp_path / "ft").meta["init_from"] == str(pretrained)


def test_finetuning_from_a_foreign_format(pretrained, tmp_path):
    write_checkpoint(
        read_checkpoint(pretrained, pre_logits=False, num_classes=10), tmp_path / "m.npz", "npz"
    )
    trainer = Trainer(ft_config(tmp_path / "m.npz", tmp_path / "ft", max_steps=2))
    assert trainer.model_cfg.gelu == "tanh" and trainer.model_cfg.image_size == (16, 16)
    trainer.fit()
    only = "only attn_dropout, drop_path, dropout, head_dropout may be set"
    with pytest.raises(VitkitError, match=only):
        Trainer(ft_config(pretrained, tmp_path / "x", model_overrides={"depth": 3}))


def test_ema_randaugment_mixup_train_and_resume_bitwise(pretrained, tmp_path):
    extra = dict(
        ema_decay=0.9,
        randaugment=(2, 9.0),
        elastic=(20.0, 3.0),
        mixup_alpha=0.4,
        cutmix_alpha=1.0,
        augment="digits",
        label_smoothing=0.1,
    )
    full = ft_config(pretrained, tmp_path / "full", **extra)
    report = Trainer(full).fit()
    assert "ema_test_top1" in report and (tmp_path / "full" / "ema" / "config.json").is_file()
    ema = load_checkpoint(tmp_path / "full" / "ema").state_dict
    raw = load_checkpoint(tmp_path / "full").state_dict
    assert any(not torch.equal(ema[k], raw[k]) for k in raw)
    # Resume from the end of epoch 1 in a fresh directory: bitwise the same weights and EMA.
    first = sorted((tmp_path / "full" / "checkpoints").glob("step_*"))[0]
    resumed = tmp_path / "resumed"
    (resumed / "checkpoints").mkdir(parents=True)
    shutil.copytree(first, resumed / "checkpoints" / first.name)
    (resumed / "checkpoints" / "LATEST").write_text(first.name + "\n")
    shutil.copy(tmp_path / "full" / "train_config.json", resumed / "train_config.json")
    Trainer(dataclasses.replace(full, out_dir=str(resumed), resume=True)).fit()
    for name in ("", "ema"):
        a = load_checkpoint(tmp_path / "full" / name).state_dict
        b = load_checkpoint(resumed / name).state_dict
        assert all(torch.equal(a[k], b[k]) for k in a), name


def test_lr_sweep_chooses_on_held_out_data_and_retrains(pretrained, tmp_path, capsys):
    out = tmp_path / "sweep"
    args = [
        "finetune",
        "--from",
        str(pretrained),
        "--data",
        "digits",
        "--smoke",
        "--lr-sweep",
        "0.001",
        "0.03",
        "--out-dir",
        str(out),
    ]
    assert main(args) == 0
    result = json.loads((out / "sweep.json").read_text())
    assert [r["lr"] for r in result["runs"]] == [0.001, 0.03]
    best = max(result["runs"], key=lambda r: r["val_top1"])
    assert result["chosen_lr"] == best["lr"]
    final = json.loads((out / "final" / "train_config.json").read_text())
    assert final["lr"] == best["lr"] and final["val_size"] == 0 and final["optimizer"] == "sgd"
    swept = json.loads((out / "lr_0.001" / "train_config.json").read_text())
    assert swept["val_size"] == 0.1
    assert "chosen lr" in capsys.readouterr().out


@pytest.mark.parametrize("name", sorted(RECIPES))
def test_every_recipe_runs_a_tiny_training(name, pretrained, tmp_path):
    cfg = smoke(RECIPES[name].config, finetune=name.endswith("finetune"))
    changes: dict = {"out_dir": str(tmp_path / name), "max_steps": 3}
    if cfg.data == "mnist":
        changes["data"] = "digits"
    if RECIPES[name].config.init_from is None and name.endswith("finetune"):
        changes["init_from"] = str(pretrained)
    cfg = dataclasses.replace(cfg, **changes)
    if cfg.objective != "classify":  # self-supervised pre-training: pretext metrics
        report = Pretrainer(cfg).fit()
        assert report["steps"] == 3 and report["test_loss"] > 0
        return
    report = Trainer(cfg).fit()
    assert report["steps"] == 3 and 0.0 <= report["test_top1"] <= 1.0


def test_list_recipes_shows_every_setting_a_recipe_changes(capsys):
    """A recipe's settings outside the usual list (mnist-best's test-time augmentation,
    augreg's EMA and Mixup, the paper's warmup steps) were left out of ``--list-recipes``."""
    assert main(["train", "--list-recipes"]) == 0
    out = capsys.readouterr().out
    default = TrainConfig().to_dict()
    for name, recipe in RECIPES.items():
        block = out.split(f"\n{name}\n")[-1] if not out.startswith(name) else out
        line = next(x for x in block.splitlines() if x.strip().startswith("settings: "))
        for key, value in recipe.config.to_dict().items():
            if value != default[key]:
                assert f"{key}={value}" in line, (name, key)
    assert "tta_shift=1" in out and "ema_decay=0.9999" in out and "warmup_steps=10000" in out


def test_randaugment_applies_to_image_folders_too(tmp_path):
    import numpy as np
    from PIL import Image

    rng = np.random.default_rng(0)
    for c in ("a", "b"):
        (tmp_path / "data" / c).mkdir(parents=True)
        for i in range(6):
            img = rng.integers(0, 256, (16, 16, 3), dtype=np.uint8)
            Image.fromarray(img).save(tmp_path / "data" / c / f"{i}.png")
    cfg = TrainConfig(
        data=str(tmp_path / "data"),
        model="Ti/4",
        image_size=16,
        model_overrides={"width": 32, "depth": 1, "num_heads": 2, "mlp_dim": 64},
        randaugment=(2, 20.0),
        batch_size=4,
        progress=False,
        out_dir=str(tmp_path / "run"),
    )
    trainer = Trainer(cfg)
    images = torch.randint(0, 256, (4, 3, 16, 16), dtype=torch.uint8)
    assert not torch.equal(trainer.augment(images), images)
    plain = Trainer(dataclasses.replace(cfg, randaugment=None, out_dir=str(tmp_path / "r2")))
    assert torch.equal(plain.augment(images), images)  # (crop/flip happen in the loader)


def test_mnist_best_smoke_keeps_the_hybrid_root_and_runs_from_the_cli(tmp_path):
    """The time-to-accuracy recipe's --smoke variant: the hybrid's patch 1 on the ResNet root's
    feature map survives the shrinking (dropping it gave patch 4 x stride 4 > the image)."""
    out = tmp_path / "best"
    args = ["train", "--recipe", "mnist-best", "--smoke", "--data", "digits"]
    assert main([*args, "--out-dir", str(out), "--no-progress"]) == 0
    report = json.loads((out / "report.json").read_text())
    assert report["model_config"]["resnet_layers"] == [] and report["steps"] == 6
    assert report["model_config"]["patch_size"] == [1, 1]


def bare_timm(tmp_path: Path, name: str, **kw) -> Path:
    """A timm model (grayscale digits' shape: 1 channel, patch 4, 16 px, 10 classes unless
    ``kw`` says otherwise) saved as its state dict alone: no config, no name."""
    from references import import_reference
    from safetensors.torch import save_file

    kw = {"img_size": 16, "patch_size": 4, "in_chans": 1, "num_classes": 10, "depth": 1, **kw}
    model = import_reference("timm").create_model(name, **kw)
    path = tmp_path / "bare.safetensors"
    save_file({k: v.contiguous() for k, v in model.state_dict().items()}, str(path))
    return path


def test_a_bare_file_that_needs_its_heads_stated_can_be_finetuned(tmp_path, capsys):
    """A bare timm DeiT (distilled) of width 64, which timm does not register, says nothing of
    its heads: ``finetune -o num_heads=4`` was refused with "pass num_heads (--num-heads N)",
    an option finetune does not have; ``-o num_heads`` now reaches the reading, as
    ``--num-heads`` does for eval and predict, and the file's weights are what trains."""
    bare = bare_timm(
        tmp_path, "deit_tiny_distilled_patch16_224", embed_dim=64, num_heads=4, depth=2
    )
    args = ["finetune", "--from", str(bare), "--data", "digits", "--smoke", "--no-progress"]
    out = tmp_path / "ft"
    assert main([*args, "--out-dir", str(out)]) == 2
    assert "num_heads" in capsys.readouterr().err
    assert main([*args, "-o", "num_heads=4", "--image-size", "16", "--out-dir", str(out)]) == 0
    ckpt = load_checkpoint(out)
    assert ckpt.model_config.num_heads == 4 and ckpt.model_config.width == 64
    # the preprocessing the file does not say, stated as the warning line says (-o mean=...)
    stated = ["-o", "num_heads=4", "-o", "mean=0.485", "-o", "std=0.229", "--image-size", "16"]
    assert main([*args, *stated, "--out-dir", str(tmp_path / "ft2")]) == 0
    pre = load_checkpoint(tmp_path / "ft2").preprocess
    assert pre.mean == (0.485,) and pre.std == (0.229,)


def test_finetune_says_what_it_starts_from_and_what_it_assumed(tmp_path, capsys):
    """``vitkit finetune`` printed neither a header nor the assumption lines that train, eval
    and inspect print for the same checkpoint (they were silenced with the zero-head warning)."""
    bare = bare_timm(tmp_path, "deit_tiny_patch16_224", depth=1)
    out = tmp_path / "ft"
    args = ["finetune", "--from", str(bare), "--data", "digits", "--smoke", "--no-progress"]
    from vitkit.errors import AssumptionWarning

    with pytest.warns(AssumptionWarning, match=r"mean=\(0.5, 0.5, 0.5\) assumed"):
        assert main([*args, "--image-size", "16", "--out-dir", str(out)]) == 0
    err = capsys.readouterr().err
    assert f"fine-tuning ViT-w192-d1-h3/4 from {bare} (16x16 px)" in err, err
    assert "on digits:" in err and str(out) in err


def test_every_reading_command_takes_the_setting_a_file_needs(tmp_path, capsys):
    """A bare file that cannot be read without its heads (a width timm does not register) is
    read by every command that reads a checkpoint once they are stated, as ``-o num_heads=N``
    (finetune's only way, and the same option everywhere) or ``--num-heads N``."""
    import warnings

    import numpy as np
    from PIL import Image

    bare = str(bare_timm(tmp_path, "vit_tiny_patch16_224", embed_dim=64, num_heads=4, img_size=8))
    img = tmp_path / "d.png"
    Image.fromarray(np.zeros((8, 8), np.uint8)).save(img)
    out = tmp_path / "out"
    commands = {
        "inspect": ["inspect", bare],
        "eval": ["eval", "--from", bare, "--data", "digits", "--out", str(out / "ev")],
        "predict": ["predict", "--from", bare, str(img)],
        "explain": ["explain", str(img), "--from", bare, "--out", str(out / "ex")],
        "analyze": ["analyze", "--from", bare, "--out", str(out / "an")],
        "fewshot": ["fewshot", "--from", bare, "--data", "digits", "--shots", "2", "--seeds", "1"],
        "convert": ["convert", bare, str(out / "cv"), "--to", "vitkit"],
        "export": ["export", bare, str(out / "m.onnx")],
        "finetune": ["finetune", "--from", bare, "--data", "digits", "--smoke", "--no-progress"]
        + ["--out-dir", str(out / "ft")],
    }
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # (what else is assumed is said: not this test's)
        for name, args in commands.items():
            assert main(args) == 2, name
            assert "num_heads" in capsys.readouterr().err, name
            assert main([*args, "-o", "num_heads=4"]) == 0, (name, capsys.readouterr().err)
            capsys.readouterr()


def test_stated_preprocessing_replaces_what_a_file_says(tmp_path):
    """``-o mean=...`` on a checkpoint that records its preprocessing (a vitkit file) was
    dropped without a word: only settings the file does not say were applied, and the
    fine-tuning check let the rest through. It is now the run's normalisation."""
    from vitkit.checkpoints import save_checkpoint
    from vitkit.data import DataInfo
    from vitkit.models.vit import create_model
    from vitkit.train.setup import finetune_model_config, init_checkpoint

    tiny = dict(image_size=32, patch_size=16, depth=1, width=32, num_heads=2, mlp_dim=64)
    save_checkpoint(tmp_path / "c", create_model("Ti/16", num_classes=3, **tiny))
    info = DataInfo("folder", 3, ("a", "b", "c"), 3, (32, 32), True)
    cfg = TrainConfig(data="x", init_from=str(tmp_path / "c"), model_overrides={"mean": 0.3})
    init = init_checkpoint(cfg, info)
    assert init.preprocess.mean == (0.3, 0.3, 0.3) and init.preprocess.std == (0.5, 0.5, 0.5)
    assert finetune_model_config(cfg, init) == init.model_config
    for field in ("crop_pct", "resize"):  # the run crops as its data does: never silently used
        told = TrainConfig(data="x", init_from=str(tmp_path / "c"), model_overrides={field: 0.9})
        with pytest.raises(VitkitError, match=f"{field} would not be used"):
            finetune_model_config(told, init)
