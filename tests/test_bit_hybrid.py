"""BiT's ResNet-v2 baseline and the paper's named hybrids: pinned sizes, timm parity, checkpoints,
and the same training / evaluation commands as the plain ViT."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from references import import_reference
from safetensors.torch import save_file

from vitkit.checkpoints import load_model, read_checkpoint, save_checkpoint
from vitkit.checkpoints.formats import describe
from vitkit.checkpoints.timm.vision_transformer import timm_bit_config, timm_bit_to_state_dict
from vitkit.cli import main
from vitkit.data import load_dataset
from vitkit.errors import VitkitError
from vitkit.models.bit import ResNetV2
from vitkit.models.vit import create_model
from vitkit.registry.counts import count_flops, count_params
from vitkit.registry.model_config import (
    HYBRIDS,
    RESNET_DEPTHS,
    STANDARD_RESNETS,
    ResNetConfig,
    ViTConfig,
    config_from_dict,
    model_config,
)
from vitkit.studies.common import parse_model_specs

# At 224 px with a 1000-class head. Equal to timm 1.0.31's models of the same name
# (vit_tiny_r_s16_p8_224, vit_small_r26_s32_224, vit_base_r26_s32_224, vit_base_r50_s16_224,
# vit_large_r50_s32_224, resnetv2_{50,101}x1_bit, resnetv2_50x3_bit), checked live below;
# timm has no R26 BiT, so bit_r26x1 is pinned by the formula and the built module only.
PINNED_HYBRID_PARAMS = {
    "r_vit_ti16": 6_337_704,
    "r26_vit_s32": 36_431_912,
    "r26_vit_b32": 101_383_976,
    "r50_vit_b16": 98_659_112,
    "r50_vit_l32": 328_994_856,
}
PINNED_RESNET_PARAMS = {
    "bit_r26x1": 15_987_496,
    "bit_r50x1": 25_549_352,
    "bit_r50x3": 217_319_080,
    "bit_r101x1": 44_541_480,
}
TIMM_NAMES = {
    "r_vit_ti16": "vit_tiny_r_s16_p8_224",
    "r26_vit_s32": "vit_small_r26_s32_224",
    "r26_vit_b32": "vit_base_r26_s32_224",
    "r50_vit_b16": "vit_base_r50_s16_224",
    "r50_vit_l32": "vit_large_r50_s32_224",
    "bit_r50x1": "resnetv2_50x1_bit",
    "bit_r50x3": "resnetv2_50x3_bit",
    "bit_r101x1": "resnetv2_101x1_bit",
}
TINY_BIT = {"layers": (1, 1), "width_factor": 0.25, "root": "small"}
TINY_BIT_OPTS = ["-o", "layers=1,1", "-o", "width_factor=0.25", "-o", "root=small"]


def test_every_named_variant_has_a_pinned_count():
    assert set(HYBRIDS) == set(PINNED_HYBRID_PARAMS)
    assert set(STANDARD_RESNETS) <= set(PINNED_RESNET_PARAMS)


@pytest.mark.parametrize("name", sorted(PINNED_HYBRID_PARAMS) + sorted(PINNED_RESNET_PARAMS))
def test_pinned_parameter_counts(name):
    cfg = model_config(name)
    pinned = {**PINNED_HYBRID_PARAMS, **PINNED_RESNET_PARAMS}[name]
    assert count_params(cfg) == pinned
    if pinned < 50_000_000:  # build the smaller ones: the formula equals the module
        assert sum(p.numel() for p in create_model(cfg).parameters()) == pinned


@pytest.mark.parametrize("name", sorted(TIMM_NAMES))
def test_counts_equal_timms(name):
    timm = import_reference("timm")
    with torch.device("meta"):
        ref = timm.create_model(TIMM_NAMES[name], num_classes=1000)
    assert sum(p.numel() for p in ref.parameters()) == count_params(model_config(name))


def test_hybrid_names_and_grids():
    b16 = model_config("r50_vit_b16")
    assert b16 == model_config("R50+ViT-B/16") == model_config("r50-vit-b/16")
    assert (b16.width, b16.resnet_layers, b16.patch_size) == (768, (3, 4, 9), (1, 1))
    assert b16.grid_size == (14, 14) and b16.short_name == "R(3,4,9)x1+B/16"
    assert model_config("r50_vit_l32").grid_size == (7, 7)
    assert model_config("r26_vit_s32").grid_size == (7, 7)
    ti = model_config("R+Ti/16")  # root only (4x) and 8x8 patches: 32-pixel patches
    assert (ti.resnet_layers, ti.patch_size, ti.grid_size) == ((), (8, 8), (7, 7))
    assert model_config("r50_vit_b16", image_size=384).grid_size == (24, 24)


def test_resnet_names():
    assert model_config("bit_r50x3") == ResNetConfig(layers=(3, 4, 6, 3), width_factor=3)
    for alias in ("BiT-M-R50x1", "resnet50", "r50", "bit-s-r50x1"):
        assert model_config(alias) == model_config("bit_r50x1")
    assert model_config("bit_r101x1").layers == RESNET_DEPTHS[101]
    with pytest.raises(VitkitError, match="unknown ResNet depth 34"):
        model_config("bit_r34x1")
    with pytest.raises(VitkitError, match="ResNet model option"):
        model_config("bit_r50x1", depth=3)
    cfg = model_config("bit_r26x1", layers=(1, 1, 1), width_factor=0.25)
    assert cfg.short_name == "BiT-R(1,1,1)x0.25" and cfg.depth == 11
    assert config_from_dict(cfg.to_dict()) == cfg
    assert isinstance(config_from_dict(model_config("Ti/4").to_dict()), ViTConfig)


def test_resnet50_flops_are_the_known_four_gmacs():
    # ResNet-50 at 224 px: ~4.1 G multiply-adds (He et al. 2016 report 3.8 G for v1 with the
    # stride in the 1x1 conv; v1.5 strides the 3x3 conv and costs ~4.1 G).
    macs = count_flops(model_config("bit_r50x1")) / 2
    assert 4.0e9 < macs < 4.2e9


@pytest.mark.parametrize(
    "opts",
    [
        {"layers": (1,), "width_factor": 0.25, "root": "small"},
        {"layers": (2, 1, 1), "width_factor": 0.5, "in_chans": 1, "num_classes": 0},
        {"layers": (1, 1), "width_factor": 1.5, "image_size": (40, 56)},
    ],
)
def test_bit_count_formula_and_shapes(opts):
    cfg = model_config("bit_r26x1", **opts)
    model = create_model(cfg)
    assert sum(p.numel() for p in model.parameters()) == count_params(cfg)
    x = torch.randn(2, cfg.in_chans, *cfg.image_size)
    feats = model.forward_features(x)
    h, w = cfg.image_size
    assert feats.shape == (2, cfg.feature_dim, -(-h // cfg.stride), -(-w // cfg.stride))
    out = model(x)
    assert out.shape == (2, cfg.num_classes or cfg.feature_dim)
    if cfg.num_classes:
        assert not out.any()  # zero-initialised head, as BiT


def test_bit_weight_standardisation_and_preactivation():
    torch.manual_seed(0)
    model = create_model("bit_r26x1", **TINY_BIT, image_size=16, num_classes=3).eval()
    conv = model.stages[0][0].conv2
    w = conv.standardized_weight()
    assert torch.allclose(w.mean(dim=(1, 2, 3)), torch.zeros(w.shape[0]), atol=1e-5)
    assert torch.allclose(w.var(dim=(1, 2, 3), unbiased=False), torch.ones(w.shape[0]), atol=1e-4)
    # Scaling a kernel changes nothing: the convolution sees the standardised kernel.
    x = torch.randn(2, 3, 16, 16)
    with torch.no_grad():
        torch.nn.init.normal_(model.head.weight)
        before = model(x)
        conv.weight.mul_(7.0).add_(0.3)
        assert torch.allclose(model(x), before, atol=1e-5)


def test_bit_parity_with_timm_on_identical_weights():
    timm = import_reference("timm")
    torch.manual_seed(0)
    ref = timm.create_model("resnetv2_50x1_bit", num_classes=7).eval()
    with torch.no_grad():
        for p in ref.parameters():
            p.add_(torch.randn_like(p) * 0.05)
    sd = {k: v.clone() for k, v in ref.state_dict().items()}
    cfg = timm_bit_config(sd, image_size=64)
    assert cfg == model_config("bit_r50x1", num_classes=7, image_size=64)
    ours = ResNetV2(cfg).eval()
    ours.load_state_dict(timm_bit_to_state_dict(sd, cfg))
    x = torch.randn(2, 3, 64, 64)
    with torch.no_grad():
        ref_out, out = ref(x), ours(x)
    # timm standardises with eps 1e-8, BiT (and vitkit) with 1e-10.
    assert (out - ref_out).abs().max().item() < 1e-4 * max(1.0, ref_out.abs().max().item())


def test_timm_bit_file_loads_through_the_generic_reader(tmp_path):
    timm = import_reference("timm")
    torch.manual_seed(1)
    ref = timm.create_model("resnetv2_50x1_bit", num_classes=4).eval()
    path = tmp_path / "bit.safetensors"
    save_file({k: v.contiguous() for k, v in ref.state_dict().items()}, str(path))
    model, ckpt = load_model(path)
    assert ckpt.format == "timm" and isinstance(ckpt.model_config, ResNetConfig)
    x = torch.randn(1, 3, 224, 224)
    with torch.no_grad():
        torch.testing.assert_close(model(x), ref(x), atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("timm_name", ["vit_tiny_r_s16_p8_224", "vit_small_r26_s32_224"])
def test_timm_hybrid_converts(tmp_path, timm_name):
    timm = import_reference("timm")
    torch.manual_seed(0)
    ref = timm.create_model(timm_name, num_classes=5, img_size=64).eval()
    with torch.no_grad():
        for p in ref.parameters():
            p.add_(torch.randn_like(p) * 0.02)
    path = tmp_path / "hybrid.safetensors"
    save_file({k: v.contiguous() for k, v in ref.state_dict().items()}, str(path))
    model, ckpt = load_model(path)
    cfg = ckpt.model_config
    assert cfg.is_hybrid and cfg.image_size == (64, 64) and cfg.gelu == "none"
    assert count_params(cfg) == sum(p.numel() for p in ref.parameters())
    x = torch.randn(2, 3, 64, 64)
    with torch.no_grad():
        ref_out, out = ref(x), model(x)
    # Read with timm's kernel standardisation (sqrt(var + 1e-8)) and GroupNorm epsilon (1e-5),
    # not the official ones ((std + 1e-5), 1e-6): the same numerics as timm.
    assert cfg.resnet_eps == "timm"
    err = (out - ref_out).abs().max().item()
    assert err < 1e-5 * max(1.0, ref_out.abs().max().item()), err


def test_timm_other_hybrid_backbones_are_refused(tmp_path):
    timm = import_reference("timm")
    ref = timm.create_model("vit_small_resnet26d_224", num_classes=2, img_size=64)
    path = tmp_path / "d.safetensors"
    save_file({k: v.contiguous() for k, v in ref.state_dict().items()}, str(path))
    with pytest.raises(VitkitError, match="ResNetV2"):
        load_model(path)


def test_resnet_checkpoint_round_trip(tmp_path, capsys):
    torch.manual_seed(0)
    model = create_model("bit_r26x1", **TINY_BIT, image_size=12, in_chans=1, num_classes=3)
    with torch.no_grad():
        model.head.weight.normal_()
    path = save_checkpoint(tmp_path / "ckpt", model, class_names=("a", "b", "c"))
    config = json.loads((path / "config.json").read_text())
    assert config["model"]["architecture"] == "resnet"
    loaded, ckpt = load_model(path)
    assert isinstance(loaded, ResNetV2) and ckpt.model_config == model.cfg
    x = torch.randn(2, 1, 12, 12)
    with torch.no_grad():
        assert torch.equal(loaded(x), model.eval()(x))
    info = describe(ckpt)
    assert info["model"] == "BiT-R(1,1)x0.25-small" and info["grid"] is None
    assert main(["inspect", str(path)]) == 0
    assert "BiT ResNet-v2, stages [1, 1]" in capsys.readouterr().out
    # New head for fine-tuning, and a new resolution (no position embeddings to resample).
    new = read_checkpoint(path, num_classes=5, image_size=20)
    assert new.model_config.num_classes == 5 and new.model_config.image_size == (20, 20)
    assert not new.state_dict["head.weight"].any()
    with pytest.raises(VitkitError, match="ResNet"):
        from vitkit.checkpoints import write_checkpoint

        write_checkpoint(ckpt, tmp_path / "x.npz", "npz")


def test_study_subsets_keep_class_shares_and_nest():
    # The study's subsets are the trainer's train_size: class-stratified, nested for one seed.
    data = load_dataset("digits", "train")
    labels = data.labels.numpy()
    small = load_dataset("digits", "train", train_size=100, seed=0)
    big = load_dataset("digits", "train", train_size=300, seed=0)
    assert len(small) == 100 and len(big) == 300
    share = np.bincount(labels, minlength=10) / len(labels)
    assert np.abs(np.bincount(small.labels.numpy(), minlength=10) - 100 * share).max() <= 1
    images = {bytes(im.numpy()) for im in big.images}
    inside = sum(bytes(im.numpy()) in images for im in small.images)
    assert inside >= 95  # nested up to rounding
    other = load_dataset("digits", "train", train_size=100, seed=1)
    assert not torch.equal(other.images, small.images)


def test_parse_model_specs():
    specs = parse_model_specs(
        "Ti/4[depth=2,width=48,label=vit], bit_r26x1[layers=1,1,1,width_factor=0.25],r_vit_ti16"
    )
    assert [s.name for s in specs] == ["Ti/4", "bit_r26x1", "r_vit_ti16"]
    assert specs[0].overrides == {"depth": 2, "width": 48} and specs[0].label == "vit"
    assert specs[1].overrides == {"layers": (1, 1, 1), "width_factor": 0.25}
    assert specs[1].label == "BiT-R(1,1,1)x0.25" and specs[2].label == "R()x1+Ti-32"
    for bad in ("Ti/4[depth=2", "Ti/4[2]", "nope_model"):
        with pytest.raises(VitkitError):
            parse_model_specs(bad)


# ------------------------------------------------------------------ the same commands, end to end

DIGITS = ["--data", "digits", "--no-progress", "--batch-size", "32", "--precision", "fp32"]


@pytest.mark.parametrize(
    "model",
    [
        ["--model", "bit_r26x1", *TINY_BIT_OPTS],
        ["--model", "r_vit_ti16", "-o", "patch_size=1", "-o", "resnet_layers=1"]
        + ["-o", "resnet_width_factor=0.25", "-o", "width=32", "-o", "depth=1"]
        + ["-o", "num_heads=2", "-o", "mlp_dim=64"],
    ],
    ids=["bit", "hybrid"],
)
def test_train_eval_predict_finetune(tmp_path, capsys, model):
    run = tmp_path / "run"
    args = ["train", *DIGITS, *model, "--epochs", "2", "--lr", "3e-3", "--out-dir", str(run)]
    assert main(args) == 0
    report = json.loads((run / "report.json").read_text())
    assert report["test_top1"] > 0.3  # 10 classes: well above chance after 2 short epochs
    assert (run / "report.html").is_file() and (run / "curves.png").is_file()
    capsys.readouterr()
    assert main(["eval", "--from", str(run), "--data", "digits"]) == 0
    out = capsys.readouterr().out
    assert f"{100 * report['test_top1']:.2f}" in out
    from PIL import Image

    image = tmp_path / "digit.png"
    Image.fromarray(np.zeros((8, 8), dtype=np.uint8)).save(image)
    assert main(["predict", str(image), "--from", str(run), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)
    fine = tmp_path / "fine"
    args = ["finetune", "--from", str(run), "--data", "digits", "--smoke", "--image-size", "8"]
    assert main([*args, "--no-progress", "--out-dir", str(fine)]) == 0
    tuned = json.loads((fine / "report.json").read_text())
    assert tuned["model_config"] == {**report["model_config"], "num_classes": 10}
    assert 0.0 <= tuned["test_top1"] <= 1.0


def test_explain_refuses_a_resnet_by_name(tmp_path, capsys):
    model = create_model("bit_r26x1", **TINY_BIT, image_size=8, in_chans=1, num_classes=10)
    path = save_checkpoint(tmp_path / "ckpt", model)
    from PIL import Image

    image = tmp_path / "x.png"
    Image.fromarray(np.zeros((8, 8), dtype=np.uint8)).save(image)
    assert main(["explain", str(image), "--from", str(path)]) == 2
    assert "no attention" in capsys.readouterr().err


def test_study_data_scale_end_to_end(tmp_path, capsys):
    out = tmp_path / "study"
    models = "Ti/2[width=32,depth=1,num_heads=2,mlp_dim=64,label=vit],"
    models += "bit_r26x1[layers=1,width_factor=0.25,root=small,label=bit]"
    args = ["study", "data-scale", *DIGITS, "--models", models, "--sizes", "160,320"]
    args += ["--seeds", "2", "--epochs", "1", "--min-steps", "6", "--out-dir", str(out)]
    assert main(args) == 0
    captured = capsys.readouterr()
    results = json.loads((out / "results.json").read_text())
    assert len(results["runs"]) == 8
    runs = {(r["model"], r["size"], r["seed"]) for r in results["runs"]}
    assert runs == {(m, n, s) for m in ("vit", "bit") for n in (160, 320) for s in (0, 1)}
    # min_steps: 160 images / batch 32 = 5 steps per epoch, so 2 epochs for 6 steps.
    assert {r["steps"] for r in results["runs"] if r["size"] == 160} == {10}
    rows = {(r["model"], r["size"]): r for r in results["summary"]}
    accs = [r["test_top1"] for r in results["runs"] if (r["model"], r["size"]) == ("vit", 320)]
    assert rows[("vit", 320)]["mean"] == pytest.approx(sum(accs) / 2)
    assert rows[("vit", 320)]["std"] == pytest.approx(float(np.std(accs, ddof=1)))
    table = (out / "table.md").read_text()
    assert "| vit (" in table and "n=320" in table and "±" in table
    assert (out / "data_scale.png").stat().st_size > 10_000
    assert "n=160" in captured.out
    # A second call reuses every finished run and trains nothing.
    assert captured.err.count("seed 0: ") >= 4
    mtimes = {p: p.stat().st_mtime_ns for p in Path(out, "runs").glob("*/n*/seed*/report.json")}
    assert main(args) == 0
    assert "(done before)" in capsys.readouterr().err
    assert json.loads((out / "results.json").read_text())["trained_runs"] == 0
    assert {p: p.stat().st_mtime_ns for p in mtimes} == mtimes
    assert len(list(Path(out, "runs").glob("*/n*/seed*/report.json"))) == 8
