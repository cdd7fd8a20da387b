"""The feature API (vitkit.models.features): timm's forward_intermediates on identical float64
weights for one entry of each family (bench/coverage.py's features column runs every entry),
prune_intermediate_layers, features-only models from create_model and load, NaFlex batches,
and the refusals."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from references import import_reference, load_bench, perturbed

import vitkit
from vitkit.checkpoints import read_checkpoint
from vitkit.errors import VitkitError
from vitkit.models.features import FeaturesModel, take_indices
from vitkit.models.naflex_packing import pack
from vitkit.models.vit import build_model

ROOT = Path(__file__).resolve().parents[1]
TINY = dict(image_size=32, patch_size=8, width=32, depth=3, num_heads=2, mlp_dim=64)


@pytest.fixture(scope="module")
def coverage():
    return load_bench("coverage", "coverage_bench")


@pytest.fixture(scope="module")
def timm():
    return import_reference("timm")


FAMILIES = [
    "vit_small_patch16_224",  # the paper's ViT: class token, learned E_pos
    "deit_tiny_distilled_patch16_224",  # two prefix tokens
    "vit_tiny_r_s16_p8_224",  # hybrid: a ResNet stem, reduction 32
    "vit_small_patch14_reg4_dinov2",  # registers, LayerScale
    "vit_base_patch16_siglip_224",  # no class token, MAP head
    "vit_small_patch16_dinov3",  # RoPE, registers (eva.py)
    "eva02_tiny_patch14_224",  # RoPE, E_pos, SwiGLU (eva.py)
    "beit_base_patch16_224",  # per-block relative position bias (beit.py)
    "vit_relpos_medium_patch16_cls_224",  # timm's MLP relative position bias
    "naflexvit_base_patch16_gap",  # NaFlex on images
]


@pytest.mark.parametrize("name", FAMILIES)
def test_intermediates_equal_timms(coverage, timm, tmp_path, name):
    """Every setting of coverage_features.settings() (index sets, NCHW / NLC, norm, prefix
    tokens, intermediates_only, stop_early), at the copy's size and a second non-square one,
    within 1e-8 of timm's (relative, float64), and feature_info equal."""
    row = coverage.check_timm(timm, name, tmp_path, "hub")
    assert row["status"] == "exact", row
    features = row["features"]
    assert features["status"] == "exact", features
    assert features["own"]["settings"] >= 30 and features["own"]["rel"] <= 1e-8
    if name.startswith(("beit", "vit_relpos")):  # timm's module runs its one size
        assert features["second"] == "timm's module runs one size"
    else:
        assert features["second"]["settings"] == len(coverage.coverage_features.settings())


def test_a_difference_is_caught(coverage, timm, tmp_path):
    """The check can fail: one perturbed weight in vitkit's copy makes the row differ."""
    ref = coverage.build_timm(timm, "vit_small_patch16_224")
    got = coverage.vitkit_side(*_folder(ref, tmp_path), ref["x64"].float())
    model = got["model"]
    with torch.no_grad():
        model.blocks[0].mlp.fc2.bias[0] += 1e-6
    args = coverage.cm.timm_kwargs(ref["args"])
    row = coverage.coverage_features.check(
        timm, "vit_small_patch16_224", args, ref["model"], model, ref["x64"]
    )
    assert row["status"] == "differ" and "rel" in row["reason"], row


def _folder(ref, tmp_path):
    from timm.models._hub import save_for_hf

    save_for_hf(ref["model"], str(tmp_path / "m"), safe_serialization=True)
    return tmp_path / "m", ref["x64"]


def test_take_indices_is_timms(timm):
    from timm.models._features import feature_take_indices

    for indices in (None, 1, 3, [0], [-1], [2, 0], (0, -1, 1), np.array([0, -1]),
                    [np.int64(2), np.int32(0)], torch.tensor([1, 2])):  # fmt: skip
        assert take_indices(3, indices) == feature_take_indices(3, indices)
    assert take_indices(3, np.int64(2)) == ([1, 2], 2)  # (timm's fails on a NumPy int alone)
    assert all(type(i) is int for i in take_indices(3, np.array([0, 2]))[0])
    for bad in (0, 4, [3], [-4], [], [0.5], True, [True], np.array([0.5]), "1", [[0]]):
        with pytest.raises(VitkitError):
            take_indices(3, bad)


def test_shapes_formats_and_prefix():
    model = perturbed(vitkit.create_model("Ti/16", num_reg_tokens=2, **TINY).double())
    x = torch.randn(2, 3, 32, 48, dtype=torch.float64)
    final, maps = model.forward_intermediates(x, [0, -1], return_prefix_tokens=True)
    assert final.shape == (2, 3 + 4 * 6, 32)
    assert [(m.shape, p.shape) for m, p in maps] == [((2, 32, 4, 6), (2, 3, 32))] * 2
    nlc = model.forward_intermediates(x, 1, output_fmt="NLC", intermediates_only=True)
    assert len(nlc) == 1 and nlc[0].shape == (2, 24, 32)
    assert torch.equal(nlc[0], maps[1][0].flatten(2).transpose(1, 2))
    normed = model.forward_intermediates(x, [-1], norm=True, intermediates_only=True)[0]
    assert torch.allclose(normed.flatten(2).transpose(1, 2), final[:, 3:], atol=1e-12)
    with pytest.raises(VitkitError, match="output_fmt"):
        model.forward_intermediates(x, output_fmt="NHWC")
    with pytest.raises(VitkitError, match="out of range"):
        model.forward_intermediates(x, [3])


def test_pruned_model_same_features_fewer_parameters(timm):
    """vitkit's pruned model gives the unpruned one's features, holds fewer parameters, and
    prunes as timm's does (the same indices kept, the same parameter count)."""
    model = perturbed(vitkit.create_model("Ti/16", num_classes=5, **TINY).double())
    x = torch.randn(2, 3, 32, 32, dtype=torch.float64)
    want = model.forward_intermediates(x, [0, 1], norm=True, intermediates_only=True)
    before = sum(p.numel() for p in model.parameters())
    assert model.prune_intermediate_layers([0, -2]) == [0, 1]
    after = sum(p.numel() for p in model.parameters())
    got = model.forward_intermediates(x, [0, 1], norm=True, intermediates_only=True)
    assert all(torch.equal(a, b) for a, b in zip(got, want))
    assert after < before and len(model.blocks) == 2 and model.cfg.depth == 2
    assert model.cfg.num_classes == 0 and model.head is None
    ref = timm.create_model("vit_tiny_patch16_224", img_size=32, patch_size=8, embed_dim=32,
                            depth=3, num_heads=2, mlp_ratio=2, num_classes=5)  # fmt: skip
    assert ref.prune_intermediate_layers([0, -2]) == [0, 1]
    assert sum(p.numel() for p in ref.parameters()) == after
    model.prune_intermediate_layers(1, prune_norm=True)
    assert isinstance(model.norm, torch.nn.Identity) and len(model.blocks) == 2


def test_features_only_from_create_model_and_load(tmp_path):
    torch.manual_seed(0)
    full = perturbed(vitkit.create_model("Ti/16", num_classes=3, num_reg_tokens=1, **TINY))
    vitkit.save_checkpoint(tmp_path / "ckpt", full)
    x = torch.randn(2, 3, 32, 32)
    want = full.forward_intermediates(x, [1, 2], intermediates_only=True)
    loaded = vitkit.load(tmp_path / "ckpt", features_only=True, out_indices=(1, -1))
    assert isinstance(loaded, FeaturesModel) and loaded.out_indices == [1, 2]
    got = loaded(x)
    assert all(torch.allclose(a, b, atol=1e-6) for a, b in zip(got, want))
    info = loaded.feature_info
    assert info.channels() == [32, 32] and info.reduction() == [8, 8]
    assert info.module_name() == ["blocks.1", "blocks.2"] and info.out_indices == (1, 2)
    assert len(info) == 3 and info[0]["module"] == "blocks.0"  # timm's: every block
    made = vitkit.create_model("Ti/16", **TINY, features_only=True)  # timm's default: last 3
    assert made.out_indices == [0, 1, 2] and made.model.head is None
    assert isinstance(made.model.norm, torch.nn.Identity)  # unused without feature_norm
    normed = vitkit.create_model("Ti/16", **TINY, features_only=True, feature_norm=True)
    assert not isinstance(normed.model.norm, torch.nn.Identity)
    nlc = vitkit.create_model("Ti/16", **TINY, features_only=True, output_fmt="NLC")
    assert nlc(x)[0].shape == (2, 16, 32)
    hybrid_kw = dict(image_size=64, patch_size=2, depth=2, resnet_width_factor=0.25)
    hybrid = vitkit.create_model("r_vit_ti16", **hybrid_kw, features_only=True, out_indices=1)
    assert hybrid.feature_info.reduction() == [8]  # the stem's stride 4 x the patch 2
    assert hybrid(torch.randn(1, 3, 128, 64))[0].shape == (1, 192, 16, 8)


def test_features_only_refusals():
    with pytest.raises(VitkitError, match="need features_only=True"):
        vitkit.create_model("Ti/16", **TINY, out_indices=2)
    with pytest.raises(VitkitError, match="Vision Transformer"):
        vitkit.create_model("bit_r50x1", layers=(1, 1, 1), features_only=True)
    with pytest.raises(VitkitError, match="last 5 blocks of 3"):
        vitkit.create_model("Ti/16", **TINY, features_only=True, out_indices=5)


def test_naflex_batch_gives_timms_tokens(timm, tmp_path):
    """A packed NaFlex batch (three aspect ratios, padding): NLC intermediates equal timm's,
    padding tokens included; NCHW is refused (no single grid)."""
    from timm.models._hub import save_for_hf

    torch.manual_seed(0)  # (test_naflex.py's copy: at these weights the logits agree to 1e-12)
    ref = timm.create_model("naflexvit_base_patch16_gap", embed_dim=32, depth=2, num_heads=2,
                            num_classes=5, pos_embed_grid_size=(3, 4)).double().eval()  # fmt: skip
    g = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for p in ref.parameters():
            p.add_(torch.randn(p.shape, generator=g, dtype=p.dtype) * 0.05)
    save_for_hf(ref, str(tmp_path / "m"), safe_serialization=True)
    ckpt = read_checkpoint(tmp_path / "m")
    ours = build_model(ckpt.model_config).double().eval()
    ours.load_state_dict(ckpt.state_dict, strict=True)
    g = torch.Generator().manual_seed(2)
    images = [torch.randn(3, h, w, generator=g, dtype=torch.float64) for h, w in SIZES]
    batch = pack(images, (16, 16), max_seq_len=12)
    with torch.no_grad():
        want = ref.forward_intermediates(batch, [0, 1], output_fmt="NLC", norm=True)
        got = ours.forward_intermediates(batch, [0, 1], output_fmt="NLC", norm=True)
    assert torch.allclose(got[0], want[0], rtol=0, atol=1e-12 * want[0].abs().max().item())
    for a, b in zip(got[1], want[1]):
        assert a.shape == b.shape and (a - b).abs().max() <= 1e-12 * b.abs().max()
    with pytest.raises(VitkitError, match="NLC"):
        ours.forward_intermediates(batch)


SIZES = [(32, 64), (48, 48), (80, 16)]
